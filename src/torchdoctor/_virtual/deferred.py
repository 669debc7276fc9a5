"""Libraries that probe the hardware when first imported are imported, if the program imports them, as the real
machine would have them: with the runtime's answers switched off for that import.

bitsandbytes binds its CUDA stream functions at import time once ``torch.cuda.is_available()`` says True; imported
while a virtual run answers "yes", its CPU kernels are never chosen. Importing it up front at every session start
cost seconds and printed its warnings into programs that never use it. Instead, while a run is active, a finder at
the front of ``sys.meta_path`` wraps the loader of these packages (and their submodules): the module executes with
this thread's run set aside and torch's function modes off, exactly as an import before the run would. A program
that never imports them never gets them.

Libraries imported before the run may have cached their answer to "is there an XPU / a CUDA GPU?"
(accelerate's and transformers' ``is_*_available`` are ``functools.lru_cache``d): those caches are cleared as a run
starts and again as it ends, so the program asks the run, and after it the real machine, as on a machine that has
(or lacks) the device from the start.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import torch

from torchdoctor._virtual import tensor as V

# the top-level names whose import looks at the hardware
PROBE_AT_IMPORT = ("bitsandbytes",)

_LOCK = threading.Lock()
_ACTIVE = [0]


@contextlib.contextmanager
def real_machine() -> Iterator[None]:
    """This thread sees the machine as it is: no run's answers, no torch function mode."""
    prev = V.swap_space(None)
    try:
        with torch._C.DisableTorchFunction():
            yield
    finally:
        V.swap_space(prev)


class _AsOnTheMachine(importlib.abc.Loader):
    """The package's own loader, executing the module on the real machine."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        with real_machine():
            self.loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # resource readers, get_data, is_package ... as the real loader
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name.partition(".")[0] not in PROBE_AT_IMPORT or V.current_space() is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _AsOnTheMachine(spec.loader)
                return spec
        return None


_FINDER = _Finder()

# modules whose availability checks are cached per process, asked again at the start and end of a run
_CACHED_CHECKS = ("accelerate.utils.imports", "transformers.utils.import_utils", "diffusers.utils.import_utils")


# id(module) -> (how many names it had, its cached checks (name, function, cache_clear)): listed once per module,
# again when it grows or a check is replaced
_CLEARS: dict[int, tuple[int, list[tuple[str, Any, Any]]]] = {}


def forget_availability() -> None:
    """Clear the cached ``is_*_available`` answers of the libraries already imported (never imports one). The
    checks are listed once per module (a ``dir()`` and a lookup per name were ~0.6 ms a call, twice a run)."""
    for name in _CACHED_CHECKS:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        d = mod.__dict__
        hit = _CLEARS.get(id(mod))
        if hit is None or hit[0] != len(d) or any(d.get(a) is not f for a, f, _ in hit[1]):  # grown or replaced
            checks = [(a, f, c) for a in list(d) if a.startswith("is_") and a.endswith("_available")
                      for f in (d[a],) for c in (getattr(f, "cache_clear", None),) if c is not None]
            hit = _CLEARS[id(mod)] = (len(d), checks)
        for _, _, clear in hit[1]:
            with contextlib.suppress(Exception):
                clear()


# per-process tensor caches of libraries, filled on first use on the device the caller's tensor is on: one filled in a
# run holds a virtual tensor that outlives it (bitsandbytes' quantization map, made on the run's cuda, then met by a
# cpu quantization after the run as "Torch not compiled with CUDA enabled")
_TENSOR_CACHES = (("bitsandbytes.functional", "name2qmap"),)


def forget_virtual_cached() -> None:
    """Drop the entries of those caches that hold a virtual tensor (never imports a library): the library makes them
    again on the device of its next caller, as a fresh process would."""
    for name, attr in _TENSOR_CACHES:
        cache = getattr(sys.modules.get(name), attr, None)
        if isinstance(cache, dict):
            for key in [k for k, v in cache.items() if isinstance(v, V.VirtualTensor)]:
                cache.pop(key, None)


@contextlib.contextmanager
def deferred_imports() -> Iterator[None]:
    """The finder at the front of ``sys.meta_path`` while any run is active (it asks the importing thread's run)."""
    with _LOCK:
        if _ACTIVE[0] == 0 and _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
        _ACTIVE[0] += 1
    forget_availability()
    try:
        yield
    finally:
        forget_availability()
        forget_virtual_cached()
        with _LOCK:
            _ACTIVE[0] -= 1
            if _ACTIVE[0] == 0:
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(_FINDER)

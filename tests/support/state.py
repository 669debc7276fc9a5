"""Process-wide state a test must leave as it found it, read before and after each test (``tests/conftest.py``).

A test that changes one of these without restoring it makes a later test pass or fail by the order the suite runs
in: the submission of stop 47 failed in CI only, because a test's ``logging.config.dictConfig`` (which disables
every logger that exists) muted diffusers' logger for a later test. ``snapshot()`` reads what is shared;
``leaks(before, after)`` names what differs and ``restore(before)`` puts it back, so one leaking test fails alone
and the tests after it run on clean state.

What is read: the ``disabled`` flag, level, ``propagate`` and handlers of every logger that exists (and the
process-wide ``logging.disable`` level); torch's default dtype and device, grad and inference mode, thread count,
deterministic and anomaly modes, float32 matmul precision, reduced-precision and TF32 flags, CPU autocast, the
stacks of dispatch and function modes, global module hooks; environment variables; the public attributes of
torch's namespaces that tests patch (``torch``, ``torch.cuda``, ``torch.Tensor``, ``torch.nn.Module``,
``torch.nn.functional``); library modules in ``sys.modules``; zero-argument ``is_*`` answers the Hugging Face
libraries cache (a test that made CUDA look available while one was first asked leaves it cached for every later
test).

>>> s = snapshot()
>>> leaks(s, snapshot())
[]
>>> import torch
>>> torch.set_default_dtype(torch.float64)
>>> leaks(s, snapshot())[0]
'torch default dtype: torch.float32 -> torch.float64'
>>> restore(s)
>>> torch.get_default_dtype(), leaks(s, snapshot())
(torch.float32, [])
"""

from __future__ import annotations

import logging
import os
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

# Modules whose attributes a test may monkeypatch: each must be the same object after the test.
_PATCHED = {"torch": lambda: torch, "torch.cuda": lambda: torch.cuda, "torch.Tensor": lambda: torch.Tensor,
            "torch.nn.Module": lambda: torch.nn.Module, "torch.nn.functional": lambda: torch.nn.functional}
# Library modules a test may replace in sys.modules (``sys.modules["torch"] = None`` belongs in a child process).
_LIBRARIES = ("torch", "transformers", "diffusers", "peft", "accelerate", "bitsandbytes", "safetensors", "numpy",
              "huggingface_hub", "torchdoctor", "logging", "warnings")
# Where the libraries keep cached availability answers (read only when already imported).
_CACHES = ("transformers.utils.import_utils", "diffusers.utils.import_utils", "accelerate.utils.imports",
           "peft.import_utils")
# Set by torch itself the first time inductor is imported or compiles (its cache directory, a pointer of its own),
# not by a test: never reported, never taken back.
_IMPORT_ENV = ("TORCHINDUCTOR_", "_TORCHINDUCTOR_")
_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
          "_global_backward_pre_hooks", "_global_module_registration_hooks",
          "_global_parameter_registration_hooks", "_global_buffer_registration_hooks")


def _torch_flags() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
    """Each torch setting: how to read it and how to put it back."""
    b = torch.backends
    return {
        "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "default device": (torch.get_default_device,
                           lambda d: torch.set_default_device(None if d == torch.device("cpu") else d)),
        "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
        "inference mode": (torch.is_inference_mode_enabled, lambda on: None),  # thread-local RAII: only read
        "threads": (torch.get_num_threads, torch.set_num_threads),
        "deterministic algorithms": (torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
        "anomaly detection": (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        "float32 matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        "cuda.matmul.allow_tf32": (lambda: b.cuda.matmul.allow_tf32, lambda v: setattr(b.cuda.matmul, "allow_tf32", v)),
        "cuda.matmul.allow_bf16_reduced_precision_reduction": (
            lambda: b.cuda.matmul.allow_bf16_reduced_precision_reduction,
            lambda v: setattr(b.cuda.matmul, "allow_bf16_reduced_precision_reduction", v)),
        "cuda.matmul.allow_fp16_reduced_precision_reduction": (
            lambda: b.cuda.matmul.allow_fp16_reduced_precision_reduction,
            lambda v: setattr(b.cuda.matmul, "allow_fp16_reduced_precision_reduction", v)),
        "cudnn.enabled": (lambda: b.cudnn.enabled, lambda v: setattr(b.cudnn, "enabled", v)),
        "cudnn.allow_tf32": (lambda: b.cudnn.allow_tf32, lambda v: setattr(b.cudnn, "allow_tf32", v)),
        "cudnn.benchmark": (lambda: b.cudnn.benchmark, lambda v: setattr(b.cudnn, "benchmark", v)),
        "cudnn.deterministic": (lambda: b.cudnn.deterministic, lambda v: setattr(b.cudnn, "deterministic", v)),
        "mkldnn.enabled": (lambda: b.mkldnn.enabled, lambda v: setattr(b.mkldnn, "enabled", v)),
        "cpu autocast": (lambda: torch.is_autocast_enabled("cpu"), lambda v: torch.set_autocast_enabled("cpu", v)),
        "cpu autocast dtype": (lambda: torch.get_autocast_dtype("cpu"), lambda v: torch.set_autocast_dtype("cpu", v)),
    }


_FLAGS = _torch_flags()


@dataclass
class Snapshot:
    loggers: dict[str, tuple[logging.Logger, int, bool, bool, tuple[logging.Handler, ...]]]
    logging_disable: int
    flags: dict[str, Any]
    stacks: dict[str, int]
    hooks: dict[str, int]
    env: dict[str, str]
    attrs: dict[str, dict[str, Any]]
    modules: dict[str, Any]
    module_names: dict[str, None] | None  # None: not read (``snapshot(full=False)``)
    caches: dict[str, Any] | None


def _torchs(obj: Any) -> bool:
    """Defined by torch itself (not ``torchdoctor``, not a test)."""
    module = str(getattr(obj, "__module__", ""))
    return module == "torch" or module.startswith("torch.")


def _own(handler: logging.Handler) -> bool:
    """pytest's capture handlers, which it swaps on the root logger between the phases of a test, and torch's own,
    which it manages itself (the first ``torch.compile`` takes ``LazyTraceHandler`` off ``torch.__trace``)."""
    return type(handler).__module__.startswith("_pytest") or _torchs(type(handler))


def _logger_state(logger: logging.Logger) -> tuple[logging.Logger, int, bool, bool, tuple[logging.Handler, ...]]:
    handlers = logger.handlers
    return (logger, logger.level, logger.disabled, logger.propagate,
            tuple(h for h in handlers if not _own(h)) if handlers else ())


_FOUND: dict[int, dict[str, Any]] = {}  # id(module) -> its cached zero-argument functions (read once per module)


def _cached_answers() -> dict[str, Any]:
    """The zero-argument cached functions of the libraries' availability modules, by qualified name."""
    found = {}
    for name in _CACHES:
        module = sys.modules.get(name)
        if module is None:
            continue
        if id(module) not in _FOUND:
            _FOUND[id(module)] = {
                f"{name}.{attr}": value for attr, value in vars(module).items()
                if hasattr(value, "cache_info") and getattr(getattr(value, "__wrapped__", None), "__code__", None)
                is not None and not value.__wrapped__.__code__.co_argcount}
        found.update(_FOUND[id(module)])
    return found


def snapshot(full: bool = True) -> Snapshot:
    """The shared state now; ``full=False`` leaves out the slower reads (the libraries' cached answers and the
    names in sys.modules), which the suite reads per module rather than per test."""
    manager = logging.Logger.manager
    loggers = {"<root>": _logger_state(logging.getLogger())}
    for name, logger in list(manager.loggerDict.items()):
        if isinstance(logger, logging.Logger):
            loggers[name] = _logger_state(logger)
    caches = {name: (f, f.cache_info().currsize) for name, f in _cached_answers().items()} if full else None
    return Snapshot(
        loggers=loggers, logging_disable=manager.disable,
        flags={name: read() for name, (read, _) in _FLAGS.items()},
        stacks={"dispatch modes": torch._C._len_torch_dispatch_stack(),
                "function modes": torch._C._len_torch_function_stack()},
        hooks={name: len(getattr(torch.nn.modules.module, name)) for name in _HOOKS},
        env={k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},  # pytest's, set per phase
        attrs={name: dict(vars(get())) for name, get in _PATCHED.items()},
        modules={name: sys.modules.get(name) for name in _LIBRARIES}, module_names=dict.fromkeys(sys.modules) if full else None,
        caches=caches,
    )


def _cache_leaks(before: Snapshot) -> list[tuple[str, Any]]:
    """Cached answers first asked during the test that differ from what the function answers now."""
    wrong: list[tuple[str, Any]] = []
    if before.caches is None:
        return wrong
    for name, f in _cached_answers().items():
        if name in before.caches and before.caches[name][1] > 0:
            continue  # asked before the test: the answer it kept is the one every test saw
        if f.cache_info().currsize != 1:
            continue
        try:
            kept, fresh = f(), f.__wrapped__()
        except Exception:  # noqa: BLE001 - a probe that raises now cannot be compared; not this guard's concern
            continue
        if kept != fresh:
            wrong.append((f"{name}() cached {kept!r} (the process answers {fresh!r})", f))
    return wrong


def _library_wrap(old: Any, new: Any) -> bool:
    """torch replacing its own function, once per process, as one of its modules is first used: torch._dynamo
    wraps ``torch.manual_seed`` at import and patches ``nn.Module.__init__``/``__setstate__`` at the first
    ``torch.compile``. The new function is torch's own; a test's or torchdoctor's patch is not."""
    return _torchs(new)


def leaks(before: Snapshot, after: Snapshot) -> list[str]:
    """What differs between two snapshots, one line each ("what: before -> after")."""
    found = []
    if before.logging_disable != after.logging_disable:
        found.append(f"logging.disable: {before.logging_disable} -> {after.logging_disable}")
    for name, (logger, level, disabled, propagate, handlers) in before.loggers.items():
        now = after.loggers.get(name)
        if now is None or now[0] is not logger:
            found.append(f"logger {name!r}: replaced")
            continue
        for what, was, is_ in (("level", level, now[1]), ("disabled", disabled, now[2]),
                               ("propagate", propagate, now[3])):
            if was != is_:
                found.append(f"logger {name!r} {what}: {was!r} -> {is_!r}")
        if handlers != now[4]:
            found.append(f"logger {name!r} handlers: {list(handlers)} -> {list(now[4])}")
    for name, now in after.loggers.items():  # made during the test: a library's import may set its level and
        if name not in before.loggers and now[2]:  # handlers, but a logger is born enabled
            found.append(f"logger {name!r} disabled: False -> True")
    for name, was in before.flags.items():
        if was != after.flags[name]:
            found.append(f"torch {name}: {was} -> {after.flags[name]}")
    for group in ("stacks", "hooks"):
        for name, was in getattr(before, group).items():
            if was != getattr(after, group)[name]:
                found.append(f"torch {name}: {was} -> {getattr(after, group)[name]} left installed")
    for key in sorted(before.env.keys() | after.env.keys()):
        if key.startswith(_IMPORT_ENV) and key not in before.env:
            continue
        if before.env.get(key) != after.env.get(key):
            found.append(f"environment {key}: {before.env.get(key)!r} -> {after.env.get(key)!r}")
    for owner, was in before.attrs.items():
        now = after.attrs[owner]
        if len(now) == len(was) and now == was:  # the usual case, compared in C (identity first)
            continue
        for attr, value in was.items():  # new attributes are lazily loaded submodules, not patches
            if attr not in now or (now[attr] is not value and not _library_wrap(value, now[attr])):
                found.append(f"{owner}.{attr}: {value!r} -> {now.get(attr, '<deleted>')!r}")
    for name, module in before.modules.items():
        if module is not None and after.modules[name] is not module and not _reloaded(module, after.modules[name]):
            found.append(f"sys.modules[{name!r}]: {module!r} -> {after.modules[name]!r}")
    found += [f"sys.modules[{name!r}] = {sys.modules.get(name)!r}: no module left behind"
              for name in _stray(before)]
    found += [line for line, _ in _cache_leaks(before)]
    return found


def _reloaded(was: Any, now: Any) -> bool:
    """The library put a new module object of itself there (transformers' lazy module is replaced by another one
    from the same file the first time a model class is built in the process): the library's own doing, not a
    test's fake."""
    return now is not None and type(now) is type(was) and getattr(now, "__name__", None) == was.__name__ \
        and getattr(now, "__file__", None) is not None and getattr(now, "__file__", None) == getattr(was, "__file__", None)


def restore(before: Snapshot) -> None:
    """Put back what ``leaks`` can name (module stacks and hooks stay: only their owner can remove them)."""
    for name, (logger, level, disabled, propagate, handlers) in before.loggers.items():
        logger.level, logger.disabled, logger.propagate = level, disabled, propagate
        ours = [h for h in logger.handlers if _own(h)]
        logger.handlers = list(handlers) + ours
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name not in before.loggers and isinstance(logger, logging.Logger):
            logger.disabled = False
    logging.disable(before.logging_disable)
    logging.Logger.manager._clear_cache()  # type: ignore[attr-defined]
    for name, (read, write) in _FLAGS.items():
        if read() != before.flags[name]:
            write(before.flags[name])
    for key in list(os.environ):
        if key not in before.env and key != "PYTEST_CURRENT_TEST" and not key.startswith(_IMPORT_ENV):
            del os.environ[key]
    os.environ.update(before.env)
    for owner, was in before.attrs.items():
        target = _PATCHED[owner]()
        for attr, value in was.items():
            now = vars(target).get(attr, None)
            if now is not value and not _library_wrap(value, now):
                setattr(target, attr, value)
    for name, module in before.modules.items():
        if module is not None and not _reloaded(module, sys.modules.get(name)):
            sys.modules[name] = module
    for name in _stray(before):
        del sys.modules[name]
    for _, f in _cache_leaks(before):
        f.cache_clear()


def _stray(before: Snapshot) -> list[str]:
    """Entries a test put in sys.modules that are no modules (a fake left behind answers every later import)."""
    if before.module_names is None or len(sys.modules) == len(before.module_names):
        return []
    return sorted(name for name in sys.modules.keys() - before.module_names.keys()
                  if not isinstance(sys.modules.get(name), types.ModuleType))


def guard(what: str, full: bool = True) -> Iterator[None]:
    """Body of the suite's autouse fixtures (``tests/conftest.py``): a test (or module) that leaves state changed
    fails, and the state is put back for the tests after it."""
    import pytest

    before = snapshot(full)
    limit = sys.getrecursionlimit()
    yield
    # put back without a verdict: torch's inductor raises it to 2,000 on its first compile, by design; a limit left
    # high lets a runaway recursion of a later test in this worker overflow the C stack (a segfault, the worker lost)
    # instead of raising RecursionError
    sys.setrecursionlimit(limit)
    changed = leaks(before, snapshot(full))
    if changed:
        restore(before)
        pytest.fail(f"{what} left process-wide state changed (restore it in `finally`, or use monkeypatch): "
                    + "; ".join(changed), pytrace=False)

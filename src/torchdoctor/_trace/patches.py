"""The choke points a trace patches while (and only while) one is active, and the wrapper they share.

Installed when the first trace starts and removed when the last one ends (also after an exception): with no
trace active every patched function is the original object again. Library entry points are patched by name in
the classes that define them; a watched library imported while a trace runs is patched when its import ends.
"""

from __future__ import annotations

import functools
import gc
import importlib.abc
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from torchdoctor._trace.record import remember_birth
from torchdoctor._trace.session import Call, Session

log = logging.getLogger("torchdoctor.trace")

MOVE, ASSIGN, LIBRARY = "move", "assign", "library"

_LORA_NAMES = (
    "load_lora_weights", "load_lora_into_unet", "load_lora_into_text_encoder", "load_lora_into_transformer",
    "unload_lora_weights", "fuse_lora", "unfuse_lora", "set_adapters", "set_adapter", "delete_adapters",
    "delete_adapter", "add_adapter", "load_adapter", "load_lora_adapter", "unload_lora", "enable_lora",
    "disable_lora", "enable_adapters", "disable_adapters", "set_lora_device", "inject_adapter", "merge_adapter",
    "unmerge_adapter", "merge_and_unload", "unload", "add_weighted_adapter", "enable_adapter_layers",
    "disable_adapter_layers",
)
_MODULE_MOVES = ("to", "cuda", "cpu", "xpu", "half", "bfloat16", "float", "double", "type", "to_empty", "_apply",
                 "load_state_dict")
_MODULE_ASSIGNS = ("__setattr__", "__delattr__", "register_parameter", "register_buffer", "add_module",
                   "register_module")

# (module, class name or None for every class the module defines, method names, kind)
SPECS: tuple[tuple[str, str | None, tuple[str, ...], str], ...] = (
    ("torch.nn.modules.module", "Module", _MODULE_MOVES, MOVE),
    ("torch.nn.modules.module", "Module", _MODULE_ASSIGNS, ASSIGN),
    ("transformers.modeling_utils", "PreTrainedModel", ("to", "cuda", "half", "float"), MOVE),
    ("transformers.integrations.peft", None, _LORA_NAMES, LIBRARY),
    ("diffusers.models.modeling_utils", "ModelMixin", ("to", "cuda", "half", "float"), MOVE),
    ("diffusers.pipelines.pipeline_utils", "DiffusionPipeline",
     ("to", "enable_model_cpu_offload", "enable_sequential_cpu_offload", "remove_all_hooks",
      "maybe_free_model_hooks", "reset_device_map"), LIBRARY),
    ("diffusers.loaders.lora_base", None, _LORA_NAMES, LIBRARY),
    ("diffusers.loaders.lora_pipeline", None, _LORA_NAMES, LIBRARY),
    ("diffusers.loaders.peft", None, _LORA_NAMES, LIBRARY),
    ("peft.tuners.tuners_utils", None, _LORA_NAMES + ("merge", "unmerge"), LIBRARY),
    ("peft.tuners.lora.model", None, _LORA_NAMES, LIBRARY),
    ("peft.tuners.lora.layer", None, ("merge", "unmerge", "update_layer", "set_adapter", "delete_adapter"), LIBRARY),
    ("peft.peft_model", None, _LORA_NAMES, LIBRARY),
    ("accelerate.hooks", None, ("init_hook", "pre_forward", "post_forward", "detach_hook"), LIBRARY),
    ("bitsandbytes.nn.modules", None, ("to", "cuda", "cpu", "xpu"), MOVE),
    ("bitsandbytes.functional", "QuantState", ("to",), MOVE),
)
_WATCHED = frozenset(s[0] for s in SPECS)
_MAX_CANDIDATES = 4  # a hook's pre_forward(module, *inputs): the subject is among the first arguments


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.call: Call | None = None
        self.busy = False
        self.finding = False


STATE = _ThreadState()
SESSIONS: tuple[Session, ...] = ()  # replaced as a whole under _LOCK: readers need no lock
_LOCK = threading.RLock()
_MISSING = object()
_patched: list[tuple[type, str, Any]] = []  # (class, name, previous value of cls.__dict__[name] or _MISSING)
_done_modules: set[str] = set()
_finder: _PostImportFinder | None = None


# -- the wrapper ----------------------------------------------------------------------------------------------

def _run(via: str, name: str, adopt: bool, args: Sequence[Any], orig: Callable[..., Any], call_args: tuple[Any, ...],
         kwargs: dict[str, Any]) -> Any:
    """Call ``orig``; ``args`` are the candidates for the object it acts on (checked against the traces)."""
    st = STATE
    call = st.call
    if call is not None:
        _touch(st, call, args, False)
        return orig(*call_args, **kwargs)
    call = st.call = Call(via, name, args[0] if args else None, sys._getframe(2))
    try:
        _touch(st, call, args, adopt)
        return orig(*call_args, **kwargs)
    finally:
        st.call = None
        if call.scopes:
            st.busy = True
            paused = _pause_gc()
            try:
                site: list[Any] = []
                for s in SESSIONS:
                    s.finish(call, site)
            except Exception:  # a diagnostic never breaks the program it watches
                log.warning("torchdoctor.trace: could not record the changes of %s", via, exc_info=True)
            finally:
                if paused:
                    gc.enable()
                st.busy = False
                call.frame = None


def _pause_gc() -> bool:
    """Pause the cyclic collector while the trace reads and compares (its tuples are freed before it
    resumes, so they trigger no collection of the user's heap); True if it was running."""
    if gc.isenabled():
        gc.disable()
        return True
    return False


def _touch(st: _ThreadState, call: Call, args: Sequence[Any], adopt: bool) -> None:
    sessions = SESSIONS
    if call.whole is sessions:
        return  # inside a whole-model .to(): every submodule's _apply and .data = lands here, nothing to add
    st.busy = True
    paused = _pause_gc()
    try:
        cands = tuple(args[:_MAX_CANDIDATES])
        for s in sessions:
            s.contact(call, cands, adopt)
        covered = call.covered
        if covered and all(id(s) in covered for s in sessions):
            call.whole = sessions
    except Exception:
        log.warning("torchdoctor.trace: could not look at the state before %s", call.via, exc_info=True)
    finally:
        if paused:
            gc.enable()
        st.busy = False


def _wrap(orig: Callable[..., Any], via: str, name: str, kind: str) -> Callable[..., Any]:
    adopt = kind != ASSIGN

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        st = STATE
        if st.busy or not SESSIONS:
            return orig(*args, **kwargs)
        call = st.call
        if call is not None and call.whole is SESSIONS:
            return orig(*args, **kwargs)  # inside a whole-model call that every trace watches whole
        if kind == ASSIGN and not _relevant_assign(args):
            return orig(*args, **kwargs)
        if kind == ASSIGN:
            if len(args) > 2 and type(args[2]) is torch.Tensor and call is None and type(args[1]) is str:
                remember_birth(args[0], args[1], args[2], sys._getframe(1))  # told if the module is adopted later
            # the module assigned into is the subject; a traced module stored into a new container (a
            # ModuleList sliced in forward) changes nothing of the traced object
            label = f".{args[1]} =" if len(args) > 1 and isinstance(args[1], str) else name
            return _run(via, label, adopt, args[:1], orig, args, kwargs)
        return _run(via, name, adopt, args, orig, args, kwargs)

    wrapper.__torchdoctor_original__ = orig  # type: ignore[attr-defined]
    return wrapper


_TENSOR_OR_MODULE = (torch.Tensor, nn.Module)


def _relevant_assign(args: Sequence[Any]) -> bool:
    """Only assignments that can change a tensor slot are worth a look (a flag set in forward is not)."""
    if len(args) >= 3 and isinstance(args[2], _TENSOR_OR_MODULE):
        return True
    if len(args) < 2 or not isinstance(args[0], nn.Module):
        return len(args) >= 2
    d = args[0].__dict__
    name = args[1]
    for store in ("_parameters", "_buffers", "_modules"):
        sub = d.get(store)
        if sub is not None and name in sub:
            return True
    return isinstance(d.get(name), _TENSOR_OR_MODULE)


# ``Tensor.data = x`` is a C-level setter: a property on torch.Tensor shadows torch._C.TensorBase.data meanwhile.
_TB_DATA: Any = torch._C.TensorBase.__dict__["data"]


def _data_get(self: torch.Tensor) -> torch.Tensor:
    return _TB_DATA.__get__(self, type(self))  # type: ignore[no-any-return]


def _data_set_orig(self: torch.Tensor, value: torch.Tensor) -> None:
    _TB_DATA.__set__(self, value)


def _data_set(self: torch.Tensor, value: torch.Tensor) -> None:
    st = STATE
    call = st.call
    if st.busy or not SESSIONS or (call is not None and call.whole is SESSIONS):
        _TB_DATA.__set__(self, value)
        return
    _run("Tensor.data", "data", False, (self,), _data_set_orig, (self, value), {})


_DATA_PROPERTY = property(_data_get, _data_set, doc=_TB_DATA.__doc__)


# -- installing ---------------------------------------------------------------------------------------------

def _set(cls: type, name: str, value: Any) -> None:
    _patched.append((cls, name, cls.__dict__.get(name, _MISSING)))
    setattr(cls, name, value)


def _patch_module(modname: str) -> None:
    module = sys.modules.get(modname)
    if module is None or modname in _done_modules:
        return
    _done_modules.add(modname)
    for mod, clsname, names, kind in SPECS:
        if mod != modname:
            continue
        if clsname is not None:
            classes = [getattr(module, clsname, None)]
        else:
            classes = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == modname]
        for cls in classes:
            if not isinstance(cls, type):
                continue
            for name in names:
                fn = cls.__dict__.get(name)
                if callable(fn) and not isinstance(fn, (staticmethod, classmethod, type)) and \
                        not hasattr(fn, "__torchdoctor_original__"):
                    _set(cls, name, _wrap(fn, f"{cls.__name__}.{name}", name, kind))


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Patches a watched library module right after it is imported during a trace."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _WATCHED or STATE.finding:
            return None
        STATE.finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        except Exception:
            return None
        finally:
            STATE.finding = False
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return None
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            try:
                original(module)
            finally:
                try:
                    del loader.exec_module  # type: ignore[union-attr]
                except AttributeError:
                    pass
            with _LOCK:
                if SESSIONS:
                    _patch_module(fullname)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install() -> None:
    global _finder
    _set(torch.Tensor, "data", _DATA_PROPERTY)
    for modname in sorted(_WATCHED):
        _patch_module(modname)
    _finder = _PostImportFinder()
    sys.meta_path.insert(0, _finder)


def _uninstall() -> None:
    global _finder
    if _finder is not None:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass
        _finder = None
    while _patched:
        cls, name, old = _patched.pop()
        if old is _MISSING:
            try:
                delattr(cls, name)
            except AttributeError:
                pass
        else:
            setattr(cls, name, old)
    _done_modules.clear()


def start(session: Session) -> None:
    global SESSIONS
    with _LOCK:
        if not SESSIONS:
            _install()
        SESSIONS = (*SESSIONS, session)


def stop(session: Session) -> None:
    global SESSIONS
    with _LOCK:
        SESSIONS = tuple(s for s in SESSIONS if s is not session)
        if not SESSIONS:
            _uninstall()


def patched() -> list[tuple[type, str]]:
    """What is patched right now (empty when no trace is active)."""
    return [(cls, name) for cls, name, _ in _patched]

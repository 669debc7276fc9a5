"""One trace record, its text and JSON forms, and where in the user's code a call came from.

Torch-free: devices and dtypes arrive here as the strings every report uses (``cuda:0``, ``bfloat16``).
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from typing import Any

from torchdoctor._report.records import FrozenRecord
from torchdoctor._report.text import schema
from torchdoctor._report.text import public_types

# Frames of these packages are "the libraries": the user's line is the first frame outside them.
LIBRARY_PACKAGES = frozenset({
    "torch", "torchdoctor", "transformers", "diffusers", "peft", "accelerate", "bitsandbytes", "safetensors",
    "huggingface_hub", "torchao", "optimum", "compressed_tensors", "functorch", "torchvision", "timm",
    "runpy", "contextlib", "functools", "importlib", "threading", "concurrent", "abc", "typing",
    "typing_extensions", "unittest", "_pytest", "pytest", "pluggy",
})
# The apps' own helper packages (ComfyUI, SD.Next/A1111/Forge, sd-scripts, InvokeAI): a move their helper makes for a
# custom node or an extension is credited to the plugin's line that called it, when there is one.
APP_HELPERS = frozenset({"comfy", "comfy_extras", "comfy_execution", "modules", "ldm", "sgm", "repositories",
                         "library", "invokeai", "backend", "k_diffusion"})
_CALL_FRAMES = ("_wrapped_call_impl", "_call_impl", "__call__")  # a module called: name it by its forward


# a frozen record written once, not compiled per class by the decorator: `run` imports this module before the
# program's first line (issue 43 point 4); tests/trace compare it with a twin the decorator makes
@dataclass(init=False, repr=False, eq=False)
class TraceRecord(FrozenRecord):
    """One change of the tensor at ``path`` (relative to the traced object ``root``).

    ``kind`` is ``move`` (device and/or dtype changed), ``add`` (a tensor appeared at ``path``) or ``remove``.
    ``call`` is the library call the user's code made (``unload_lora_weights()``), ``qualname`` the same with
    its receiver (``StableDiffusionPipeline.unload_lora_weights``), ``via`` the choke point that saw the change
    (``Module._apply``, ``Tensor.data``), ``file``/``line`` the user's source line, ``time`` seconds since the epoch.
    """

    path: str
    kind: str
    from_device: str | None
    from_dtype: str | None
    to_device: str | None
    to_dtype: str | None
    call: str
    qualname: str
    via: str
    file: str | None
    line: int | None
    time: float
    root: str = ""
    shape: tuple[int, ...] | None = None
    lora: bool = False
    thread: str = ""
    _fields = ("path", "kind", "from_device", "from_dtype", "to_device", "to_dtype", "call", "qualname", "via", "file",
               "line", "time", "root", "shape", "lora", "thread")

    def __init__(self, path: str, kind: str, from_device: str | None, from_dtype: str | None, to_device: str | None,
                 to_dtype: str | None, call: str, qualname: str, via: str, file: str | None, line: int | None,
                 time: float, root: str = "", shape: tuple[int, ...] | None = None, lora: bool = False,
                 thread: str = "") -> None:
        d = self.__dict__
        d["path"] = path
        d["kind"] = kind
        d["from_device"] = from_device
        d["from_dtype"] = from_dtype
        d["to_device"] = to_device
        d["to_dtype"] = to_dtype
        d["call"] = call
        d["qualname"] = qualname
        d["via"] = via
        d["file"] = file
        d["line"] = line
        d["time"] = time
        d["root"] = root
        d["shape"] = shape
        d["lora"] = lora
        d["thread"] = thread

    @property
    def where(self) -> str:
        """``app.py:42`` (relative to the working directory when below it), or ``an unknown line``."""
        if self.file is None:
            return "an unknown line"
        return f"{short_file(self.file)}:{self.line}"

    @property
    def placement(self) -> str:
        """What the change left: ``on cpu``, ``float32``, ``float32 on cpu`` (only the parts that changed)."""
        if self.kind == "remove":
            return "removed"
        if self.kind == "add":
            return f"{self.to_dtype} on {self.to_device}"
        parts = []
        if self.to_dtype != self.from_dtype:
            parts.append(str(self.to_dtype))
        if self.to_device != self.from_device:
            parts.append(f"on {self.to_device}")
        return " ".join(parts) or f"{self.to_dtype} on {self.to_device}"

    def note(self) -> str:
        """The sentence guard and scan append: ``on cpu since `unfuse_lora()` at app.py:42``."""
        verb = "created by" if self.kind == "add" else "since"
        if self.file is None and self.via == "snapshot":
            return f"{self.placement}, changed by code the trace did not see (no call or line known)"
        if self.kind == "remove":
            return f"removed by `{self.call}` at {self.where}"
        return f"{self.placement} {verb} `{self.call}` at {self.where}"

    def line_text(self) -> str:
        """One readable log line."""
        frm = _side(self.from_dtype, self.from_device)
        to = _side(self.to_dtype, self.to_device)
        change = {"add": f"added {to}", "remove": f"removed (was {frm})"}.get(self.kind, f"{frm} -> {to}")
        root = f"[{self.root}] " if self.root else ""
        by = f"{self.qualname}()" if self.call.endswith("()") else self.qualname
        return f"{root}{self.path}: {change} by {by} at {self.where}"

    def __str__(self) -> str:
        return self.line_text()

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": schema("trace"), "path": self.path, "kind": self.kind, "root": self.root,
            "from": {"device": self.from_device, "dtype": self.from_dtype},
            "to": {"device": self.to_device, "dtype": self.to_dtype},
            "shape": None if self.shape is None else list(self.shape), "call": self.call, "qualname": self.qualname,
            "via": self.via, "file": self.file, "line": self.line, "time": self.time, "lora": self.lora,
            "thread": self.thread,
        }


def _side(dtype: str | None, device: str | None) -> str:
    return f"{dtype}@{device}" if dtype is not None else "nothing"


def short_file(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return path if rel.startswith("..") else rel


# -- where a call came from ---------------------------------------------------------------------------------

def _library_dirs() -> tuple[str, ...]:
    import sysconfig  # read on the first frame judged, not at import: ``run``'s start pays nothing for it

    paths = sysconfig.get_paths()  # one call: each one rebuilds the scheme's paths
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = paths.get(key)
        if path:
            dirs.add(os.path.normcase(os.path.realpath(path)) + os.sep)
    return tuple(sorted(dirs, key=len, reverse=True))


_LIB_DIRS: tuple[str, ...] = ()  # filled by the first ``is_library`` that needs a file's answer
_FILE_IS_LIB: dict[str, bool] = {}


def is_library(frame: types.FrameType) -> bool:
    """True for frames of torch, torchdoctor, the model libraries, the standard library and site-packages."""
    filename = frame.f_code.co_filename
    if filename.startswith("<") and not filename.startswith("<frozen "):
        return False  # typed or exec'd code: a doctest, the REPL, ``python -c``
    name = frame.f_globals.get("__name__") or ""
    if type(name) is str and name.partition(".")[0] in LIBRARY_PACKAGES:
        return True
    hit = _FILE_IS_LIB.get(filename)
    if hit is None:
        global _LIB_DIRS
        if not _LIB_DIRS:
            _LIB_DIRS = _library_dirs()
        real = os.path.normcase(os.path.realpath(filename)) if os.path.isabs(filename) else filename
        hit = filename.startswith("<frozen ") or real.startswith(_LIB_DIRS)
        if len(_FILE_IS_LIB) < 65536:
            _FILE_IS_LIB[filename] = hit
    return hit


def _receiver(frame: types.FrameType) -> Any:
    code = frame.f_code
    if not code.co_argcount or code.co_varnames[0] not in ("self", "cls"):
        return None
    try:
        return frame.f_locals.get(code.co_varnames[0])
    except Exception:  # a diagnostic never breaks the program it watches
        return None


def describe_frame(frame: types.FrameType) -> tuple[str, str]:
    """``(call, qualname)`` of the function running in ``frame``: ``("unfuse_lora()", "Pipe.unfuse_lora")``."""
    code = frame.f_code
    name = code.co_name
    recv = _receiver(frame)
    owner = None
    if recv is not None:
        owner = recv.__name__ if isinstance(recv, type) else type(recv).__name__
    if name in _CALL_FRAMES and owner is not None:
        return f"{owner}.forward()", f"{owner}.forward"
    qual = getattr(code, "co_qualname", name)
    return f"{name}()", f"{owner}.{name}" if owner else qual


def user_site(frame: types.FrameType | None) -> tuple[types.FrameType | None, types.FrameType | None]:
    """``(user frame, the library frame it called)`` walking outwards from ``frame``.

    The library frame is the outermost library frame below the user's frame (the call the user's line made);
    it is None when the user's frame called the choke point directly.
    """
    callee = None
    helper: tuple[types.FrameType, types.FrameType | None] | None = None  # the first app-helper frame met
    f = frame
    while f is not None:
        if not is_library(f):
            name = f.f_globals.get("__name__") or ""
            if not (type(name) is str and "." in name and name.partition(".")[0] in APP_HELPERS):
                return f, callee
            helper = helper or (f, callee)  # e.g. comfy.utils.set_attr: look for the plugin that called it
        if (f.f_globals.get("__name__") or "").partition(".")[0] != "torchdoctor":
            callee = f
        f = f.f_back
    return helper if helper is not None else (None, callee)


def this_thread() -> str:
    import threading

    return threading.current_thread().name

public_types(TraceRecord)


# plain tensors assigned as attributes of a module no trace knows yet (``self.scale = torch.ones(4)`` in an
# ``__init__``): id(module) -> (weakref of the module, name -> (weakref of the tensor, file, line)), told when that
# module is adopted, so its record is this object's and not another's at the same path. Keyed by id, never by the
# object: a module or a library object met later may define ``__eq__`` without ``__hash__`` (bitsandbytes'
# QuantState, a dataclass), and hashing runs the program's code.
BIRTHS: dict[int, tuple[Any, dict[str, tuple[Any, str, int]]]] = {}


def _forget(key: int, mref: Any) -> None:
    entry = BIRTHS.get(key)
    if entry is not None and entry[0] is mref:
        del BIRTHS[key]


def remember_birth(module: Any, name: str, tensor: Any, frame: types.FrameType | None) -> None:
    import functools
    import weakref

    user, _ = user_site(frame)
    if user is None:
        return
    key = id(module)
    entry = BIRTHS.get(key)
    if entry is None or entry[0]() is not module:
        try:
            mref = weakref.ref(module, functools.partial(_forget, key))
        except TypeError:  # an object that takes no weak reference: its birth is not remembered
            return
        entry = BIRTHS[key] = (mref, {})
    entry[1][name] = (weakref.ref(tensor), user.f_code.co_filename, user.f_lineno)


def births(objects: dict[int, tuple[str, Any]]) -> list[tuple[str, str, str, int]]:
    """``(path, name, file, line)`` of the remembered assignments still in place in these ``id -> (path, ref)``
    objects of a newly traced root."""
    out: list[tuple[str, str, str, int]] = []
    if not BIRTHS:
        return out
    for scope, ref in objects.values():
        obj = ref() if ref is not None else None
        entry = BIRTHS.get(id(obj)) if obj is not None else None
        if entry is None or entry[0]() is not obj:
            continue
        for name, (tref, file, line) in entry[1].items():
            if tref() is not None and getattr(obj, "__dict__", {}).get(name) is tref():
                out.append((f"{scope}.{name}" if scope else name, name, file, line))
    return out

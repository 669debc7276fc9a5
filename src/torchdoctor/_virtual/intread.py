"""Integer or float8 storage read directly by a compute op in the program's own code (``torch.matmul(h,
lm_head.weight.t())`` with a bitsandbytes ``Int8Params``): torch refuses the pair in a check before any op, with
no tensor named. The line that raised is read, the stored tensor named as the program holds it (``lm_head.weight``),
and its fix is to dequantize it where it is used or to call its layer: never a cast of the activations to the
storage dtype, never a cast of the storage alone (it keeps the stored integers)."""

from __future__ import annotations

import contextlib
import linecache
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from torchdoctor._placement import FLOAT8_DTYPES, compact, dtype_str, parse_dtype, tensor_device
from torchdoctor._report.model import Problem

__all__ = ["NUMPY", "STORAGE", "float_read_fix", "float_reads", "storage_note", "storage_read"]

STORAGE = "storage "  # the source prefix of such a problem: "storage <name> at <file:line>"
_STORED = frozenset({torch.uint8, torch.int8, *FLOAT8_DTYPES})
_NAME = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
_C10 = {"signed char": torch.int8, "char": torch.int8, "unsigned char": torch.uint8, "byte": torch.uint8}
_C10_NAME = re.compile(r"\b(signed char|unsigned char|Char|Byte)\b")  # c10's names for int8 and uint8
_HOLDERS: dict[str, str] = {}  # "name at file:line" -> the holder's type, for the note


def storage_read(exc: BaseException, rec: Any, stop: type[BaseException]) -> bool:
    """Record ``exc`` (a dtype error torch raised before any op) as stored integers or float8 read directly at the
    program's line, when that line names such a tensor; False otherwise (the caller's other handling goes on).
    ``stop``: what the recorder raises to end a run at its first problem."""
    from torchdoctor._explain.tokens import dtypes_in
    from torchdoctor._virtual.escaped import raised_at
    from torchdoctor._virtual.origin import LINES, short_at

    first = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, TypeError) and "unsupported ScalarType" in first and exc.__traceback__ is not None:
        return _numpy_read(exc, first, rec, stop)
    if not isinstance(exc, RuntimeError) or "dtype" not in first or exc.__traceback__ is None:
        return False
    named = {_dtype(n) for n in dtypes_in(first)} | {_C10[n.lower()] for n in _C10_NAME.findall(first)}
    stored = [d for d in named if d is not None and d in _STORED]
    compute = [d for d in named if d is not None and d.is_floating_point and d not in _STORED]
    if not stored or not compute:
        return False
    frame, line = raised_at(exc)
    if frame is None:
        return False
    file = frame.f_code.co_filename
    hit = _stored_on_line(linecache.getline(file, line), frame, stored[0], rec.modules.paths)
    if hit is None:
        return False
    name, path, t, holder = hit
    at = short_at(frame).rsplit(":", 1)[0] + f":{line}"
    LINES[at] = (file, line)
    of = f" of {holder}" if holder else ""
    message = (f"{path} {compact(t.dtype, tuple(t.shape), tensor_device(t))} ({dtype_str(t.dtype)} "
               f"storage{of}) is read directly at {at} by an op that computes in {dtype_str(compute[0])}: stored "
               "weights are computed with only after their layer dequantizes them")
    problem = Problem("dtype", path, "parameter" if path != name or holder else "activation", dtype_str(t.dtype),
                      dtype_str(compute[0]), message, op="forward")
    key = f"{name} at {at}"
    _HOLDERS[key] = holder
    rec.sources.setdefault((problem.kind, problem.path, problem.op or "", problem.found), (STORAGE + key,))
    rec.stopped = f"the run ended at {at}: {type(exc).__name__}: {first}"
    with contextlib.suppress(stop):
        rec._add(problem, key=("storage", path, at))
    return True


def storage_note(source: str, found: str, target: Any) -> str:
    """The fix of stored ``found`` read directly (``source``: ``storage lm_head.weight at app.py:15``)."""
    key = source[len(STORAGE):]
    name, _, at = key.partition(" at ")
    owner = name.rsplit(".", 1)[0] if "." in name else ""
    call = f"call the layer instead ({owner}(x)), or " if owner and _HOLDERS.get(key) else ""
    to = f"torch.{dtype_str(target)}" if isinstance(target, torch.dtype) else "x.dtype"
    return (f"# {at}: {name} is {found} storage read directly: {call}dequantize it there "
            f"({name}.to({to}) * its scale, the layer's own dequantization); a bare cast keeps the stored integers, "
            f"and the other operand is never cast to {found}")


def _dtype(name: str) -> torch.dtype | None:
    try:
        return parse_dtype(name)
    except (ValueError, TypeError, RuntimeError):
        return None


def _stored_on_line(text: str, frame: Any, dtype: torch.dtype, paths: Mapping[int, str]
                    ) -> tuple[str, str, torch.Tensor, str] | None:
    """(the name at the line, the path the run knows it by, the tensor, its holder's type) for the first dotted name
    at ``text`` that resolves in ``frame`` to a tensor in ``dtype``."""
    for name in _NAME.findall(text):
        parts = name.split(".")
        if parts[0] in frame.f_locals:
            obj: Any = frame.f_locals[parts[0]]
        elif parts[0] in frame.f_globals:
            obj = frame.f_globals[parts[0]]
        else:
            continue
        owner: Any = None
        used = 1
        for attr in parts[1:]:
            if isinstance(obj, torch.Tensor):
                break  # ``.t`` of ``lm_head.weight.t()``: a method of the tensor, not part of its name
            owner, used = obj, used + 1
            try:
                obj = getattr(obj, attr)
            except Exception:  # a property that raises: not this name
                obj = None
                break
        if not isinstance(obj, torch.Tensor) or obj.dtype != dtype:
            continue
        name = ".".join(parts[:used])
        held = paths.get(id(owner)) if isinstance(owner, nn.Module) else None
        path = (f"{held}.{parts[used - 1]}" if held else parts[used - 1]) if held is not None else name
        return name, path, obj, type(owner).__name__ if isinstance(owner, nn.Module) and _library(owner) else ""
    return None


def _library(module: nn.Module) -> bool:
    """The module's class is an installed library's (a quantized layer whose forward dequantizes its storage)."""
    import inspect

    try:
        file = inspect.getfile(type(module))
    except (TypeError, OSError):
        return False
    return "site-packages" in file or "dist-packages" in file


NUMPY = "numpy at "  # the source prefix of a host read numpy refused: "numpy at <file:line>"
_READ = re.compile(r"(?<!\.float\(\))\.numpy\(\)")


def _numpy_read(exc: BaseException, first: str, rec: Any, stop: type[BaseException]) -> bool:
    """``pred["boxes"].cpu().numpy()`` of a bfloat16 tensor (numpy has no bfloat16) at a line whose tensor has no
    plain name (``escaped`` names a plain one): the line fixed, ``.float()`` before each ``.numpy()``."""
    from torchdoctor._explain.tokens import dtypes_in
    from torchdoctor._virtual.escaped import raised_at
    from torchdoctor._virtual.origin import LINES, short_at

    frame, line = raised_at(exc)
    text = linecache.getline(frame.f_code.co_filename, line) if frame is not None else ""
    if frame is None or not _READ.search(text) or re.search(r"(?<![\w.])[A-Za-z_]\w*(?:\.\w+\(\))*\.numpy\(\)", text):
        return False  # a plain name's read: ``escaped`` names it
    found = (dtypes_in(first) or ["bfloat16"])[0]
    at = short_at(frame).rsplit(":", 1)[0] + f":{line}"
    LINES[at] = (frame.f_code.co_filename, line)
    problem = Problem("dtype", "<top level>", "activation", found, "float32",
                      f"a {found} tensor read with .numpy() at {at}: numpy has no {found} ({type(exc).__name__}: "
                      f"{first}); cast it first: .float().numpy()", op="Tensor.numpy")
    rec.sources.setdefault((problem.kind, problem.path, problem.op or "", problem.found), (NUMPY + at,))
    rec.stopped = f"the run ended at .numpy() of a {found} tensor at {at}"
    with contextlib.suppress(stop):
        rec._add(problem, key=("numpy", at))
    return True


def float_read_fix(source: str) -> tuple[str, str | None, tuple[str, int]] | None:
    """(the line as it should read, its diff, (file, line)) for ``numpy at app.py:18``."""
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.origin import LINES

    file, line = LINES.get(source[len(NUMPY):], ("", 0))
    old = linecache.getline(file, line).rstrip("\r\n") if file else ""
    new = _READ.sub(".float().numpy()", old)
    if not old or new == old:
        return None
    return new.strip(), line_patch(file, line, new), (file, line)


class _FloatRead(torch.overrides.TorchFunctionMode):
    def __init__(self, lines: set[tuple[str, int]]) -> None:
        super().__init__()
        self.lines = lines

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", None) == "numpy" and args and isinstance(args[0], torch.Tensor) and \
                args[0].dtype == torch.bfloat16:
            from torchdoctor._virtual.origin import user_frame

            f = user_frame(2)
            if f is not None and (f.f_code.co_filename, f.f_lineno) in self.lines:
                args = (args[0].float(), *args[1:])
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def float_reads(fixes: Sequence[Any]) -> Iterator[None]:
    """While a re-run runs: a ``.numpy()`` at a line a fix rewrites reads its tensor as float32 first."""
    lines = {f.renumpy for f in fixes if getattr(f, "renumpy", None) is not None}
    if not lines:
        yield
        return
    with _FloatRead(lines):
        yield

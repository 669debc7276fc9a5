"""A component the program casts itself (``m.text_encoder.to(torch.float16)`` at a line of its own code) in a dtype
other than the run's: a cast of the component before that code runs is undone by it, so the fix is that line, cast
to the run's dtype (a diff), and a re-run proves it with the line changed: the program's own casts of modules at the
fixed lines cast to the fixed dtype while the re-run runs. A block records the same casts, so its fix is the same.

While a virtual run runs, ``Module.to`` / ``half`` / ``bfloat16`` / ``float`` called from the user's own files are
recorded (module, dtype, file, line); the methods are put back on exit.
"""

from __future__ import annotations

import ast
import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

_NAMED = {"half": torch.float16, "bfloat16": torch.bfloat16, "float": torch.float32, "double": torch.float64}


class Casts:
    """The program's module casts of one run: (module ref, dtype, file, line)."""

    def __init__(self, subst: dict[tuple[str, int], torch.dtype]) -> None:
        self.subst = subst  # (file, line) -> the dtype a fixed line casts to (a re-run)
        self.seen: list[tuple[Any, torch.dtype, str, int, str]] = []
        # module moves, as ``seen``, with the globals of the moving code (``globaldev``)
        self.moves: list[tuple[Any, torch.device, str, int, str, dict[str, Any]]] = []

    def record_move(self, mod: torch.nn.Module, device: torch.device | None, frame: Any) -> None:
        from torchdoctor._guard.remedy import own_file
        from torchdoctor._virtual.origin import short_at

        if device is not None and frame is not None and own_file(frame.f_code.co_filename) and len(self.moves) < 4096:
            self.moves.append((weakref.ref(mod), device, frame.f_code.co_filename, frame.f_lineno, short_at(frame),
                               frame.f_globals))

    def record(self, mod: torch.nn.Module, dtype: torch.dtype | None, frame: Any) -> torch.dtype | None:
        from torchdoctor._guard.remedy import own_file
        from torchdoctor._virtual.origin import short_at

        if dtype is None or frame is None or not own_file(frame.f_code.co_filename):
            return None
        key = (frame.f_code.co_filename, frame.f_lineno)
        if len(self.seen) < 4096:
            self.seen.append((weakref.ref(mod), dtype, *key, short_at(frame)))
        return self.subst.get(key)

    def last(self, mod: torch.nn.Module) -> tuple[torch.dtype, str, int, str] | None:
        """The last cast of ``mod`` itself by the program's code: its dtype, file, line and ``file:line``."""
        return next((x[1:] for x in reversed(self.seen) if x[0]() is mod), None)


def _dtype_of(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.dtype | None:
    if name in _NAMED:
        return _NAMED[name]
    try:
        return torch._C._nn._parse_to(*args, **kwargs)[1]
    except Exception:  # not a call Module.to takes: it raises itself
        return None


def _device_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    try:
        return torch._C._nn._parse_to(*args, **kwargs)[0]
    except Exception:  # not a call Module.to takes: it raises itself
        return None


_ACTIVE: list[Casts] = []  # the runs recording now (runs in threads may end in any order)
_SAVED: dict[str, Any] = {}  # the methods as torch has them, while patched
_LOCK = threading.Lock()


def _wrap(name: str, orig: Any) -> Any:
    from torchdoctor._virtual.origin import user_frame

    def cast(self: Any, *args: Any, **kwargs: Any) -> Any:
        want = None
        if _ACTIVE:
            dtype, frame = _dtype_of(name, args, kwargs), user_frame(2)  # past a tracer's wrapper
            device = _device_of(args, kwargs) if name == "to" else None
            for c in list(_ACTIVE):
                want = c.record(self, dtype, frame) or want
                c.record_move(self, device, frame)
        out = orig(self, *args, **kwargs)
        return _SAVED.get("to", torch.nn.Module.to)(self, want) if want is not None else out

    cast.__wrapped__ = orig  # type: ignore[attr-defined]
    return cast


@contextlib.contextmanager
def module_casts(fixes: Sequence[Fix] = ()) -> Iterator[Casts]:
    """Record the program's module casts while a run runs; at a fixed line (``modcast`` of a fix) cast to the fixed
    dtype instead. The methods are patched once for all the runs at a time and put back when the last one ends."""
    casts = Casts({f.modcast[:2]: f.modcast[2] for f in fixes if f.modcast is not None})
    Module = torch.nn.Module
    with _LOCK:
        if not _ACTIVE:
            _SAVED.update({name: Module.__dict__[name] for name in ("to", *_NAMED)})
            for name, orig in _SAVED.items():
                setattr(Module, name, _wrap(name, orig))
        _ACTIVE.append(casts)
    try:
        yield casts
    finally:
        with _LOCK:
            _ACTIVE.remove(casts)
            if not _ACTIVE:
                for name, orig in _SAVED.items():
                    setattr(Module, name, orig)
                _SAVED.clear()


def at_cast_lines(fixes: list[Fix], casts: Casts | None, root: Any) -> list[Fix]:
    """Each component cast (``model.text_encoder.to(torch.bfloat16)``) of a component the program itself casts to
    another dtype at a line of its own file, replaced by that line fixed (a diff); the others as they were."""
    if casts is None or not isinstance(root, torch.nn.Module):
        return fixes
    from torchdoctor._virtual.builtat import build_line_fix
    from torchdoctor._virtual.globaldev import device_line_fix

    out: list[Fix] = []
    for f in fixes:
        out.append(_line_fix(f, casts, root) or device_line_fix(f, casts.moves, root) or build_line_fix(f, root) or f)
    return out


def _line_fix(f: Fix, casts: Casts, root: torch.nn.Module) -> Fix | None:
    from torchdoctor._report.diff import line_patch

    if f.kind != "path" or len(f.sets) != 1 or not f.sets[0][0].endswith(".") or \
            not isinstance(f.sets[0][1], torch.dtype):
        return None
    comp, want = f.sets[0][0][:-1], f.sets[0][1]
    try:
        mod = root.get_submodule(comp)
    except AttributeError:
        return None
    hit = casts.last(mod)
    if hit is None or hit[0] == want:
        return None
    was, file, line, at = hit
    try:
        with open(file, encoding="utf-8") as fh:
            raw = fh.read().split("\n")[line - 1].rstrip("\r")
    except (OSError, IndexError, UnicodeDecodeError):
        return None
    new = _recast(raw, comp.rsplit(".", 1)[-1], was, want)
    diff = line_patch(file, line, new) if new is not None else None
    if new is None or diff is None:
        return None
    return Fix(f"# {at} casts {comp} to {str(was)[6:]} while the rest of the model is {str(want)[6:]} (a cast before "
               f"it is undone there): {new.strip()}", "note", want, sets=f.sets, diff=diff, modcast=(file, line, want))


def _recast(raw: str, leaf: str, was: torch.dtype, want: torch.dtype) -> str | None:
    """The line with the cast of ``….leaf`` to ``was`` written to ``want``; None when it is not found alone."""
    body = raw.lstrip(" \t")
    if not raw.isascii():
        return None
    try:
        tree = ast.parse(body)
    except (SyntaxError, ValueError):
        return None
    pad, name = len(raw) - len(body), f"torch.{str(want)[6:]}"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr in ("to", *_NAMED) and ast.unparse(n.func.value).split(".")[-1] == leaf]
    if len(calls) != 1:
        return None
    call = calls[0]
    func: Any = call.func
    if func.attr in _NAMED:  # m.te.half() -> m.te.to(torch.bfloat16)
        start, end = pad + (func.value.end_col_offset or 0), pad + (call.end_col_offset or 0)
        return raw[:start] + f".to({name})" + raw[end:]
    spots = [a for a in [*call.args, *(k.value for k in call.keywords)] if ast.unparse(a) in (
        f"torch.{str(was)[6:]}", "torch.half" if was == torch.float16 else "")]
    if len(spots) != 1:
        return None
    a = spots[0]
    return raw[:pad + a.col_offset] + name + raw[pad + (a.end_col_offset or 0):]

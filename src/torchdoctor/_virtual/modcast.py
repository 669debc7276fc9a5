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
from typing import TYPE_CHECKING, Any

import torch

from torchdoctor._virtual.castlog import ACTIVE

if TYPE_CHECKING:  # pragma: no cover  # the proof machinery loads only when a fix is built
    from torchdoctor._virtual.prove import Fix


_NAMED = {"half": torch.float16, "bfloat16": torch.bfloat16, "float": torch.float32, "double": torch.float64}
_CPU = torch.device("cpu")  # ``Module.cpu()``: a move the program makes (an EMA copy kept on the cpu)


class Casts:
    """The program's module casts of one run: (module ref, dtype, file, line)."""

    def __init__(self, subst: dict[tuple[str, int], torch.dtype]) -> None:
        self.subst = subst  # (file, line) -> the dtype a fixed line casts to (a re-run)
        self.seen: list[tuple[Any, torch.dtype, str, int, str]] = []
        # module moves, as ``seen``, with the globals of the moving code (``globaldev``)
        self.moves: list[tuple[Any, torch.device, str, int, str, dict[str, Any]]] = []
        self.trails: list[Trail] = []  # of each move, at the same index: the program's frames that asked for it

    def record_move(self, mod: torch.nn.Module, device: torch.device | None, frame: Any) -> None:
        from torchdoctor._guard.ownfile import own_file
        from torchdoctor._virtual.origin import short_at

        if device is not None and frame is not None and own_file(frame.f_code.co_filename) and len(self.moves) < 4096:
            self.moves.append((weakref.ref(mod), device, frame.f_code.co_filename, frame.f_lineno, short_at(frame),
                               frame.f_globals))
            self.trails.append(Trail(frame))

    def record(self, mod: torch.nn.Module, dtype: torch.dtype | None, frame: Any) -> torch.dtype | None:
        from torchdoctor._guard.ownfile import own_file
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


class Trail:
    """The program's own frames, innermost first (at most 8), that asked for one module move: (file, line, code) —
    a manager's ``unpatch_model`` called by ``free_memory`` called by the app's loop — and the modules the first
    one held in local variables, by name, weakly (how that code names a layer of the model it moved)."""

    __slots__ = ("frames", "held", "thread")

    def __init__(self, frame: Any) -> None:
        from torchdoctor._virtual.usesite import own_cached

        self.frames: list[tuple[str, int, Any]] = []
        self.held: dict[str, Any] = {}
        self.thread = threading.get_ident()  # an offloader's worker moves in its own thread
        f, n = frame, 0
        while f is not None and n < 32 and len(self.frames) < 8:
            if own_cached(f.f_code.co_filename):
                self.frames.append((f.f_code.co_filename, f.f_lineno, f.f_code))
            f, n = f.f_back, n + 1
        try:  # a script's top level: its globals are its names
            self.held = {k: weakref.ref(v) for k, v in list(frame.f_locals.items())[:256]
                         if isinstance(v, torch.nn.Module) and not k.startswith("_")}
        except Exception:  # a frame whose locals cannot be read: no names
            self.held = {}


def counts() -> tuple[tuple[Any, int], ...]:
    """How many module moves each run recording now has recorded, by a weak reference to the run's ``Casts`` (a use
    noted now reads the moves before it)."""
    return tuple((weakref.ref(c), len(c.moves)) for c in list(_ACTIVE))


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


_ACTIVE: list[Casts] = ACTIVE  # the runs recording now (runs in threads may end in any order): ``castlog``'s list


_SAVED: dict[str, Any] = {}  # the methods as torch has them, while patched
_LOCK = threading.Lock()


def _wrap(name: str, orig: Any) -> Any:
    from torchdoctor._virtual.origin import user_frame

    def cast(self: Any, *args: Any, **kwargs: Any) -> Any:
        want = None
        if _ACTIVE:
            dtype, frame = _dtype_of(name, args, kwargs), _program_frame(user_frame(2))  # past a tracer's wrapper
            device = _device_of(args, kwargs) if name == "to" else _CPU if name == "cpu" else None
            for c in list(_ACTIVE):
                want = c.record(self, dtype, frame) or want
                c.record_move(self, device, frame)
        out = orig(self, *args, **kwargs)
        return _SAVED.get("to", torch.nn.Module.to)(self, want) if want is not None else out

    cast.__wrapped__ = orig  # type: ignore[attr-defined]
    return cast


def _program_frame(frame: Any) -> Any:
    """The first frame of the program's own files from ``frame`` out: a library's ``to`` override calling
    ``Module.to`` (transformers' ``PreTrainedModel.to``) was asked by the program's line that called it."""
    from torchdoctor._guard.ownfile import own_file

    f = frame
    while f is not None and not own_file(f.f_code.co_filename):
        f = f.f_back
    return f if f is not None else frame


@contextlib.contextmanager
def module_casts(fixes: Sequence[Fix] = ()) -> Iterator[Casts]:
    """Record the program's module casts while a run runs; at a fixed line (``modcast`` of a fix) cast to the fixed
    dtype instead. The methods are patched once for all the runs at a time and put back when the last one ends."""
    casts = Casts({f.modcast[:2]: f.modcast[2] for f in fixes if f.modcast is not None})
    Module = torch.nn.Module
    with _LOCK:
        if not _ACTIVE:
            _SAVED.update({name: Module.__dict__[name] for name in ("to", "cpu", *_NAMED)})
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
    another dtype at a line of its own file, replaced by that line fixed (a diff); a move of a model tensor the
    program made on the CPU in the run, by the fix of the factory's line (``hostline``); the others as they were."""
    from torchdoctor._virtual.hostline import made_lines
    from torchdoctor._virtual.progname import program_named

    fixes = made_lines(fixes, root)
    if casts is None:
        return program_named(fixes, root)
    from torchdoctor._virtual.awayline import away_fix
    from torchdoctor._virtual.builtat import build_line_fix, covered_notes
    from torchdoctor._virtual.dtypesource import dtype_source_fix
    from torchdoctor._virtual.heldfix import held_fix
    from torchdoctor._virtual.globaldev import device_line_fix
    from torchdoctor._virtual.mixedfix import scaler_fix
    from torchdoctor._virtual.offloaduse import drop_covered
    from torchdoctor._virtual.stalector import stale_factory_fix

    out: list[Fix] = []
    used: list[Fix] = []  # written where the program uses a model an offloading mechanism moved away
    for f in fixes:
        fixed = _line_fix(f, casts, root) or device_line_fix(f, casts.moves, root) or build_line_fix(f, root) \
            or away_fix(f, casts, root, used) or scaler_fix(f, casts, root) or held_fix(f) \
            or dtype_source_fix(f, casts, root) if isinstance(root, torch.nn.Module) else None
        fixed = stale_factory_fix(fixed or f) or fixed
        out.append(fixed or f)
    out = covered_notes(drop_covered(_not_swapped(out, used), used, root))
    # written for the program's object (a block's model as its frame calls it)
    return program_named([_in_parts(_put_apart(f, casts, root), casts, root) for f in out], root)


_SWAPPED = "moved its parameters to "  # the note of a parameter an offload moved between forward and backward


def _not_swapped(out: list[Fix], used: list[Fix]) -> list[Fix]:
    """``out`` without a use-site fix (``offloaduse``) of the tensors an offload moved between the forward that saved
    them and the backward that read them (``lifted``): the backward is where they fail, and a move at the forward's
    call would undo the offload without bringing them back for the backward."""
    owners = [f.code[2:].split(": ", 1)[0] for f in out if f.code.startswith("# ") and _SWAPPED in f.code]
    if not owners:
        return out
    gone = [u for u in used if any(n.startswith(o + ".") for n, _ in u.sets for o in owners)]
    for u in gone:
        used.remove(u)
    # a move of those tensors alone (the module never moved whole, or moved back after the offload's line) is
    # undone by the offload's next move as well: the note says what changes
    gone += [f for f in out if f.kind == "path" and f.sets and _SWAPPED not in f.code and all(
        any(n.startswith(o + ".") for o in owners) for n, _ in f.sets)]
    return [f for f in out if not any(f is u for u in gone)]


def _in_parts(f: Fix, casts: Casts, root: Any) -> Fix:
    """A move of model tensors the program left behind where it moved the model's modules one by one (``for m in
    model.modules(): if isinstance(m, nn.Linear): m.to(device)``) and never the model itself: that line is named, and
    the move of the whole model is the lasting fix (an adapter's own modules are no ``nn.Linear``)."""
    if f.kind != "path" or not f.sets or not isinstance(root, torch.nn.Module) or not all(
            isinstance(t, torch.device) for _, t in f.sets) or "  #" in f.code:
        return f
    target = f.sets[0][1]
    mods = {id(m) for m in root.modules()}
    moved = [x for x in casts.moves if (m := x[0]()) is not None and id(m) in mods and x[1].type == target.type]
    if not moved or any(x[0]() is root for x in moved):
        return f
    at = max({x[4] for x in moved}, key=lambda a: sum(x[4] == a for x in moved))
    if sum(x[4] == at for x in moved) < 2:  # a component moved at its own line (a pipeline's): no loop to name
        return f
    from torchdoctor._virtual.bareuse import placement_of

    if placement_of(root, target) is not None:  # a placement of the program's own (partial loading, offload
        return f  # hooks): moving the model itself would undo it (``bareuse`` fixes these where they are used)
    f.code += (f"  # {at} moves {sum(x[4] == at for x in moved)} of the model's modules one by one, never these: "
               f"move the model itself (model.to({str(target)!r}))")
    return f


def _put_apart(f: Fix, casts: Casts, root: Any) -> Fix:
    """A module the program holds apart (an EMA copy) moved to the run's device: the program's line that last put
    it elsewhere (``ema = ema.cpu()``, ``ema.to("cpu")``) is named in the fix, so the reader sees why it is there."""
    import linecache

    import re

    held = f.sets[0][0][:-1] if f.kind == "note" and len(f.sets) == 1 and f.sets[0][0].endswith(".") and \
        f.code.startswith(f.sets[0][0][:-1] + ".to(") else None  # a holder's tensors met outside any forward
    target = f.sets[0][1] if held is not None else f.target
    if f.kind != "apart" and held is None or not isinstance(target, torch.device) or "; put on " in f.code:
        return f
    inside = {id(m) for m in root.modules()} if isinstance(root, torch.nn.Module) else set()
    hit = next((x for x in reversed(casts.moves) if (m := x[0]()) is not None and id(m) not in inside and
                (type(m).__name__ == f.label if held is None else re.search(
                    rf"(?<![\w.]){re.escape(held)}\b", linecache.getline(x[2], x[3])))), None)
    if hit is None or hit[1].type == target.type:  # its last move by the program: to another kind of device
        return f
    f.diff = None  # a move where it is built is undone by that line (a manager's unload): advice, where it is used
    text = re.sub(r"\s+#[^'\"]*$", "", linecache.getline(hit[2], hit[3]).strip())  # the code, not its comment
    put = f"put on {hit[1]} by `{text}` at {hit[4]}" if text else f"put on {hit[1]} at {hit[4]}"
    for was in (f": {held} was made before the move, or never moved", "; move it where it is built"):
        f.code = f.code.replace(was, "", 1)  # the program's own line says why it is there
    f.code += f"; {put}: move it back before it meets tensors on {target}"
    return f


def _line_fix(f: Fix, casts: Casts, root: torch.nn.Module) -> Fix | None:
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.prove import Fix

    # a component cast (the consumer it feeds may follow, kept as it is: ``feeder``), or a module held apart
    if f.kind not in ("path", "apart") or not f.sets or not all(n.endswith(".") and t == f.sets[0][1]
                                                              for n, t in f.sets) or \
            not isinstance(f.sets[0][1], torch.dtype) or f.kind == "apart" and f.diff is not None:
        return None
    comp, want = f.sets[0][0][:-1], f.sets[0][1]
    try:
        mod = root.get_submodule(comp) if f.kind == "path" else _held_apart(f.label, casts, root)
    except AttributeError:
        return None
    if f.kind == "apart":
        comp = f.code.split(".to(", 1)[0] if ".to(" in f.code.split("  #", 1)[0] else f.label
    hit = casts.last(mod) if mod is not None else None
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


def _held_apart(cls: str, casts: Casts, root: torch.nn.Module) -> torch.nn.Module | None:
    """The one module of class ``cls`` the program cast outside the model (a pipeline's text encoder)."""
    inside = {id(m) for m in root.modules()}
    found = {id(m): m for x in casts.seen if (m := x[0]()) is not None and type(m).__name__ == cls and
             id(m) not in inside}
    return next(iter(found.values())) if len(found) == 1 else None


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

"""A tensor ``torch.load`` made at the program's line, in a virtual run: its maker is that call (with the
``map_location`` the program wrote), never the ``torch.empty`` torch's unpickler builds it with; the program's
objects name it (``opt.param_groups[0]['d']``, an optimizer's param_group value), and its device is fixed at the
load: ``map_location=<device>``, a diff of that line.

The case this exists for: an optimizer that keeps a tensor in its param_groups (a D-Adaptation ``d``), resumed with
``torch.load(path, map_location="cpu")``: ``Optimizer.load_state_dict`` moves per-parameter state to each
parameter's device but leaves param_group values as loaded, so the first step after the resume mixes devices.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_LIMIT = 4096  # loaded tensors recorded per run at most (a checkpoint's count; the rest keep torch's own record)
# "file:line" of an optimizer's load_state_dict at the program's line, by the optimizer's id (this run's)
_STATE_LOADS: dict[int, str] = {}
_MAPPED: dict[str, str] = {}  # "file:line" of a load -> its map_location as written there (this run's)
_HELD: dict[str, str] = {}  # "file:line" of a load -> the program's name of a tensor it made that a problem met


class Loaded:
    """How ``torch.load`` made a tensor: ``map_location`` as written at the program's line. A copy of the tensor
    (``Optimizer.load_state_dict`` deep-copies its param_groups) keeps the same record, by which the program's
    objects are searched for it."""

    __slots__ = ("mapped", "via")

    def __init__(self, mapped: str, via: str = "torch.load") -> None:
        self.mapped = mapped  # ``map_location='cpu'``, or "" when the call passed none
        self.via = via  # the call at the program's line: torch.load, or a library's loader (safetensors' load_file)

    def describe(self, made: Any) -> str:
        return describe(made)


def record(out: Any, map_location: Any, space: Any) -> None:
    """Each real CPU tensor of a loaded object (dicts, lists, tuples) keeps ``torch.load`` at the program's line as
    its maker, for the moment it meets tensors on a device."""
    from torchdoctor._virtual.origin import Made

    mapped = _said(map_location)
    for t in tensors_of(out)[:_LIMIT]:
        if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter or t.device.type != "cpu":
            continue
        made = Made("torch.load", None)
        if made.at is None or not _own(made.at):
            return  # a library's own load: torch's record stands (its line is not the program's to change)
        made.loaded = Loaded(mapped)
        space.keep_real(t, None, made)
        if len(_MAPPED) < _LIMIT:
            _MAPPED[made.at] = mapped


def tensors_of(obj: Any) -> list[torch.Tensor]:
    """The tensors of a loaded object (dicts, lists, tuples), each container once."""
    return [t for t in _tensors(obj, set()) if isinstance(t, torch.Tensor)]


def _tensors(obj: Any, seen: set[int]) -> list[Any]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if id(obj) in seen or not isinstance(obj, (dict, list, tuple)):
        return []
    seen.add(id(obj))
    return [t for x in (obj.values() if isinstance(obj, dict) else obj) for t in _tensors(x, seen)]


_VIA: dict[str, tuple[str, str]] = {}  # "file:line" -> (a library loader called there, its device parameter)


def through_call(made: Any) -> None:
    """A host-data factory (``torch.asarray``) a library's function ran under the program's line (safetensors'
    ``load_file(path, device="cpu")``): its record is that call at the program's line, with the device argument
    as written there, when the function takes one (``device`` / ``map_location``); else it stays as it is."""
    import sys

    from torchdoctor._virtual.origin import LINES, short_at
    from torchdoctor._virtual.ownline import own_line

    if _own(made.at) or len(_VIA) >= _LIMIT:
        return
    inner: Any = None
    frame: Any = sys._getframe(1)
    while frame is not None and not (_own_file(frame.f_code.co_filename)):
        inner, frame = frame, frame.f_back
    if frame is None or inner is None:
        return
    code = inner.f_code
    params = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    param = next((p for p in ("device", "map_location") if p in params), None)
    read = own_line(frame.f_code.co_filename, frame.f_lineno) if param is not None else None
    if param is None or read is None:
        return  # (a loader without a device parameter, torchvision's to_tensor: torch's record stands)
    calls = [n for n in ast.walk(read[2]) if isinstance(n, ast.Call) and
             ast.unparse(n.func).rsplit(".", 1)[-1] == code.co_name]
    if len(calls) != 1:
        return
    given = next((k for k in calls[0].keywords if k.arg == param), None)
    mapped = f"{param}={ast.unparse(given.value)}" if given is not None else ""
    module = str(inner.f_globals.get("__name__", ""))
    at = short_at(frame)
    LINES.setdefault(at, (frame.f_code.co_filename, frame.f_lineno))
    made.at, made.loaded = at, Loaded(mapped, f"{module}.{code.co_name}" if module else code.co_name)
    _VIA[at] = (code.co_name, param)
    if len(_MAPPED) < _LIMIT:
        _MAPPED[at] = mapped


_OWN: dict[str, bool] = {}  # file -> the program's own (asked per frame of every host factory a library runs)


def _own_file(file: str) -> bool:
    hit = _OWN.get(file)
    if hit is None:
        from torchdoctor._guard.ownfile import own_file
        from torchdoctor._virtual.origin import MACHINERY

        hit = own_file(file) and not file.startswith(MACHINERY)
        if len(_OWN) < _LIMIT:
            _OWN[file] = hit
    return hit


def _own(at: str) -> bool:
    from torchdoctor._virtual.origin import LINES

    file = LINES.get(at, ("", 0))[0]
    return bool(file) and _own_file(file)


def _said(map_location: Any) -> str:
    if map_location is None:
        return ""
    if isinstance(map_location, (str, torch.device)):
        return f"map_location={str(map_location)!r}"
    return "map_location=<its own function>" if callable(map_location) else "map_location=<a dict>"


def state_loaded(opt: Any) -> None:
    """An optimizer's ``load_state_dict`` called at the program's line: remembered for its param_group values."""
    from torchdoctor._virtual.origin import where_called

    at = where_called()
    if at and len(_STATE_LOADS) < _LIMIT:
        _STATE_LOADS[id(opt)] = at


def clear() -> None:
    _STATE_LOADS.clear()
    _MAPPED.clear()
    _HELD.clear()
    _VIA.clear()


def held_name(made: Any) -> tuple[str, str] | None:
    """``("opt.param_groups[0]['d']", why)``: a tensor whose record is ``made`` as a value of an optimizer's
    param_groups that the program's frames hold by name (innermost first; a method's own ``self`` only when no frame
    names it); None when no frame holds one."""
    import sys

    from torchdoctor._virtual.stackview import _SKIP
    from torchdoctor._virtual.tensor import current_space

    space = current_space()
    if space is None:
        return None
    frame: Any = sys._getframe(1)
    own: tuple[str, str] | None = None
    while frame is not None:
        if not any(s in frame.f_code.co_filename for s in _SKIP):
            for local, obj in list(frame.f_locals.items()):
                if isinstance(obj, torch.optim.Optimizer) and (hit := _in_groups(space, obj, made)) is not None:
                    named = (f"{local}.{hit}", _why(obj))
                    if local != "self":
                        return named
                    own = own or named
        frame = frame.f_back
    return own or _in_locals(space, made)


def _in_locals(space: Any, made: Any) -> tuple[str, str] | None:
    """``sd['scale']``, ``scale``: a tensor whose record is ``made`` as the program's frames hold it, by a name or
    one dict, list or tuple deep (innermost first)."""
    import sys

    from torchdoctor._virtual.stackview import _SKIP

    def mine(v: Any) -> bool:
        return type(v) is torch.Tensor and (kept := space.real_record(v)) is not None and kept[1] is made

    frame: Any = sys._getframe(2)
    bare = ""
    while frame is not None:
        if not any(s in frame.f_code.co_filename for s in _SKIP):
            for local, obj in list(frame.f_locals.items()):
                if local.startswith("__"):
                    continue
                if mine(obj):  # a bare name (a loop's ``s``): only when no object or container holds it
                    bare = bare or local
                    continue
                hit = _inside(obj, mine)
                if hit is None and local != "self" and not isinstance(obj, (torch.nn.Module, torch.Tensor, type)) \
                        and isinstance(attrs := getattr(obj, "__dict__", None), dict):  # an object's (``ema.shadow[0]``)
                    hit = next((f".{k}{sub}" for k, v in list(attrs.items()) for sub in (
                        "" if mine(v) else _inside(v, mine),) if sub is not None), None)
                if hit is not None:
                    return f"{local}{hit}", ""
        frame = frame.f_back
    return (bare, "") if bare else None


def _inside(obj: Any, mine: Any) -> str | None:
    """``['scale']`` / ``[0]``: where a dict, list or tuple holds a tensor ``mine`` accepts."""
    if isinstance(obj, dict) and len(obj) <= _LIMIT:
        key = next((k for k, v in obj.items() if mine(v)), None)
        return f"[{key!r}]" if key is not None else None
    if isinstance(obj, (list, tuple)) and len(obj) <= _LIMIT:
        i = next((i for i, v in enumerate(obj) if mine(v)), None)
        return f"[{i}]" if i is not None else None
    return None


def _in_groups(space: Any, opt: Any, made: Any) -> str | None:
    for i, group in enumerate(getattr(opt, "param_groups", ())[:1024]):
        if isinstance(group, dict):
            for k, v in group.items():
                if type(v) is torch.Tensor and (kept := space.real_record(v)) is not None and kept[1] is made:
                    return f"param_groups[{i}][{k!r}]"
    return None


def _why(opt: Any) -> str:
    at = _STATE_LOADS.get(id(opt))
    return (f"{type(opt).__name__}.load_state_dict" + (f" at {at}" if at else "") + " moves per-parameter state to "
            "each parameter's device and leaves param_group values as loaded")


def describe(made: Any) -> str:
    """``opt.param_groups[0]['d'] (an optimizer's param_group value, loaded by torch.load at app.py:34 with
    map_location='cpu'; Adam.load_state_dict at app.py:35 moves ...)``, or ``a tensor loaded by torch.load at
    app.py:34 with map_location='cpu'`` when no frame holds it by name."""
    rec: Loaded = made.loaded
    how = f"{rec.via} at {made.at}" + (f" with {rec.mapped}" if rec.mapped else " with no map_location" if
                                       rec.via == "torch.load" else "")
    held = held_name(made)
    if held is None:
        return f"a tensor loaded by {how}"
    name, why = held
    if made.at is not None and len(_HELD) < _LIMIT:
        _HELD.setdefault(made.at, name)
    kind = "an optimizer's param_group value, " if ".param_groups[" in name else ""
    return f"{name} ({kind}loaded by {how}" + (f"; {why})" if why else ")")


def load_fix(key: str, wrong: dict[str, tuple[str, Any]]) -> Any:
    """The fix of a tensor ``torch.load`` made on the wrong device (``key``: ``factory torch.load ... at app.py:34``):
    ``map_location`` set to the device at that line, a diff; judged at the failing ops like a factory's ``device=``.
    None for another maker, a dtype, or a line that is not the program's own or holds no single ``torch.load(...)``
    call."""
    from torchdoctor._virtual.prove import Fix

    if set(wrong) != {"device"}:
        return None
    found, dev = wrong["device"]
    made = loader_fix(key, key[8:].partition(" at ")[2], dev, found)
    return Fix(made[0], "note", dev, sets=((key, dev),), diff=made[1]) if made is not None else None


def loader_fix(key: str, at: str, dev: Any, found: str | None = None) -> tuple[str, str] | None:
    """(the fix's code, its diff) of a tensor made on ``found`` by ``torch.load`` or a library loader called at the
    program's line ``at``: its ``map_location=`` / ``device=`` set to ``dev`` there; None for another maker."""
    from torchdoctor._guard.maps import value_code

    said = key[8:].partition(" at ")[0]
    if not (said.startswith("torch.load") or at in _VIA) or not isinstance(dev, torch.device):
        return None
    fixed = map_diff(at, dev)
    if fixed is None:
        return None
    how = f"where {_MAPPED[at]} says" if _MAPPED.get(at) else "where the file saved it" if at not in _VIA else \
        "on the loader's default device"
    name = _HELD.get(at)
    group = name is not None and ".param_groups[" in name
    shown = _code(fixed[0])  # the line as code, its own comment left out (the diff keeps it)
    code = (f"{shown}  # the load put what it read {how}" + (f" ({found})" if found else "") + " and nothing moves "
            f"{name or 'it'} to {value_code(dev)} after" + (
                " (an optimizer's load_state_dict moves per-parameter state only, never its param_groups' values): "
                "load onto the device it is used on, or move the groups' tensors after load_state_dict" if group else
                ": load onto the device it is used on, or move it there after the load"))
    return code, fixed[1]


REMAP: dict[tuple[str, int], Any] = {}  # (file, line) of a torch.load -> the map_location a proof's re-run gives it


@contextlib.contextmanager
def remapped(sites: dict[tuple[str, int], Any]) -> Iterator[None]:
    """While a proof's re-run runs: each ``torch.load`` at those lines loads with ``map_location=`` the device (the
    fix applied as its diff writes it); put back after."""
    before = dict(REMAP)
    REMAP.update(sites)
    try:
        yield
    finally:
        REMAP.clear()
        REMAP.update(before)


def remap(map_location: Any) -> Any:
    """The ``map_location`` a load at the program's line runs with: its own, or a re-run's fix at that line."""
    if not REMAP:
        return map_location
    from torchdoctor._virtual.origin import user_frame

    f = user_frame(3)
    return REMAP.get((f.f_code.co_filename, f.f_lineno), map_location) if f is not None else map_location


def _code(line: str) -> str:
    """``line`` without its trailing comment, as written (quotes kept)."""
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError):
        return line
    cut = next((t.start[1] for t in tokens if t.type == tokenize.COMMENT), None)
    return line[:cut].rstrip() if cut is not None else line


def through(at: str) -> bool:
    """A library's loader called at ``at`` made tensors this run keeps a record of (``through_call``)."""
    return at in _VIA


def map_diff(at: str, dev: Any) -> tuple[str, str] | None:
    """(the line, its diff) of the program's ``torch.load(...)`` at ``at`` with ``map_location=`` the device, or of
    a library loader's call there with its ``device=`` (replaced where given, else added); None where the line is
    not the program's own, holds no single such call, or passes it by position or in ``**kwargs``."""
    from torchdoctor._guard.maps import value_code
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.origin import LINES
    from torchdoctor._virtual.ownline import own_line

    file, line = LINES.get(at, ("", 0))
    read = own_line(file, line) if file and isinstance(dev, torch.device) else None
    if read is None or not read[0].isascii():
        return None
    raw, body, tree = read
    function, param = _VIA.get(at, ("load", "map_location"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        ast.unparse(n.func) in ("torch.load", "load") if function == "load" else
        ast.unparse(n.func).rsplit(".", 1)[-1] == function)]
    if len(calls) != 1 or calls[0].end_col_offset is None:
        return None
    from torchdoctor._virtual.devexpr import device_name  # the program's own device pick, never 'cuda:0' written

    call, pad, want = calls[0], len(raw) - len(body), device_name(file, line) or value_code(dev)
    given = next((k.value for k in call.keywords if k.arg == param), None)
    if given is not None and given.end_col_offset is not None:
        new = raw[:pad + given.col_offset] + want + raw[pad + given.end_col_offset:]
    elif len(call.args) >= 2 or any(k.arg is None for k in call.keywords):
        return None  # passed by position, or in **kwargs: no one place to write it
    else:
        end = pad + int(call.end_col_offset or 0) - 1
        new = raw[:end] + f", {param}={want}" + raw[end:]
    diff = line_patch(file, line, new.strip())
    return (new.strip(), diff) if diff is not None else None


__all__ = ["REMAP", "Loaded", "clear", "describe", "held_name", "load_fix", "loader_fix", "map_diff", "record", "remap",
           "remapped", "state_loaded", "tensors_of", "through", "through_call"]

"""Modules the program holds apart from the model: a pipeline wrapper's ``self._cn = CN()``, loaded on the CPU and
never moved, whose output then reaches the model. ``model.to`` never reaches them, and a fix on a ``model.<path>``
names a path the model does not have. When such a module starts a forward of its own (it is outermost: no module
of the model runs it), the program's frames are alive: the first frame of the program's own code whose locals hold
it, directly (``cn``) or as an attribute of an object (``self._cn``, ``pipe._cn``), gives its name; the line that
built it is the assignment of that name to a call of its class in that file (``self._cn = CN()``). The fix moves
that object where it is built (a diff, when the line is the user's), and a re-run proves it by moving each module
of that class the program runs apart from the model, as the fixed line would.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import re
import sys
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from torchdoctor._report.records import MutableRecord

if TYPE_CHECKING:  # pragma: no cover  # the proof machinery loads only when a fix is built
    from torchdoctor._virtual.prove import Fix

_SKIP = ("site-packages", "dist-packages", "/torch/", "/torchdoctor/", "<frozen")  # machinery, not the program


@dataclass(init=False, repr=False, eq=False)
class Apart(MutableRecord):
    """A module that started a forward of its own, and what the program calls it."""

    cls: str  # its class name (``CN``)
    module: Any  # a weak reference to it
    name: str | None = None  # the program's name for it: ``self._cn``, ``pipe._cn``, ``cn``
    called_at: str | None = None  # ``app.py:19``, where the program called it
    file: str | None = None  # the file whose line built it
    line: int = 0  # the line that built it (``self._cn = CN()``), 0 when not found
    prefix: str = ""  # a module patched into a layer's forward: its walk path (``attn.forward.__self__.``)
    _fields = ("cls", "module", "name", "called_at", "file", "line", "prefix")

    def __init__(self, cls: str, module: Any, name: str | None = None, called_at: str | None = None,
                 file: str | None = None, line: int = 0, prefix: str = "") -> None:
        self.cls, self.module, self.name, self.called_at, self.file, self.line = cls, module, name, called_at, file, line
        self.prefix = prefix

    def holds(self, path: str) -> bool:
        """``path`` names one of its parameters or buffers (by its own paths: it ran as a root)."""
        mod = self.module()
        if mod is None:
            return False
        try:
            return any(n == path for n, _ in (*mod.named_parameters(), *mod.named_buffers()))
        except Exception:  # a strange module: not this one
            return False


NAMES: dict[int, tuple[weakref.ref[torch.nn.Module], str]] = {}  # a module -> the program's name when it started


def named_before(mod: torch.nn.Module) -> str | None:
    """The program's name for ``mod`` when it last started as an outermost module (``seen``), if it is still alive."""
    hit = NAMES.get(id(mod))
    return hit[1] if hit is not None and hit[0]() is mod else None


def seen(mod: torch.nn.Module) -> Apart:
    """The record of ``mod`` starting as an outermost module, named from the program's frames (now alive)."""
    out = Apart(type(mod).__name__, weakref.ref(mod))
    frame: Any = sys._getframe(1)
    while frame is not None:
        file = frame.f_code.co_filename.replace("\\", "/")
        if not any(s in file for s in _SKIP):
            name = _name_in(frame.f_locals, mod)
            if name is not None:
                from torchdoctor._virtual.origin import LINES, short_at

                out.name, out.called_at, out.file = name, short_at(frame), frame.f_code.co_filename
                if len(LINES) < 4096:  # the line that called it, for a fix written there (``handout``)
                    LINES.setdefault(out.called_at, (out.file, frame.f_lineno))
                out.line = _built_at(out.file, name, out.cls)
                if len(NAMES) < 256:  # the name it started under, for a fix written once the program has ended
                    NAMES[id(mod)] = (weakref.ref(mod), name)
                return out
        frame = frame.f_back
    return out


def _name_in(scope: dict[str, Any], mod: torch.nn.Module) -> str | None:
    """``name`` or ``name.attr`` of ``mod`` among the locals (one attribute deep, never through a module)."""
    for name, obj in list(scope.items()):
        if obj is mod and not name.startswith("__"):
            return name
    for name, obj in list(scope.items()):
        if name.startswith("__") or isinstance(obj, (torch.nn.Module, torch.Tensor, type)):
            continue
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict):
            hit = next((k for k, v in list(attrs.items()) if v is mod), None)
            if hit is not None:
                return f"{name}.{hit}"
    return None


def _built_at(file: str, name: str, cls: str) -> int:
    """The line of ``file`` assigning a call of ``cls`` to ``name``'s last part (``self._cn = CN()``), or 0."""
    attr = name.rsplit(".", 1)[-1]
    pattern = re.compile(rf"(^|[\s.;:]){re.escape(attr)}\s*=[^=].*\b{re.escape(cls)}\s*\(")
    for i, text in enumerate(linecache.getlines(file), 1):
        if pattern.search(text):
            return i
    return 0


def at_root(problems: Sequence[Any], apart: Sequence[Apart]) -> tuple[list[tuple[Apart, tuple[str | None, str, str,
                                                                                                 Any]]], list[Any]]:
    """The problems of a module held apart that started as a root of its own, as (that module, culprit), and the
    others. Its tensors' paths are its own (``weight``), which the model may hold too (a Linear beside an Embedding
    the program never moved): told apart by the class the problem names at the root, that one module held apart
    holding that path (none other of its class). Never a problem of the model's own class."""
    from torchdoctor._placement import parse_device, parse_dtype

    theirs: list[tuple[Apart, tuple[str | None, str, str, Any]]] = []
    rest: list[Any] = []
    for p in problems:
        hits = [a for a in apart if not a.prefix and a.cls == p.module_type] if p.module_path == "" and \
            p.kind in ("device", "dtype") and p.role in ("parameter", "buffer") else []
        if len(hits) != 1 or not hits[0].holds(p.path):
            rest.append(p)
            continue
        try:
            target = parse_dtype(p.expected) if p.kind == "dtype" else parse_device(p.expected)
        except (ValueError, TypeError, RuntimeError):
            rest.append(p)
            continue
        theirs.append((hits[0], (p.path, p.path, p.kind, target)))
    types = {p.module_type for p in rest if p.module_path == ""}
    if theirs and types & {a.cls for a, _ in theirs}:  # the model's own class: which root was meant is unknown
        return [], list(problems)
    return theirs, rest


def find(culprits: Sequence[tuple[str | None, str, str, Any]], apart: Sequence[Apart],
         model: dict[str, Any], rooted: Sequence[tuple[Apart, tuple[str | None, str, str, Any]]] = ()
         ) -> dict[int, tuple[Apart, list[tuple[str | None, str, str, Any]]]]:
    """The culprits whose path the model lacks and a module held apart holds, by that module (``rooted``: those
    ``at_root`` found, first)."""
    out: dict[int, tuple[Apart, list[tuple[str | None, str, str, Any]]]] = {}
    for a, c in rooted:
        out.setdefault(id(a), (a, []))[1].append(c)
    for c in culprits:
        if c[0] is None or c[0] in model:
            continue
        hit = next((a for a in apart if not a.prefix and (a.holds(str(c[0])) or a.name is not None and str(
            c[0]).startswith(a.name + ".") and a.holds(str(c[0])[len(a.name) + 1:]))), None)  # named as held: ema.x
        if hit is not None:
            out.setdefault(id(hit), (hit, []))[1].append(c)
    return out


def fix(a: Apart, culprits: list[tuple[str | None, str, str, Any]]) -> Fix:
    """Move (or cast) the module held apart where the program builds it: its name ``.to(...)``, the built line as
    a diff when it is the user's; proven by a re-run that moves every module of its class run apart (``moved``)."""
    from torchdoctor._guard.maps import value_code
    from torchdoctor._virtual.prove import Fix

    targets: list[Any] = []
    for c in culprits:
        for t in (c[3] if isinstance(c[3], tuple) else (c[3],)):
            if t is not None and all(type(t) is not type(x) for x in targets):
                targets.append(t)
    targets.sort(key=lambda v: isinstance(v, torch.dtype))  # device first, as .to takes them
    want = value_code(tuple(targets)) if len(targets) > 1 else value_code(targets[0])
    if a.file and a.line and isinstance(targets[0], torch.device):  # the program's own device pick, never 'cuda:0'
        from torchdoctor._virtual.devexpr import device_name  # written out (its cpu fallback would crash)

        if (name := device_name(a.file, a.line)) is not None:
            want = ", ".join([name, *(value_code(t) for t in targets[1:])])
    built = f", built at {_short(a.file)}:{a.line}" if a.file and a.line else ""
    called = f", called at {a.called_at}" if a.called_at else ""
    shown = ", ".join(str(c[0]) for c in culprits[:3])
    who = a.name or f"the {a.cls} module"
    code = (f"{a.name}.to({want})" if a.name else f"torchdoctor.move(<the {a.cls} module>, {want})") + (
        f"  # {who} ({a.cls}{built}{called}) is held by the program, not by the model: model.to never moves it "
        f"({shown}); move it where it is built")
    target = tuple(targets) if len(targets) > 1 else targets[0]
    return Fix(code, "apart", target, a.cls, diff=_diff(a, want),
               sets=tuple((str(c[0]), target) for c in culprits))


def _short(file: str) -> str:
    return file.replace("\\", "/").rsplit("/", 1)[-1]


def _diff(a: Apart, want: str) -> str | None:
    """The line that built the module, with ``.to(...)`` after the call of its class, as a unified diff."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch

    if not a.file or not a.line or not own_file(a.file):
        return None
    raw = linecache.getline(a.file, a.line).rstrip("\r\n")
    body = raw.lstrip(" \t")
    try:
        tree = ast.parse(body)
    except SyntaxError:  # a statement over several lines: no diff, the fix stands
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.end_col_offset is not None and
             ast.unparse(n.func).rsplit(".", 1)[-1] == a.cls and n.lineno == n.end_lineno == 1]
    if len(calls) != 1 or not body.isascii():
        return None
    end = len(raw) - len(body) + int(calls[0].end_col_offset or 0)
    if re.match(r"\s*\.\s*(?:to|cuda|cpu|xpu|mps|half|float|bfloat16|type)\s*\(", raw[end:]):
        return None  # the line places it itself (``TextEncoder().to(te_device)``): a move before that one is undone
    return line_patch(a.file, a.line, (raw[:end] + f".to({want})" + raw[end:]).strip())


def patched_into(model: Any) -> list[Apart]:
    """The modules patched into the forward of ``model``'s layers (a LoKr network: ``attn.forward = lokr.forward``),
    by their walk paths."""
    out: list[Apart] = []
    if not isinstance(model, torch.nn.Module):
        return out
    try:
        for name, layer in model.named_modules():
            obj = getattr(layer.__dict__.get("forward"), "__self__", None)
            if isinstance(obj, torch.nn.Module) and obj is not layer:
                out.append(Apart(type(obj).__name__, weakref.ref(obj),
                                 prefix=f"{name}.forward.__self__." if name else "forward.__self__."))
    except Exception:  # a strange module tree: no network named
        return []
    return out


def network_fix(culprits: Sequence[tuple[str | None, str, str, Any]], apart: Sequence[Apart]) -> Fix | None:
    """The network whose modules (one class) are patched into the model's forward, cast or moved where the program
    builds it (``network = nn.ModuleList([LoKr(m.attn), ...]).to(device)``: its name ``.to(...)``, the line as a
    diff); proven by a re-run that casts each module of that class the model does not hold. None when the modules
    are not of one known class."""
    from torchdoctor._guard.maps import value_code
    from torchdoctor._virtual.prove import Fix

    classes = {next((a for a in apart if a.prefix and str(c[0]).startswith(a.prefix)), None) is not None and next(
        a for a in apart if a.prefix and str(c[0]).startswith(a.prefix)).cls for c in culprits}
    if len(classes) != 1 or False in classes:
        return None
    (cls,) = classes
    mod = next((a.module() for a in apart if a.cls == cls and a.module() is not None), None)
    file = _class_file(mod)
    name, line = _assigned(file, str(cls)) if file else (None, 0)
    if file and line and not _a_module(linecache.getline(file, line)):
        return None  # held in a list (``network = [Lora(q), ...]``): no ``.to`` of its own
    target = culprits[0][3]
    want = value_code(target)
    shown = ", ".join(str(c[0]) for c in culprits[:2])
    built = f" (built at {_short(file)}:{line})" if file and line else ""
    code = f"{name or 'network'}.to({want})  # {len(culprits)} tensors of the {cls} modules patched into the " \
        f"model's forward are held by the program as {name or 'a network'}{built}, not by the model: model.to " \
        f"never reaches them (e.g. {shown}); cast it where it is built"
    diff = _to_diff(file, line, want) if file and line else None
    return Fix(code, "apart", target, str(cls), diff=diff, sets=tuple((str(c[0]), c[3]) for c in culprits))


def _class_file(mod: Any) -> str | None:
    """The file defining ``mod``'s class (its ``forward``'s code, else ``inspect``'s answer)."""
    import inspect

    code = getattr(getattr(type(mod), "forward", None), "__code__", None)
    if code is not None and mod is not None:
        return str(code.co_filename)
    try:
        return inspect.getsourcefile(type(mod)) if mod is not None else None
    except (TypeError, OSError):
        return None


def _assigned(file: str, cls: str) -> tuple[str | None, int]:
    """(name, line) of the first plain assignment in ``file`` whose value calls ``cls``, or (None, 0)."""
    pattern = re.compile(rf"^\s*([A-Za-z_][\w.]*)\s*=[^=].*\b{re.escape(cls)}\s*\(")
    for i, text in enumerate(linecache.getlines(file), 1):
        m = pattern.match(text)
        if m and not text.lstrip().startswith(("def ", "class ")):
            return m.group(1), i
    return None, 0


def _a_module(text: str) -> bool:
    """The assignment's value is a call (a module built, ``.to``-ed), not a list or tuple of them."""
    try:
        tree = ast.parse(text.strip())
    except SyntaxError:
        return True  # over several lines: said, without a diff
    stmt = tree.body[0] if tree.body else None
    return isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)


def _to_diff(file: str, line: int, want: str) -> str | None:
    """The assignment at ``line`` with its value cast: ``want`` added to a trailing ``.to(...)``, or ``.to(want)``."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch

    if not own_file(file):
        return None
    raw = linecache.getline(file, line).rstrip("\r\n")
    body = raw.lstrip(" \t")
    try:
        tree = ast.parse(body)
    except SyntaxError:
        return None
    stmt = tree.body[0] if tree.body else None
    if not isinstance(stmt, ast.Assign) or stmt.value.end_col_offset is None or not body.isascii():
        return None
    pad, value = len(raw) - len(body), stmt.value
    end = pad + int(value.end_col_offset or 0)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "to" and \
            value.args and not value.keywords and len(value.args) == 1:
        new = raw[:end - 1] + f", {want}" + raw[end - 1:]
    else:
        new = raw[:pad + value.col_offset] + "(" + raw[pad + value.col_offset:end] + f").to({want})" + raw[end:]
    return line_patch(file, line, new.strip())


@contextlib.contextmanager
def moved(model: Any, fixes: Sequence[Fix]) -> Iterator[None]:
    """While a re-run's ``call(model)`` runs: each module of a fixed class that starts apart from the model is
    moved (or cast) as the fix says, once, before its forward, as the fixed line would have made it."""
    todo = {f.label: f.target for f in fixes if f.kind == "apart"}
    if not todo:
        yield
        return
    done: set[int] = set()

    def pre(layer: torch.nn.Module, _args: Any) -> None:
        patched = getattr(layer.__dict__.get("forward"), "__self__", None)  # a module patched into its forward
        for mod in (layer, patched):
            want = todo.get(type(mod).__name__) if isinstance(mod, torch.nn.Module) else None
            if want is None or not isinstance(mod, torch.nn.Module) or id(mod) in done or mod is model:
                continue
            done.add(id(mod))
            if isinstance(model, torch.nn.Module) and any(m is mod for m in model.modules()):
                continue  # part of the model: the fix is not about it
            mod.to(*(want if isinstance(want, tuple) else (want,)))

    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    try:
        yield
    finally:
        handle.remove()


def loose_network_fix(apart: list[tuple[str | None, str, str, Any]]) -> Fix:
    """The network whose modules were patched into the model's forward is held by the program, not the model:
    ``torchdoctor.move(model)`` and ``model.to`` never reach it; ``network.to`` where it is built does."""
    from torchdoctor._guard.maps import value_code
    from torchdoctor._virtual.prove import Fix

    target = apart[0][3]
    shown = ", ".join(str(c[0]) for c in apart[:2])
    return Fix(f"# network.to({value_code(target)}) where the network is built: {len(apart)} tensors of a network "
               f"patched into the model's forward are held apart from the model (e.g. {shown}); moving the model "
               "does not move them", "note", target, sets=tuple((str(c[0]), c[3]) for c in apart))


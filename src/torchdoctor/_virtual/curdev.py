"""A module the program moved with a bare ``.cuda()`` (``.xpu()``, ``.to("cuda")``) while the rest of its work runs on
the device the program chose: a bare move goes to the *current* device — cuda:0 unless the program called
``torch.cuda.set_device`` — so an inference copy built in a ``post_init`` as ``GPT2LMHeadModel(cfg).cuda()`` sits on
cuda:0 while the app, started with ``--device cuda:1``, feeds it ids made on cuda:1. The fix is that line, moved to
the program's own device (``.to(device)``: the name the tensor it meets was made with, where that line can read it,
else the device of the object that holds the module, ``next(self.parameters()).device``), as a diff; it replaces a
move of the other side to cuda:0 (off the device the program chose) and ``.data`` moves of single weights (the module
left split over two devices). Read from the program's source after the run; the fix is proven at the failing ops
with the module's tensors on that device."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

__all__ = ["bare_move_fixes"]

_BARE = ("cuda", "xpu")
_NAMED = re.compile(r"\(([\w.]+)\)$")  # an operand's model path, as a problem lists it: ``...@cuda:0 (lm.weight)``
_FROM = re.compile(r" from ([\w.]+)")  # a tensor computed in forward from a named model tensor
_MADE = re.compile(r"made by \S+ at (\S+:\d+)")  # the line that made an argument


def bare_move_fixes(items: list[Fix], problems: Sequence[Any], root: Any) -> list[Fix]:
    """``items`` with the device fixes of a module a bare move put on the current device replaced by the fix at that
    move's line; ``items`` as they are when no such module, line or device name is found."""
    if not isinstance(root, torch.nn.Module) or not problems:
        return items
    try:
        found = _find(problems, root)
    except Exception:  # the source is read as text: a file that does not parse leaves the fixes as they were
        return items
    if found is None:
        return items
    fix, path, was = found
    inside = path + "." if path else "\0"  # a root moved whole: only the moves to where it is are needless
    kept = [f for f in items if not _covered(f, inside, was)]
    return [fix, *kept]


def _covered(f: Fix, inside: str, was: torch.device) -> bool:
    """A device fix the line's fix makes needless: a move to where the bare move put the module, or of its tensors."""
    if not f.sets or not all(isinstance(t, torch.device) for _, t in f.sets):
        return False
    return all(t == was or n.startswith(inside) for n, t in f.sets)


def _find(problems: Sequence[Any], root: torch.nn.Module) -> tuple[Fix, str, torch.device] | None:
    from torchdoctor._virtual.origin import LINES

    named = dict(root.named_modules())
    for p in problems:
        if p.kind != "device":
            continue
        for path in _paths(p):
            mpath = _module_of(path, named)
            if mpath is None:
                continue
            was = _one_device(named[mpath])
            other = _other_device(p, was)
            if was is None or other is None:
                continue
            rest = [t.device for n, t in _tensors(root) if not n.startswith(mpath + ".")]
            if mpath and (not rest or any(d != other for d in rest)):  # the holder is on the program's device
                continue
            made = _MADE.search(p.message)
            maker = LINES.get(made.group(1)) if made else None
            hit = _bare_line(root, mpath, maker)
            if hit is None:
                continue
            file, line, call, raw, holder = hit
            expr = _device_name(file, line, maker, holder)
            if expr is None:
                continue
            said = f"{holder}.{mpath.rsplit('.', 1)[-1]}" if mpath and holder else holder or mpath
            return _fix(file, line, call, raw, expr, said, mpath, was, other), mpath, was
    return None


def _paths(p: Any) -> list[str]:
    out = [m.group(1) for t in p.tensors if (m := _NAMED.search(t.strip()))]
    out += [m.group(1) for m in _FROM.finditer(p.message)]
    return out


def _module_of(path: str, named: dict[str, torch.nn.Module]) -> str | None:
    """The outermost module below the root on ``path``'s way (``inference_model`` of ``inference_model.lm_head.w``);
    ``""`` for a tensor of the root's own layer (the root is the module moved)."""
    parts = path.split(".")
    for i in range(1, len(parts)):
        if ".".join(parts[:i]) in named:
            return ".".join(parts[:i])
    return "" if len(parts) == 1 else None


def _tensors(m: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*m.named_parameters(), *m.named_buffers()]


def _one_device(m: torch.nn.Module) -> torch.device | None:
    devs = {t.device for _, t in _tensors(m)}
    if len(devs) != 1:
        return None
    d = next(iter(devs))
    return d if d.type in _BARE else None


def _other_device(p: Any, was: torch.device | None) -> torch.device | None:
    """The device the module's tensors meet at the op: the same type, another index."""
    if was is None:
        return None
    seen = set()
    for t in p.tensors:
        m = re.search(r"@(\w+:\d+)", t)
        if m:
            seen.add(torch.device(m.group(1)))
    seen.discard(was)
    if len(seen) != 1:
        return None
    d = next(iter(seen))
    return d if d.type == was.type else None


def _bare_line(root: torch.nn.Module, mpath: str, maker: tuple[str, int] | None
               ) -> tuple[str, int, ast.Call, str, str | None] | None:
    """The one line of the program's own files that assigns the module with a bare move in its value — an attribute
    of the object above it (``self.inference_model = ….cuda()``), read from the class files of the modules above
    it; the root itself by a name the program holds it by (``copy = nn.Embedding(40, 8).cuda()``), read from the
    file of the line that made the tensor it met — its file, line, the move's call, the line's text and the name of
    the object holding the module there (``self``) or the module's own name."""
    import inspect

    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._tracker import held_names
    from torchdoctor._virtual.ownline import source

    parts = mpath.split(".")
    leaf = parts[-1]
    names = {n for n, m in held_names().items() if m is root} if not mpath else set()
    holders = [root] + [root.get_submodule(".".join(parts[:i])) for i in range(1, len(parts))] if mpath else []
    files: list[str] = [maker[0]] if not mpath and maker is not None and own_file(maker[0]) else []
    for h in holders:
        cls = type(h)
        try:  # a function of the class first: a program run as __main__ is in no sys.modules under its name
            f = next((v.__code__.co_filename for v in vars(cls).values() if hasattr(v, "__code__")), "") or \
                inspect.getsourcefile(cls) or ""
        except TypeError:
            continue
        if f and f not in files and own_file(f):
            files.append(f)
    hits: list[tuple[str, int, ast.Call, str, str | None]] = []
    for file in files:
        got = source(file)
        if got is None:
            continue
        tree, text = got
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign) or len(node.targets) != 1 or node.lineno != node.end_lineno:
                continue
            tgt = node.targets[0]
            holder = ast.unparse(tgt.value) if mpath and isinstance(tgt, ast.Attribute) and tgt.attr == leaf else \
                tgt.id if not mpath and isinstance(tgt, ast.Name) and tgt.id in names else None
            if holder is None:
                continue
            bare = [c for c in ast.walk(node.value) if isinstance(c, ast.Call) and _is_bare(c)]
            if len(bare) == 1:
                hits.append((file, node.lineno, bare[0], text.split("\n")[node.lineno - 1].rstrip("\r"), holder))
    return hits[0] if len(hits) == 1 else None


def _is_bare(c: ast.AST) -> bool:
    """``.cuda()`` / ``.xpu()`` with no device, or ``.to("cuda")`` with no index."""
    if not isinstance(c, ast.Call) or not isinstance(c.func, ast.Attribute):
        return False
    if c.func.attr in _BARE:
        return not c.args and not c.keywords
    if c.func.attr == "to" and len(c.args) == 1 and not c.keywords:
        a = c.args[0]
        return isinstance(a, ast.Constant) and a.value in _BARE
    return False


def _device_name(file: str, line: int, maker: tuple[str, int] | None, holder: str | None) -> str | None:
    """How the move's line can name the program's device: the ``device=`` (or ``.to(...)``) name the other operand
    was made with, where it is a local of the same function or a name of the file's module level; else the device
    of the object holding the module (``next(self.parameters()).device``)."""
    from torchdoctor._virtual.moveline import _same_function
    from torchdoctor._virtual.ownline import source

    if maker is not None:
        mfile, mline = maker
        got = source(mfile)
        expr = _made_with(got[0], mline) if got is not None else None
        if expr is not None:
            head = expr.split(".", 1)[0]
            if mfile == file and _same_function(file, mline, line):
                return expr
            own = source(file)
            if own is not None and any(isinstance(n, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == head for t in n.targets) for n in own[0].body):
                return expr  # a module-level name of the moving file: read when the line runs
    if holder == "self":
        return "next(self.parameters()).device"
    return None


def _made_with(tree: ast.AST, line: int) -> str | None:
    """The device expression of the call at ``line`` (``device=device``, ``.to(dev)``): a name or an attribute."""
    for c in ast.walk(tree):
        if not isinstance(c, ast.Call) or getattr(c, "lineno", None) != line:
            continue
        exprs = [k.value for k in c.keywords if k.arg == "device"]
        if isinstance(c.func, ast.Attribute) and c.func.attr == "to" and c.args:
            exprs.append(c.args[0])
        for e in exprs:
            if isinstance(e, (ast.Name, ast.Attribute)):
                return ast.unparse(e)
    return None


def _fix(file: str, line: int, call: ast.Call, raw: str, expr: str, named: str, path: str, was: torch.device,
         other: torch.device) -> Fix:
    from torchdoctor._placement import device_str
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.hookleft import short_file

    assert isinstance(call.func, ast.Attribute)
    start = int(call.func.value.end_col_offset or 0)  # the call's receiver ends here (the file's own columns)
    end = int(call.end_col_offset or 0)
    old = raw[start:end]
    new = raw[:start] + f".to({expr})" + raw[end:] if raw.isascii() else None
    diff = line_patch(file, line, new.strip()) if new is not None else None
    at = f"{short_file(file)}:{line}"
    text = (f"# {at} moves {named} with a bare `{old}`: that is the current device, {device_str(was)}, not the "
            f"program's {device_str(other)} the tensors it meets are on; move it there: {(new or raw).strip()}")
    return Fix(text, "note", other, diff=diff, sets=((path + "." if path else "*", other),))

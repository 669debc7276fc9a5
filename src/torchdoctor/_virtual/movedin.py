"""A tensor a module's own method moves to a device it read from somewhere stale (a T5 wrapper that cached its device
string when it was built, ``self.device = "cpu"``, then moved to the GPU by the pipeline: ``ids =
torch.as_tensor(tokens).to(self.device)``), which then meets the module's weights on the run's device: that line's
``.to(...)`` is given the module's own device (``next(self.parameters()).device``), a diff, never a device written
out. Proven at the failing op as the move of that copy is (its ``moved <name> at <line>`` tag). A forward hook
that returns its module's output moved away (``return out.to(DEVICE)`` with ``DEVICE = "cpu"`` to collect features)
returns it as it is there: what a forward hook returns replaces the module's output.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torchdoctor._virtual.prove import Fix

__all__ = ["moved_in_fix"]

_MODULES = ("Module", "Model", "Mixin", "Encoder", "Decoder", "Transformer")  # a base class read as a torch module


def moved_in_fix(tag: str, found: str, target: Any) -> Fix | None:
    """The fix of the copy ``tag`` (``moved ids at app.py:13``) at its line, when that line is in a method of a module
    class of the program's and holds one ``.to(<device>)`` (module doc); None otherwise."""
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.devexpr import tree_of
    from torchdoctor._virtual.origin import LINES
    from torchdoctor._virtual.ownline import own_line

    name, _, at = tag[6:].partition(" at ")
    if not isinstance(target, torch.device) or at not in LINES:
        return None
    file, line = LINES[at]
    read, tree = own_line(file, line), tree_of(file)
    if read is None or tree is None or not read[1].isascii():
        return None
    if not _module_method(tree, line):
        return _hook_return(tag, found, target, file, line)
    raw, body, parsed = read
    moves = [n for n in ast.walk(parsed) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
             n.func.attr == "to" and len(n.args) == 1 and not n.keywords and not _dtype(n.args[0])]
    if len(moves) != 1 or moves[0].args[0].end_col_offset is None or not _cached(moves[0].args[0]):
        return None  # (a device written out is ``moveline``'s: moved to the device of what it meets)
    arg = moves[0].args[0]
    want = "next(self.parameters()).device"
    pad = len(raw) - len(body)
    new = raw[:pad + arg.col_offset] + want + raw[pad + int(arg.end_col_offset or 0):]
    diff = line_patch(file, line, new)
    if diff is None:
        return None
    from torchdoctor._virtual.prove import Fix

    return Fix(f"{new.strip()}  # {at} moved {name} to {found} with `{ast.unparse(arg)}`, and the module's weights are "
               f"on {target}: move it to the module's own device", "note", target, sets=((tag, target),), diff=diff)


def _hook_return(tag: str, found: str, target: Any, file: str, line: int) -> Fix | None:
    """A forward hook (``def collect(mod, inp, out): return out.to(DEVICE)``) whose returned value, which replaces
    the module's output, is its output moved away: the line returns the output as it is, a diff; None otherwise."""
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.devexpr import enclosing
    from torchdoctor._virtual.ownline import own_line

    fn, read = enclosing(file, line), own_line(file, line)
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or read is None or \
            len(fn.args.args) not in (3, 4) or fn.args.vararg is not None:
        return None
    out = fn.args.args[-1].arg  # (module, input, output); with_kwargs: (module, args, kwargs, output)
    raw, body, parsed = read
    ret = parsed.body[0] if len(parsed.body) == 1 else None
    call = ret.value if isinstance(ret, ast.Return) else None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute) or \
            call.func.attr not in ("to", "cpu", "cuda") or ast.unparse(call.func.value) != out:
        return None
    new = raw[:len(raw) - len(body)] + f"return {out}"
    diff = line_patch(file, line, new)
    if diff is None:
        return None
    from torchdoctor._virtual.prove import Fix

    at = tag[6:].partition(" at ")[2]
    return Fix(f"return {out}  # at {at}: `{fn.name}` is a forward hook, and what it returns replaces the module's "
               f"output: `{ast.unparse(call)}` sent the model's data to {found} while it runs on {target}; return the "
               f"output as it is (a hook that collects it keeps its copy apart: `feats.append({ast.unparse(call)})`)",
               "note", target, sets=((tag, target),), diff=diff)


def _module_method(tree: ast.Module, line: int) -> bool:
    """``line`` is in a method (first parameter ``self``) of a class whose bases read as a torch module."""
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef) or not cls.lineno <= line <= (cls.end_lineno or cls.lineno):
            continue
        for fn in cls.body:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    fn.lineno <= line <= (fn.end_lineno or fn.lineno):
                bases = " ".join(ast.unparse(b) for b in cls.bases)
                return bool(fn.args.args) and fn.args.args[0].arg == "self" and any(m in bases for m in _MODULES)
    return False


def _cached(node: ast.expr) -> bool:
    """An attribute the module keeps (``self.device``, ``self.config.device``): read from where it was cached."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def _dtype(node: ast.expr) -> bool:
    text = ast.unparse(node)
    return "dtype" in text or text.startswith("torch.") and not text.startswith("torch.device")

"""A tensor made on the cpu by a factory of the program's own line, meeting tensors on the accelerator, fixed with the
program's own name for the device, never a device written out.

A program that picks its device by a rule of its own (``d = "cuda" if torch.cuda.is_available() else "cpu"``,
``accelerator.device``) runs on every machine that rule covers; ``torch.tensor(..., device='cuda:0')`` at its line
would crash it on any machine without that accelerator. The name comes from the program itself, in this order:

- the failing line already moves another tensor with that name (``loss_fn(net(x), y.to(device))``: a batch whose
  labels are moved and whose images are not): the tensor is moved there too, ``net(x.to(device))`` — the data it
  was made in stays where the program keeps it (a whole dataset is never put in device memory);
- the tensor it meets at the failing line was made or moved with a device the program names (``x = torch.randn(6,
  4, device=d)``), a name its maker's line can read: the maker is given ``device=d``;
- else, when the tensor it meets has a name at the failing line: the tensor is moved there to that one's device,
  ``idx.to(x.device)``.

A maker whose function is given a tensor (``device=x.device``, ``origin.IN_SCOPE``) or a device parameter
(``callsite``) is fixed as before. Proven as the maker's fix is: at the failing op with the operands that maker made
on the device they meet; in a re-run (the marker, ``simulate(call=)``), the factory's call at its line makes its
tensor there (``remake``), or the module or torch call at the failing line is given the tensor moved
(``operandfix``).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

__all__ = ["named_fix"]


def named_fix(key: str, cases: Sequence[Any], target: torch.device) -> Fix | None:
    """The fix of the tensor ``key`` made (``factory torch.tensor at app.py:5``) with the program's name for the
    device it should be on (module doc); None when the program names none, or its maker reads a device already."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._virtual.origin import IN_SCOPE, LINES

    at = key.rpartition(" at ")[2]
    made_file, made_line = LINES.get(at, ("", 0))
    if not key.startswith("factory torch.") or not made_file or IN_SCOPE.get(at) or not own_file(made_file) or \
            _takes_device(made_file, made_line):
        return None
    # the lines where the tensor is handed on by a name: one line is fixed at its use; more (a library's call,
    # then the program's loss) would each need one, so the maker is fixed (``noise = torch.randn(..., device=d)``)
    uses = {c.line for c in cases if c.line is not None and any(
        key in n.tags and n.device != target for n in getattr(c, "names", ()))}
    alone = len(uses) <= 1
    for c in cases:
        names = getattr(c, "names", ())
        if c.line is None or not names:
            continue
        own = alone and own_file(c.line[0])
        wrong = [n for n in names if key in n.tags and n.device != target]
        if len(wrong) != 1 or not wrong[0].local and own:
            continue
        w = wrong[0]
        file, line = c.line
        moved = _moved_with(file, line, w.name) if own else None
        if moved is not None:  # the line moves its other tensors with the program's name: this one too
            fix = _at_use(key, c, w.name, moved, target, f"the line moves {moved[1]} with .to({moved[0]}) already")
            if fix is not None:
                return fix
        partners = [n for n in names if n.device == target and key not in n.tags]
        for p in partners:
            name = _named_device(p.tags, made_file, made_line)
            if name is not None:
                return _at_maker(key, at, made_file, made_line, name[0], p.name, name[1], target)
        if own and partners and partners[0].local:
            p = partners[0]
            return _at_use(key, c, w.name, (f"{p.name}.device", p.name), target,
                           f"it follows the device of {p.name}, wherever the program puts it")
    return None


def _takes_device(file: str, line: int) -> bool:
    """The maker's function takes a device parameter: the call that left it out is fixed there (``callsite``)."""
    from torchdoctor._virtual.devexpr import enclosing

    fn = enclosing(file, line)
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        "device" in a.arg for a in (*fn.args.args, *fn.args.kwonlyargs))


def _moved_with(file: str, line: int, wrong: str) -> tuple[str, str] | None:
    """(the name, the tensor moved) when the program's ``line`` moves another tensor with ``.to(NAME)`` (a name or an
    attribute chain, never a device written out) and hands ``wrong`` as a call's argument."""
    from torchdoctor._virtual.ownline import own_line

    read = own_line(file, line)
    if read is None:
        return None
    tree = read[2]
    moves = [(ast.unparse(n.args[0]), ast.unparse(n.func.value)) for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "to" and n.args and _chain(n.args[0])
             and ast.unparse(n.func.value) != wrong and _a_device(ast.unparse(n.args[0]), file)]
    if not moves or not _argument_spans(tree, wrong):
        return None
    return moves[0]


def _a_device(expr: str, file: str) -> bool:
    """``expr`` names a device, not a dtype (``.to(weight_dtype)``, ``.to(torch.float32)``): its last part says so
    (``device``, ``accelerator.device``, ``dev``), or the file binds it from a device pick (``torch.device(...)``,
    ``... is_available() ...``)."""
    from torchdoctor._virtual.devexpr import tree_of

    last = expr.rsplit(".", 1)[-1].lower()
    if "dtype" in last or expr.startswith("torch."):
        return False
    if "dev" in last:
        return True
    tree = tree_of(file)
    return tree is not None and any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == expr for t in n.targets) and
        any(w in ast.unparse(n.value) for w in ("device(", "is_available()")) for n in ast.walk(tree))


def _chain(node: ast.expr) -> bool:
    """``device``, ``accelerator.device``, ``self.device``: a name the program binds, no device written out."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _argument_spans(tree: ast.Module, name: str) -> list[tuple[int, int]]:
    """Where ``name`` is handed as it is to a call, positionally or by keyword (never as a call's receiver)."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            for a in (*n.args, *(k.value for k in n.keywords)):
                if isinstance(a, ast.Name) and a.id == name and a.end_col_offset is not None:
                    out.append((a.col_offset, a.end_col_offset))
    return out


def _named_device(tags: Sequence[str], made_file: str, made_line: int) -> tuple[str, str] | None:
    """(the device expression, its line) a tag's maker or move wrote as a name (``device=d``, ``.to(device)``) that
    the maker's line at ``made_file:made_line`` reads the same way; None when none does."""
    from torchdoctor._virtual.devexpr import written_device
    from torchdoctor._virtual.origin import LINES

    for t in tags:
        t = t.removeprefix("far ")
        if not t.startswith(("factory ", "moved a tensor at ")) or " at " not in t:
            continue
        at = t.rpartition(" at ")[2]
        file, line = LINES.get(at, ("", 0))
        said = written_device(file, line) if file else None
        if said is None or said[1] or not _chain(ast.parse(said[0], mode="eval").body):
            continue
        if _visible(file, line, made_file, made_line, said[0].split(".", 1)[0]):
            return said[0], at
    return None


def _visible(file: str, line: int, made_file: str, made_line: int, root: str) -> bool:
    """``root`` means the same at ``made_line`` as at ``line``: both in one function (or both at the module's top
    level) of one file, and bound there before ``made_line`` (at the top level: a module-level name a function
    reading it does not bind)."""
    import os

    from torchdoctor._virtual.devexpr import enclosing

    if os.path.realpath(file) != os.path.realpath(made_file):
        return False
    here, there = enclosing(file, line), enclosing(made_file, made_line)
    if here is None or here is not there:
        return False
    params = {a.arg for a in (*here.args.args, *here.args.kwonlyargs)} if isinstance(
        here, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
    return root in params or any(
        isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id == root and n.lineno < made_line
        for n in ast.walk(here))


def _at_maker(key: str, at: str, file: str, line: int, name: str, partner: str, where: str,
              target: torch.device) -> Fix | None:
    """The factory given ``device=<name>``: the name the program moved or made ``partner`` with."""
    from torchdoctor._virtual.castfix import legacy_call, maker_diff

    op = key[8:].partition(" at ")[0].split(" ", 1)[0]
    diff = maker_diff(op, at, target, {"device": name})
    if diff is None:
        return None
    kw = "map_location" if op == "torch.load" else "device"  # (torch.load has no device=)
    call = legacy_call(op, name) or f"{op}(..., {kw}={name})"
    return Fix(f"# {op} made it on cpu at {at}: pass {kw}={name}, the program's name for the device {partner} is "
               f"on ({where}) ({call})", "note", target, sets=((key, target),), diff=diff,
               remake=(file, line, op[6:], target, None))


def _at_use(key: str, c: Any, wrong: str, moved: tuple[str, str], target: torch.device, why: str) -> Fix | None:
    """``wrong`` handed as ``wrong.to(<name>)`` where the failing line passes it, a diff; the maker's line untouched."""
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.ownline import own_line

    file, line = c.line
    read = own_line(file, line)
    if read is None or not read[1].isascii():
        return None
    raw, body, tree = read
    spans = _argument_spans(tree, wrong)
    if not spans:
        return None
    pad, new = len(raw) - len(body), raw
    for start, end in sorted(spans, reverse=True):  # from the right: offsets stay valid
        new = new[:pad + end] + f".to({moved[0]})" + new[pad + end:]
    diff = line_patch(file, line, new.strip())
    if diff is None:
        return None
    said = key[8:]
    return Fix(f"# {wrong} (made by {said}) is on cpu where {c.at or f'{file}:{line}'} hands it on: move it there, "
               f"{wrong}.to({moved[0]}) ({why}); where it was made stays as it is", "note", target,
               sets=((key, target),), diff=diff, reoperand=(file, line, wrong, moved[1] if moved[0].endswith(
                   ".device") else None, target))

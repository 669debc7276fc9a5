"""A tensor fixed where it meets the one it disagrees with, not where it is made, when the maker's line is the wrong
place for a device.

Its shapes, all from ComfyUI-like apps:

- The maker is a function of another file that returns its tensor to callers (a loader: ``LoadImageMask.load``
  returns its mask on the cpu by the app's convention, and every node that reads it expects that); the failing op
  is in a node of the program's own that merely receives it. A ``device=`` at the loader would change what it
  returns to every caller. The fix goes into the node: ``mask = mask.to(image1.device)``.
- The tensor it meets has a device the program decides at run time (``device=mm.intermediate_device()``: a flag
  picks cuda or the cpu), while the maker writes a device out (``device="cpu"``) in another function that has no
  tensor to read a device from. A device written at the maker is right in one mode and wrong in the other; the fix
  reads the device of the tensor it meets, where they meet: ``src = src.to(region.device)``. The same when the
  tensor the run blames is the one whose maker picks its device at run time: that line is never given a device
  written out; the tensor whose device is written out follows it where they meet.

The names come from the failing op's own line: the locals it reads, with their devices and the names of what made
them, kept when the op failed (``linenames``, on ``atop.Case``). The statement moving the tensor is put before the
statement of the function's body that holds the failing line (so every branch after it gets it), or right before the
failing line's statement when a name is bound again on the way. Proven as the maker's fix would be: at the failing
op, with the operands that maker made on the device of the tensor they meet.
"""

from __future__ import annotations

import ast
import linecache
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._virtual.devexpr import function_at as _function, tree_of as _tree, written_device
from torchdoctor._virtual.linenames import Named
from torchdoctor._virtual.ownline import statements_at
from torchdoctor._virtual.prove import Fix

__all__ = ["made_by", "made_pass", "meet_fix", "runtime_device", "written_follows"]

def runtime_device(file: str, line: int) -> str | None:
    """The expression at the program's ``line`` that decides a device at run time (``mm.intermediate_device()`` in
    ``device=``, ``.to(dev)``), as written; None when the line writes its device out, gives none, or is not read."""
    said = written_device(file, line)
    return said[0] if said is not None and not said[1] else None


def _helper_pick(file: str, line: int) -> bool:
    """The device at the program's ``line`` is what a helper call returns (``mm.intermediate_device()``, a call of
    the app's own), not a parameter of the line's function (whose callers give it: ``callsite``) nor a name."""
    expr = runtime_device(file, line)
    if expr is None or "(" not in expr:
        return False
    tree = _tree(file)
    fn = _function(tree, line) if tree is not None else None
    params = {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)} if isinstance(
        fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
    return expr.split("(", 1)[0].split(".", 1)[0] not in params


def _decided(tags: Sequence[str], literal: bool = False) -> tuple[str, str, str] | None:
    """(the tag, its line, its device expression) of a maker or move among ``tags`` whose device the program decides
    at run time (``literal``: writes out)."""
    from torchdoctor._virtual.origin import LINES

    for t in tags:
        t = t.removeprefix("far ")  # made from it through other ops: its device all the same
        if t.startswith(("factory ", "moved a tensor at ")) and " at " in t:
            at = t.rpartition(" at ")[2]
            file, line = LINES.get(at, ("", 0))
            said = written_device(file, line) if file else None
            if said is not None and said[1] == literal and (literal or "(" in said[0]):  # a helper's pick
                return t, at, said[0]
    return None


def _insert_at(file: str, line: int, names: Sequence[str]) -> int | None:
    """The line to put a statement before: the statement of the function's body holding ``line`` when ``names`` are
    not bound again inside it before the use (in a loop: anywhere in it), else the simple statement at ``line``;
    None when neither can take a statement before it (an ``elif``, a line in the middle of an expression)."""
    tree = _tree(file)
    if tree is None:
        return None
    fn = _function(tree, line)
    outer = next((s for s in fn.body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
    if outer is None:
        return None
    loops = (ast.For, ast.AsyncFor, ast.While)
    rebound = any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in names and
                  (isinstance(outer, loops) or n.lineno < line) for n in ast.walk(outer))
    if not rebound and outer.lineno == _first_line(file, outer):
        return outer.lineno
    inner: Any = ([outer, *statements_at(outer, line)])[-1]
    simple = not isinstance(inner, (ast.If, *loops, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
                                    ast.AsyncFunctionDef, ast.ClassDef))
    return inner.lineno if simple and inner.lineno == _first_line(file, inner) else None


def _first_line(file: str, stmt: ast.stmt) -> int:
    """The statement's line, unless another statement shares it (``a = 1; b = 2``): then 0."""
    text = linecache.getline(file, stmt.lineno)
    return stmt.lineno if stmt.col_offset == len(text) - len(text.lstrip(" \t")) else 0


def meet_fix(key: str, cases: Sequence[Any], target: torch.device) -> Fix | None:
    """The fix of a tensor made by ``key`` (``factory torch.from_numpy at comfy/nodes.py:12``) at the failing op's
    line, moved to the device of the tensor it meets there, when the maker's line is the wrong place (module doc);
    else, when the program has a name for the device its tensors go to, the fix written with that name
    (``devname``); None otherwise."""
    from torchdoctor._virtual.devname import named_fix
    from torchdoctor._virtual.tablefix import table_fix

    return _meet(key, cases, target) or table_fix(key, cases, target) or named_fix(key, cases, target)


def _meet(key: str, cases: Sequence[Any], target: torch.device) -> Fix | None:
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._virtual.origin import IN_SCOPE, LINES

    at = key.rpartition(" at ")[2]
    made_file, made_line = LINES.get(at, ("", 0))
    if made_file and _helper_pick(made_file, made_line):
        return _follows(key, at, cases, target)  # its own device is the program's pick: never written over
    if not made_file or IN_SCOPE.get(at):  # the maker's function holds a tensor to read the device from
        return None
    for c in cases:
        names = getattr(c, "names", ())
        if c.line is None or not names or not own_file(c.line[0]):
            continue
        file, line = c.line
        pair = _pair(c, key, target)
        if pair is None or not pair[0].local:
            continue
        why = _why(made_file, made_line, file, line, pair[1])
        if why is None:
            continue
        return _fix(key, c, pair[0].name, pair[1].name, target, why)
    return None


def _follows(key: str, at: str, cases: Sequence[Any], target: torch.device) -> Fix | None:
    """A maker whose line decides its device at run time (``device=mm.intermediate_device()``) made the tensor the
    op met on the other device: the line is never given a device written out. The tensor it meets follows it where
    they meet when that one's device is written out at its maker (``device='cuda:0'``, the odd one); else it follows
    the tensor it meets there."""
    from torchdoctor._guard.ownfile import own_file

    for c in cases:
        names = getattr(c, "names", ())
        if c.line is None or not names or not own_file(c.line[0]):
            continue
        pair = _pair(c, key, target)
        if pair is None:
            continue
        w, p = pair
        pick = runtime_device(*_line_of(at))
        odd = _decided(p.tags, literal=True)
        if odd is not None and p.local:
            why = (f"{w.name}'s device is the program's pick at run time ({at}: {pick}), {p.name}'s is written out "
                   f"({odd[1]}: {odd[2]}): the one written out follows")
            return _fix(odd[0], c, p.name, w.name, w.device, why, moved=key)
        if w.local:
            why = f"{w.name}'s device is the program's pick at run time ({at}: {pick}), never written over"
            return _fix(key, c, w.name, p.name, target, why)
    return None


def _pair(c: Any, key: str, target: torch.device) -> tuple[Named, Named] | None:
    """(the name at the failing line holding what ``key`` made, off ``target``; a name holding a tensor on
    ``target``), the op's own operands first; None when the line names no such pair, or two makers' tensors."""
    ops = _operands(c)
    operands = {t.partition(" at ")[0][8:] for o in ops for t in o.tags if t.startswith("operand ")}
    shapes = {(o.device, tuple(o.meta.shape)) for o in ops}

    def first(n: Named) -> tuple[bool, bool]:  # the op's own operand, else a tensor of an operand's shape
        return n.name not in operands, (n.device, n.shape) not in shapes

    wrong = sorted((n for n in c.names if key in n.tags and n.device != target), key=first)
    partner = sorted((n for n in c.names if n.device == target and key not in n.tags), key=first)
    if not wrong or not partner or len(wrong) > 1 and first(wrong[0]) == first(wrong[1]):
        return None
    return wrong[0], partner[0]


def _line_of(at: str) -> tuple[str, int]:
    from torchdoctor._virtual.origin import LINES

    return LINES.get(at, ("", 0))


def _operands(c: Any) -> list[Any]:
    from torchdoctor._virtual.feeder import operands

    return operands(c.before)


def _why(made_file: str, made_line: int, file: str, line: int, partner: Named) -> str | None:
    """Why the maker's line is the wrong place (module doc), or None when it is the right one."""
    import os

    from torchdoctor._guard.ownfile import own_file

    tree = _tree(made_file)
    if tree is None:
        return None
    maker = _function(tree, made_line)
    if not isinstance(maker, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None  # made at a module's top level: a global made once, fixed where it is made
    if any("device" in a.arg for a in (*maker.args.args, *maker.args.kwonlyargs)):
        return None  # the maker's function takes a device: the call that left it out is fixed (``callsite``)
    if os.path.realpath(made_file) != os.path.realpath(file) and own_file(made_file):
        return (f"`{maker.name}` ({os.path.basename(made_file)}) returns it as it is to every caller, and a device "
                "at its line would change it for all of them")
    decided = _decided(partner.tags)
    if decided is not None and _function(tree, line) is not maker:
        return (f"{partner.name}'s device is decided at run time ({decided[1]}: {decided[2]}), and "
                f"`{maker.name}` has no tensor to read a device from: a device written at its line is right in one "
                "of the program's modes and wrong in the other")
    return None


def _fix(key: str, c: Any, wrong: str, partner: str, target: torch.device, why: str,
         moved: str | None = None) -> Fix | None:
    """``wrong = wrong.to(partner.device)`` before the failing line's statement (``key``: what made ``wrong``;
    ``moved``: what made the tensor the problem names, when the fix moves the other one)."""
    from torchdoctor._report.diff import line_patch

    file, line = c.line
    ins = _insert_at(file, line, (wrong, partner))
    if ins is None:
        return None
    stmt = f"{wrong} = {wrong}.to({partner}.device)"
    body = linecache.getline(file, ins).strip()
    diff = line_patch(file, ins, f"{stmt}\n{body}")
    if diff is None:
        return None
    said = key[8:] if key.startswith("factory ") else key
    where = c.at or f"{file}:{line}"
    return Fix(f"{stmt}  # at {where}, {wrong} (made by {said}) meets {partner} on {target}: moved there to "
               f"{partner}'s device (this line, put before line {ins}, follows wherever the program puts {partner}); "
               f"{why}", "note", target, sets=((key, target),) + (((moved, target),) if moved else ()), diff=diff)


_MADE_BY = "the tensor made by "


def made_by(message: str, found: str, where: str) -> str | None:
    """``the tensor made by Tensor.cat at nodes.py:8 (on cpu)`` when a problem's message names the op and line that
    made its tensor (a record kept for a real cpu tensor, whose maker is no factory a fix can pass ``device=``)."""
    import re

    hit = re.search(r"a tensor made by (\S+) (?:in .*? )?at (\S+:\d+) ", message)
    if hit is None or found in ("", "?"):
        return None
    return f"{_MADE_BY}{hit.group(1)} at {hit.group(2)} ({where} {found})"


def made_pass(label: str, target: Any) -> str | None:
    """The fix of a tensor ``made_by`` names: at its maker's line or where it meets the op, said as such."""
    from torchdoctor._guard.maps import value_code

    if not label.startswith(_MADE_BY):
        return None
    verb = "cast" if isinstance(target, torch.dtype) else "move"
    return (f"# {label} reached the failing op: {verb} it after that line (tensor.to({value_code(target)})), or "
            f"where it meets the op's other tensors, to their {'dtype' if verb == 'cast' else 'device'}")


def written_follows(message: str, found: str, cases: Sequence[Any]) -> Fix | None:
    """A tensor the problem names by the op and line that made it (``torch.cat`` of images the app made with a
    helper's device, ``mm.intermediate_device()``) meets one whose maker writes its device out (``device='cuda:0'``):
    the one written out follows it where they meet; None when the maker's line (or the lines that bound what it
    combined) picks no device with a helper, or the failing line names no such pair."""
    import os
    import re

    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._virtual.origin import LINES

    hit = re.search(r"a tensor made by (\S+) (?:in .*? )?at (\S+):(\d+) ", message)
    if hit is None:
        return None
    at = f"{hit.group(2)}:{hit.group(3)}"
    file, line = LINES.get(at, (os.path.abspath(hit.group(2)), int(hit.group(3))))
    pick = _picked_before(file, line) if os.path.isfile(file) and own_file(file) else None
    if pick is None:
        return None
    for c in cases:
        names = getattr(c, "names", ())
        if c.line is None or not names or not own_file(c.line[0]):
            continue
        shapes = {(o.device, tuple(o.meta.shape)) for o in _operands(c)}
        wrong = [n for n in names if str(n.device) == found and (n.device, n.shape) in shapes]
        partner = [(n, odd) for n in names if str(n.device) != found and n.local and
                   (odd := _decided(n.tags, literal=True)) is not None]
        if len(wrong) != 1 or len(partner) != 1:
            continue
        (p, odd), w = partner[0], wrong[0]
        why = (f"{w.name} was made by {hit.group(1)} at {at} from tensors whose device the program picks at run "
               f"time ({pick[0]}: {pick[1]}), {p.name}'s is written out ({odd[1]}: {odd[2]}): the one written out "
               "follows")
        return _fix(odd[0], c, p.name, w.name, w.device, why)
    return None


def _picked_before(file: str, line: int) -> tuple[str, str] | None:
    """(``file:line``, the helper call) where ``line`` picks its device with a helper, or a line of its function that
    bound a name ``line`` reads did; None otherwise."""
    import os

    short = os.path.basename(file)
    if _helper_pick(file, line):
        return f"{short}:{line}", runtime_device(file, line) or ""
    tree = _tree(file)
    if tree is None:
        return None
    fn = _function(tree, line)
    here = linecache.getline(file, line).strip().rstrip(":")
    try:
        read = {n.id for n in ast.walk(ast.parse(here)) if isinstance(n, ast.Name)}
    except SyntaxError:
        return None
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and n.lineno < line and any(
                isinstance(t, ast.Name) and t.id in read for t in n.targets) and _helper_pick(file, n.lineno):
            return f"{short}:{n.lineno}", runtime_device(file, n.lineno) or ""
    return None

"""The model's arguments the program parked on the cpu at a line of its own (cached prompt embeddings kept there
between a pipeline's stages: ``{"prompt_embeds": embeds.cpu(), ...}``) and handed to a model on the accelerator: moved
where the program's line calls the model, with the program's own name for the device — the parking kept.

The line is the first of the program's own frames that called the model (``usesite``): the app's ``pipe(...)`` when
the pipeline is a library's, the pipeline's ``self.connectors(...)`` when it is the program's. Each parked argument
is written there as ``<arg>.to(<name>)``: the module-level device pick the function reads (``device = torch.device(
"cuda" if ... else "cpu")``); without one the fix stays as it was. The parking line is never changed: it is what the program wants (memory between stages). One fix for all the
arguments parked so, one diff. Proven at the failing ops with the arguments on the device, and in a re-run by the
call given them so (``operandfix``).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

__all__ = ["placed_fixes"]

_PARKED = ("Tensor.to", "Tensor.cpu")  # the makers of an argument moved to the cpu at the program's line


def placed_fixes(items: list[Fix], main: Any, device: torch.device, problems: Sequence[Any], rec: Any) -> list[Fix]:
    """``items`` with the fixes that pass parked arguments moved replaced by their move at the model's call line
    (module doc), then placed under a model's hooks (``hooked.under_hooks``; ``rec``: the run's recorder, its failing
    ops and the makers of the model's arguments)."""
    from torchdoctor._virtual.hooked import under_hooks

    from torchdoctor._virtual.calldtype import cast_at_call

    try:
        items = _at_call(items, main, rec.entry.made_args, problems)
        items = cast_at_call(items, main)  # an argument cast where the call line casts its siblings
    except Exception:  # a diagnostic never breaks the report: the fixes as they were
        pass
    return under_hooks(items, main, device, [p.path for p in problems if p.kind == "device"], rec.cases.cases)


def _at_call(items: list[Fix], main: Any, made_args: Mapping[str, tuple[str, str, str]],
             problems: Sequence[Any]) -> list[Fix]:
    from torchdoctor._virtual.usesite import use_of

    parked = [f for f in items if f.kind == "input" and isinstance(f.target, torch.device) and f.target.type != "cpu"
              and f.label.startswith("input ") and _parked(f.label, made_args, problems)]
    use = use_of(main) if parked and isinstance(main, torch.nn.Module) else None
    if use is None:
        return items
    fix = _fix(use, parked, all(_unmade(f.label, problems) for f in parked), main)
    if fix is None:
        return items
    first = items.index(parked[0])
    rest = [f for f in items if not any(f is p for p in parked)]
    return rest[:first] + [fix] + rest[first:]


def _parked(label: str, made_args: Mapping[str, tuple[str, str, str]], problems: Sequence[Any]) -> bool:
    """The argument ``label`` names was moved to the cpu at a line of the program's (``embeds.cpu()``): by the
    record of the model's arguments, else by what a problem about it says made it."""
    import re

    if made_args.get(label, ("",))[0] in _PARKED:
        return True
    name = label.partition(" (")[2].rstrip(")")
    said = re.compile(rf"\b{re.escape(name)} \(an argument of the \S+ call, (?:made by Tensor\.(?:to|cpu) at \S+:\d+|"
                      r"made before the run)\)")
    return bool(name) and any(p.kind == "device" and p.found == "cpu" and said.search(p.message) for p in problems)


def _unmade(label: str, problems: Sequence[Any]) -> bool:
    """The argument ``label`` names came from no factory or move the run saw (a library's plain cpu tensor: a
    scheduler's ``timesteps``, iterated by the program): not parked, handed over as it was made."""
    name = label.partition(" (")[2].rstrip(")")
    return bool(name) and any(f"{name} (an argument of the " in p.message and ", made before the run)" in p.message
                              for p in problems if p.kind == "device")


def _fix(use: Any, parked: Sequence[Fix], unmade: bool = False, main: Any = None) -> Fix | None:
    """One fix moving each parked argument at the use's line — or at the line that called the use's function, when
    the use only hands on its own parameters (a pipeline's ``__call__``) — ; None when a line or name is not read."""
    from torchdoctor._virtual.ownline import own_line

    read = own_line(use.file, use.line)
    if read is None:
        return None
    call = next((n for n in ast.walk(read[2]) if isinstance(n, ast.Call) and ast.unparse(n.func) == use.func), None)
    index = [f.label.split(" ", 2)[1] for f in parked]
    if call is None or not all(i.isdigit() and int(i) < len(call.args) for i in index):
        return None
    args = [call.args[int(i)] for i in index]
    roots = {_root(a) for a in args} - {None}
    # an argument made from the same parked name (``unet(latents, enc[None], enc[None])``): its op fails after the
    # first one's, so no fix names it; moved at the call with it
    more = [(i, a) for i, a in enumerate(call.args) if str(i) not in index and _root(a) in roots]
    if more:
        from dataclasses import replace

        from torchdoctor._virtual.callargs import signature_of

        try:
            pos = signature_of(main)[0] if main is not None else ()
        except (TypeError, ValueError):  # no signature: the caller's positions
            pos = ()
        if any(f.label != f"input {i} ({pos[int(i)] if int(i) < len(pos) else ''})" for f, i in zip(parked, index)):
            pos = ()  # the call is not of the model's own forward (a pipeline's): its positions only
        parked = [*parked, *(replace(parked[0], label=f"input {i} ({pos[i]})" if i < len(pos) else f"input {i}")
                             for i, _ in more)]
        args = [*args, *(a for _, a in more)]
    where = (use.file, use.line, use.at, read, args)
    up = _caller(use, args)
    return _written(up or where, parked, use.func, up is None, unmade)


def _caller(use: Any, args: Sequence[ast.expr]) -> tuple[str, int, str, Any, list[ast.expr]] | None:
    """(file, line, ``file:line``, the line read, the arguments there) of the call of the use's function that gave it
    the parked arguments as its own parameters, passed on unchanged; None otherwise."""
    import os

    from torchdoctor._virtual.devexpr import enclosing
    from torchdoctor._virtual.ownline import own_line

    fn = enclosing(use.file, use.line)
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not use.callers or not use.lines or \
            not all(isinstance(a, ast.Name) for a in args):
        return None
    params = [p.arg for p in fn.args.args]
    skip = 1 if params and params[0] in ("self", "cls") else 0
    bound = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    names = [a.id for a in args if isinstance(a, ast.Name)]
    if any(n not in params[skip:] or n in bound for n in names):
        return None
    file, line = use.callers[0].co_filename, use.lines[0]
    read = own_line(file, line)
    if read is None:
        return None
    need = [params.index(n) - skip for n in names]
    calls = [n for n in ast.walk(read[2]) if isinstance(n, ast.Call) and len(n.args) > max(need) and
             not any(isinstance(a, ast.Starred) for a in n.args)]
    if len(calls) != 1:
        return None
    return file, line, f"{os.path.basename(file)}:{line}", read, [calls[0].args[i] for i in need]


def _written(where: tuple[str, int, str, Any, list[ast.expr]], parked: Sequence[Fix], func: str,
             called: bool, unmade: bool = False) -> Fix | None:
    from torchdoctor._report.diff import line_patch

    file, line, at, (raw, body, _), args = where
    from torchdoctor._virtual.devexpr import device_name

    name = device_name(file, line)
    if name is None or not body.isascii():
        return None
    pad, new = len(raw) - len(body), raw
    for a in sorted(args, key=lambda a: a.col_offset, reverse=True):  # from the right: offsets stay valid
        end = pad + int(a.end_col_offset or 0)
        new = new[:end] + f".to({name})" + new[end:] if isinstance(a, (ast.Name, ast.Attribute, ast.Subscript,
                                                                           ast.Call)) else \
            new[:pad + a.col_offset] + f"({ast.unparse(a)}).to({name})" + new[end:]
    diff = line_patch(file, line, new.strip())
    if diff is None:
        return None
    target = parked[0].target
    shown = ", ".join(f"{body[a.col_offset:a.end_col_offset]}.to({name})" for a in args)
    simple = [ast.unparse(a) for a in args if isinstance(a, ast.Name)]
    how = f"handed to {func} at {at}" if called else f"handed on at {at} to {func}"
    labels = ", ".join(f.label for f in parked)
    one = len(parked) == 1
    said = (f"# {labels}: on the cpu{_came_from(file, line, simple)} and {how} as {'it is' if one else 'they are'}: "
            f"move {'it' if one else 'them'} there ({shown})") if unmade else (
        f"# {labels}: parked on the cpu by the program and {how} as they are: move them there ({shown}); where "
        "they are parked stays as it is")
    return Fix(said, "note", target,
               sets=tuple((f.label, target) for f in parked), diff=diff,
               reoperand=(file, line, simple[0], None, target) if called and len(simple) == 1 else None)


def _came_from(file: str, line: int, names: Sequence[str]) -> str:
    """``", taken from sched.timesteps at app.py:20"``: where the program's function got the one argument ``names``
    holds (the loop or assignment before ``line`` that binds it); "" when it cannot be read."""
    import os

    from torchdoctor._virtual.devexpr import enclosing, tree_of

    if len(names) != 1:
        return ""
    fn = enclosing(file, line)
    scope = fn if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else tree_of(file)
    found = None
    for n in ast.walk(scope) if scope is not None else ():
        if getattr(n, "lineno", line) >= line:
            continue
        if isinstance(n, (ast.For, ast.AsyncFor)) and isinstance(n.target, ast.Name) and n.target.id == names[0]:
            hit = n.iter
        elif isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == names[0] for t in n.targets):
            hit = n.value
        else:
            continue
        if found is None or n.lineno > found[1]:
            found = (hit, n.lineno)
    if found is None:
        return ""
    text = ast.unparse(found[0])
    return f", taken from {text if len(text) <= 60 else text[:57] + '...'} at {os.path.basename(file)}:{found[1]}"


def _root(node: ast.expr) -> str | None:
    """The name an argument expression is read from (``enc`` of ``enc[None]``, ``enc.unsqueeze(0)``), or None."""
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None

"""A component the program moves itself to a device it picked once, at module level (a ComfyUI node's
``device = "cuda" if torch.cuda.is_available() else "cpu"``: on an XPU or a Mac that is the cpu), while the rest of
the run is on the accelerator: a move of its tensors is undone by that line and the inputs it is given are moved
there too, so the fix is where the device is picked (a diff: the accelerator torch finds, any kind), proven by a
re-run with that module-level name set to the run's device."""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

__all__ = ["device_line_fix", "reglobals"]

_PICK = 'torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"'


_Move = tuple[Any, torch.device, str, int, str, dict[str, Any]]  # a module, its device, file, line, at, globals


def device_line_fix(f: Fix, moves: Sequence[_Move], root: Any) -> Fix | None:
    """``f`` (moves of tensors to the run's device) replaced by the module-level device pick the program moved
    their module with, fixed (a diff); None when the tensors' module was not moved by such a name."""
    from torchdoctor._report.diff import line_patch

    if f.kind != "path" or not f.sets or not moves or not isinstance(root, torch.nn.Module):
        return None
    targets = {t for _, t in f.sets}
    if len(targets) != 1 or not isinstance(want := next(iter(targets)), torch.device) or want.type == "cpu":
        return None
    found_by = [_moved_by(path, moves, root) for path, _ in f.sets]
    hits = [h[1] if h is not None else None for h in found_by]
    hit = hits[0]
    if hit is None or any(h is None or h[:4] != hit[:4] for h in hits):
        return None
    was, file, line, at, names = hit
    comps = {h[0] for h in found_by if h is not None}
    if was.type == want.type:
        return None
    found = _global_pick(file, line)
    if found is None:
        return None
    name, def_line, raw, value, uses = found
    if name not in names:
        return None
    new = raw[:value[0]] + _PICK + raw[value[1]:]
    diff = line_patch(file, def_line, new.strip())
    if diff is None:
        return None
    short = at.rsplit(":", 1)[0]
    return Fix(f"# {at} moves its component to {name} = {raw[value[0]:value[1]]} ({short}:{def_line}), which is "
               f"{was.type} here while the run is on {want}: pick the device torch finds, any kind "
               f"({name} = {_PICK}; it is read when the module is imported)", "note", want, diff=diff,
               reglobal=(names, name, want.type), sets=(*((c + "." if c else "*", want) for c in sorted(comps)), *(
                   (f"moved a tensor at {short}:{n}", want) for n in uses)))  # what it moves there, judged at the op


def _moved_by(path: str, moves: Sequence[_Move], root: torch.nn.Module
              ) -> tuple[str, tuple[torch.device, str, int, str, dict[str, Any]]] | None:
    """The program's last move of the module holding ``path`` (or of a module above it, the model itself too:
    ``net = nn.Sequential(...).to(device)``)."""
    parts = path.split(".")
    for i in range(len(parts) - 1, -1, -1):
        try:
            mod = root.get_submodule(".".join(parts[:i]))
        except AttributeError:
            continue
        hit = next((m[1:] for m in reversed(moves) if m[0]() is mod), None)
        if hit is not None:
            return ".".join(parts[:i]), hit
    return None


def _global_pick(file: str, line: int) -> tuple[str, int, str, tuple[int, int], tuple[int, ...]] | None:
    """(the name, its line, the line's text, the value's span) when the move at ``line`` passes a module-level name
    whose value asks ``torch.cuda.is_available()``."""
    try:
        with open(file, encoding="utf-8") as fh:
            text = fh.read()
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    lines = text.split("\n")
    names = {n.id for c in ast.walk(tree) if isinstance(c, ast.Call) and c.lineno == line and
             isinstance(c.func, ast.Attribute) and c.func.attr == "to" for n in c.args if isinstance(n, ast.Name)}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id in names and node.lineno == node.end_lineno and \
                "cuda.is_available()" in ast.unparse(node.value) and lines[node.lineno - 1].isascii():
            raw, name = lines[node.lineno - 1], node.targets[0].id
            uses = tuple(sorted({c.lineno for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(
                c.func, ast.Attribute) and c.func.attr == "to" and any(isinstance(a, ast.Name) and a.id == name
                                                                       for a in c.args)}))
            return name, node.lineno, raw, (node.value.col_offset, int(node.value.end_col_offset or 0)), uses
    return None


@contextlib.contextmanager
def reglobals(fixes: Sequence[Fix]) -> Iterator[None]:
    """While a re-run runs: each module-level device name a fix rewrites holds the run's device, as the rewritten
    line would pick it; put back after."""
    saved: list[tuple[dict[str, Any], str, Any]] = []
    for f in fixes:
        if f.reglobal is not None and f.reglobal[1] in f.reglobal[0]:
            names, name, value = f.reglobal
            saved.append((names, name, names[name]))
            names[name] = value
    try:
        yield
    finally:
        for names, name, value in reversed(saved):
            names[name] = value

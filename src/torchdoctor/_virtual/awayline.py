"""A model the program itself moved away from the run's device, in place, at a line of its own code: a checkpoint
saved with ``torch.save(model.cpu().state_dict(), f)`` mid-training moves the live model to the CPU
(``Module.cpu()`` and ``Module.to`` move the module, not a copy), and the next step meets inputs on the device. The
fix is that line: the state dict copied to the CPU without moving the model (``{k: v.cpu() for k, v in
model.state_dict().items()}``), as a diff; another move at such a line is named in the fix, which moves the model
back after it. Proven at the failing ops as the move is: with the model left on the device, its tensors are there.
"""

from __future__ import annotations

import ast
import linecache
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._virtual.prove import Fix


def away_fix(f: Fix, casts: Any, root: Any, used: list[Fix] | None = None) -> Fix | None:
    """``f`` (a move of model tensors to one device) fixed at the program's line that last moved their module to
    another device type (``casts``: the run's ``modcast.Casts``); None when no such line is on record. Where that
    line is an offloading mechanism's (a manager's free-memory call, an accelerate hook), the fix is written where
    the program uses the model (``offloaduse``) and joins ``used``."""
    from torchdoctor._placement import device_str

    if f.kind != "path" or not f.sets or not isinstance(root, torch.nn.Module) or \
            len({t for _, t in f.sets}) != 1 or not isinstance(f.sets[0][1], torch.device):
        return None
    target: torch.device = f.sets[0][1]
    names = {id(m): n for n, m in root.named_modules()}
    hit = None
    for x in reversed(casts.moves):
        m = x[0]()
        if m is None or id(m) not in names:
            continue
        prefix = names[id(m)] + "." if names[id(m)] else ""
        if x[1].type == target.type and "_hf_hook" in vars(m):
            continue  # an offload hook's own onload: the program's away move is before it
        if all(n.startswith(prefix) or n == "*" for n, _ in f.sets):  # the last move of a module holding them:
            hit = (m, names[id(m)], x) if x[1].type != target.type else None  # one that brought them there is no
            break  # away move (what changed them since is another line: a ``.data =`` on the cpu)
    if hit is None:
        return None
    _, path, (_, went, file, line, at, _) = hit
    from torchdoctor._guard.maps import code_path
    from torchdoctor._virtual.prove import Fix

    name = code_path(path) if path else "model"
    saved = _saved_line(file, line)
    if saved is not None:
        return Fix(f"# {at} moves {saved[3]} to {device_str(went)} in place to save it ({saved[0]}: Module.cpu() moves the "
                   f"module, not a copy), and the run then meets it on {device_str(target)}: copy the state dict to "
                   f"the cpu instead: {saved[1]}", "note", target, sets=f.sets, diff=saved[2])
    from torchdoctor._virtual.keptplace import built_and_placed
    from torchdoctor._virtual.offloaduse import use_fix

    # a module the program built there on purpose is no offload: kept there (``handover``, ``keptplace``)
    at_use = use_fix(f, casts, root) if built_and_placed(file, line) is None else None
    if at_use is not None:
        if used is not None:
            used.append(at_use)
        return at_use
    f.code += f"  # moved to {device_str(went)} in place at {at}: move it back after that line"
    return f


def _saved_line(file: str, line: int) -> tuple[str, str, str, str, str] | None:
    """(the call as written, its copying form, the line's diff, the module as the line names it, the line rewritten)
    of ``X.cpu().state_dict()`` (or ``X.to("cpu")``, ``X.half()``) alone on the program's line; None otherwise."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch

    if not own_file(file):
        return None
    raw = linecache.getline(file, line).rstrip("\r\n")
    body = raw.lstrip(" \t")
    if not body.isascii():
        return None
    try:
        tree = ast.parse(body)
    except SyntaxError:
        return None
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
            n.func.attr == "state_dict" and (_to_cpu(n.func.value) or _cast(n.func.value) is not None)]
    if len(hits) != 1 or hits[0].end_col_offset is None:
        return None
    call = hits[0]
    inner: Any = call.func.value  # type: ignore[attr-defined]  # ``X.cpu()``, ``X.half()``
    holder = ast.unparse(inner.func.value)
    args = ", ".join(ast.unparse(a) for a in [*call.args, *call.keywords])
    each = ".cpu()" if _to_cpu(inner) else _cast(inner)
    copy = f"{{k: v{each} for k, v in {holder}.state_dict({args}).items()}}"
    pad = len(raw) - len(body)
    new = raw[:pad + call.col_offset] + copy + raw[pad + int(call.end_col_offset or 0):]
    diff = line_patch(file, line, new.strip())
    end = pad + int(tree.body[0].end_col_offset or 0) + len(copy) - (int(call.end_col_offset or 0) - call.col_offset)
    return (ast.unparse(call), copy, diff, holder, new[:end].strip()) if diff is not None else None  # (no comment)


def saved_copy(file: str, line: int) -> tuple[str, str, str, str, str] | None:
    """``_saved_line``'s answer for a cast or move of the live model made only to save it (``model.half().state_dict()``):
    (the call, its copying form, the diff, the module's name, the line rewritten), or None."""
    return _saved_line(file, line)


_CASTS = {"half": ".half()", "bfloat16": ".bfloat16()", "float": ".float()"}


def _cast(node: Any) -> str | None:
    """``.half()`` for ``X.half()`` (and ``X.to(torch.float16)``: ``.to(torch.float16)``): a module's cast, as each
    tensor of a copied state dict takes it; None otherwise."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    if node.func.attr in _CASTS and not node.args and not node.keywords:
        return _CASTS[node.func.attr]
    text = ast.unparse(node.args[0]) if node.func.attr == "to" and len(node.args) == 1 and not node.keywords else ""
    return f".to({text})" if text.startswith("torch.") and text[6:] in ("float16", "half", "bfloat16", "float32") \
        else None


def _to_cpu(node: Any) -> bool:
    """``X.cpu()`` or ``X.to("cpu")`` / ``X.to(torch.device("cpu"))``."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    if node.func.attr == "cpu" and not node.args:
        return True
    text = ast.unparse(node.args[0]) if node.func.attr == "to" and len(node.args) == 1 else ""
    return text in ("'cpu'", '"cpu"', "torch.device('cpu')")

"""``ValueError: Attempting to unscale FP16 gradients.``: a GradScaler met float16 gradients, because the parameters
being trained are float16 themselves (the model was cast: ``model.half()``, ``.to(torch.float16)``). Explained with
those parameters by path, the line that cast the model when the user's frames show it, and the fix mixed precision
means: float32 master weights, float16 compute under autocast (or bfloat16 with no scaler).
"""

from __future__ import annotations

import ast
import os
import types
from typing import Any

import torch

_CASTS = {"half", "to", "type"}


def explain_scaler(session: Any, exc: BaseException, tb: types.TracebackType | None) -> Any:
    """The report (a ``PlacementError``) of a GradScaler refusing float16 gradients, or None for any other error."""
    if "unscale FP16 gradients" not in str(exc):
        return None
    from torchdoctor._guard.frames import user_frames
    from torchdoctor._report.model import PlacementError, Problem
    from torchdoctor._report.text import format_error
    from torchdoctor._rules import registry as _rules

    g = session.g
    model = g.model if isinstance(g.model, torch.nn.Module) else (
        session.frames.ran[0] if session.frames.ran else None)
    if not isinstance(model, torch.nn.Module):
        return None
    half = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.dtype == torch.float16]
    if not half:
        return None
    frames = user_frames(exc.__traceback__ or tb)
    cast = _cast_line(frames, model)
    var = cast[2] if cast else "model"
    head = (f"dtype problem outside the guarded model: GradScaler met float16 gradients because {len(half)} trained "
            f"parameter{'s are' if len(half) != 1 else ' is'} float16 themselves")
    lines = [f"culprit {n}: {_rules._compact(p)}  (trained in float16: expected float32 master weights)" for n, p in half[:3]]
    if len(half) > 3:
        lines.append(f"... and {len(half) - 3} more float16 parameters")
    if cast is not None:
        lines.append(f"the model was cast to float16 at {os.path.basename(cast[0])}:{cast[1]} (`{cast[3]}`)")
    lines.append(_prove([p for _, p in half]))
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lines.append(f"original error: {type(exc).__name__}: {first}")
    fix = (f"{var}.float()  # float32 master weights; keep `with torch.autocast(..., dtype=torch.float16)` around the "
           "forward and the GradScaler\n# or train in bfloat16 with no GradScaler: "
           f"{var}.to(torch.bfloat16)")
    problems = [Problem("dtype", n, "parameter", "float16", "float32", f"{n} is trained in float16: GradScaler "
                        "needs float32 master weights (autocast computes in float16)") for n, _ in half]
    err = PlacementError(format_error(head, lines, fix), module_path=None, module_type=None, op=None,
                         problems=problems, fix=fix)
    from torchdoctor._guard.remedy import with_patch

    return with_patch(err, None, lines)


def _prove(params: list[torch.Tensor]) -> str:
    """The fix tried on copies: a fresh GradScaler unscales float32 copies of the parameters and their gradients
    (the float32 master weights), and still refuses the float16 ones (the failure is the one explained)."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return "fix unproven: not re-run (the float16 parameters hold no gradients to unscale)"
    dev = with_grad[0].device

    def unscale(dtype: torch.dtype) -> BaseException | None:
        copies = []
        for p in with_grad:
            c = p.detach().to(dtype).requires_grad_()
            c.grad = p.grad.detach().to(dtype)  # type: ignore[union-attr]
            copies.append(c)
        scaler = torch.amp.GradScaler(dev.type)
        scaler.scale(torch.ones((), device=dev))  # the scale a training step's scaler.scale(loss) made
        try:
            scaler.unscale_(torch.optim.SGD(copies, lr=0.0))
        except (ValueError, RuntimeError) as err:
            return err
        return None

    try:
        with torch.no_grad():
            again, fixed = unscale(torch.float16), unscale(torch.float32)
    except Exception as err:  # a device this process cannot run (a virtual one): said, never claimed
        first = str(err).strip().splitlines()[0][:120] if str(err).strip() else ""
        return f"fix unproven: not re-run ({type(err).__name__}: {first})"
    n = f"{len(with_grad)} parameter{'s' if len(with_grad) != 1 else ''}"
    if fixed is not None:
        return f"fix unproven: GradScaler.unscale_ of float32 copies of the {n} raised {type(fixed).__name__}: {fixed}"
    return (f"fix proven: a GradScaler unscales float32 copies of the {n} and their gradients (float32 master "
            "weights)" + (", and refuses the float16 ones as the program's did" if again is not None else ""))


def _cast_line(frames: list[Any], model: torch.nn.Module) -> tuple[str, int, str, str] | None:
    """(file, line, the model's name, source) of ``<name>.half()`` / ``<name>....to(<float16>)`` in a user frame
    whose local ``<name>`` is the model, read from the frame's parsed code (nothing is run)."""
    from torchdoctor._guard.maker import _parsed as parsed_code

    for frame in reversed(frames):
        names = [n for n, v in frame.f_locals.items() if v is model]
        parsed = parsed_code(frame.f_code) if names else None
        if parsed is None:
            continue
        tree, off, path, lines = parsed
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CASTS):
                continue
            root: Any = node.func.value
            while isinstance(root, (ast.Call, ast.Attribute)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if not (isinstance(root, ast.Name) and root.id in names):
                continue
            if node.func.attr == "half" or any(_float16(a, frame) for a in [*node.args, *(
                    k.value for k in node.keywords if k.arg == "dtype")]):
                src = lines[node.lineno - 1].strip() if node.lineno - 1 < len(lines) else ""
                return path, node.lineno + off, root.id, src
    return None


def _float16(node: ast.expr, frame: Any) -> bool:
    """Does this argument name float16 (``torch.float16``, ``torch.half``, a local or global holding it)?"""
    text = ast.unparse(node)
    if text in ("torch.float16", "torch.half"):
        return True
    if isinstance(node, ast.Name):
        v = frame.f_locals.get(node.id, frame.f_globals.get(node.id))
        return v is torch.float16
    return False

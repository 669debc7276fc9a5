"""strict (and fix / warn) at an op whose operand a forward made in a dtype it took from the caller's own argument
(a timestep embedding that returns in ``t.dtype``, fed ``t = torch.from_numpy(sigmas * 1000)``: float64 into a
bf16 model): the argument is where the dtype entered, as explain says after the error. Named as the caller passed it
(``input 1 (an argument of the PeftModel call)``), with the line of the caller's code that made it, and the fix at
that line (``caller_fix``), proven by running the whole forward again on a copy with that argument cast. None when no
argument of the call holds the operand's dtype, or that line cannot be written."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._guard.remedy import Aim

__all__ = ["entered_aim"]


def entered_aim(session: Any, made: list[tuple[str, torch.Tensor]], root: Any, maps: Any, target: torch.dtype,
                said: Sequence[str] = ()) -> Aim | None:
    """The caller's arguments in the dtype of the operands ``made`` in a forward (or given as they are), their
    makers and the fix at the line that made them; None when there is none to aim at. ``said``: the report's lines
    already naming a maker, not said twice."""
    from torchdoctor._guard import component
    from torchdoctor._guard.provenance import call_arguments, call_owner, running_frames
    from torchdoctor._guard.remedy import caller_fix, caller_makers
    from torchdoctor._placement import compact, dtype_str

    wrong = {t.dtype for _, t in made if isinstance(t, torch.Tensor) and t.is_floating_point()}
    if not wrong or maps is None or not isinstance(root, torch.nn.Module):
        return None
    try:
        frames = running_frames()
        args, owner = call_arguments(frames, root), call_owner(frames, root)
        given = tuple(session.frames.inputs_of(root))
    except Exception:  # the caller's arguments are extra: the op's own report stands without them
        return None
    held = [(n, t) for n, t in args.values() if isinstance(t, torch.Tensor) and t.is_floating_point()
            and t.dtype in wrong and any(t is x for x in given)]
    if not held:
        return None
    lines = [f"culprit {n} (an argument of the {owner} call): {compact(t.dtype, tuple(t.shape), t.device)}  "
             f"(expected {dtype_str(target)})" for n, t in held]
    makers = caller_makers(held, "dtype", inside=maps.modules)
    lines += [f"{label} {m.describe()}" for label, m in makers]
    lines = [x for x in lines if x not in said and x.replace("culprit ", "", 1) not in said]
    at = caller_fix(makers, target, maps.modules, maps.dicts)
    if at is None:
        return None
    tried = f"{', '.join(n for n, _ in held)} -> {dtype_str(target)}"
    proof = component.prove_whole(session, root, lambda m: None, tried, (held[0][1].dtype, target))
    if proof is None or not proof.startswith("fix proven"):
        return None  # the op's own fix stands (its proof at the op)
    return Aim(lines, at.code, at.patch, proof, [m for _, m in makers])

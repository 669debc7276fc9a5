"""A component left in float32 in a reduced-precision pipeline or model (a ControlNet beside a bf16 UNet): the
component is the culprit, not the data its neighbours feed it. Said the same way by explain and strict mode, with the
fix that loads or casts the component, proven before it is printed.

The proof runs the failing piece in the component's new dtype on what it was fed: in strict mode the failing op on
its float32 operands cast down (new tensors); in explain mode a copy of the failing module (the innermost, small)
cast down and called on its inputs. Neither touches the user's component.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from torchdoctor._guard.maps import component_fix
from torchdoctor._guard.proof import prove
from torchdoctor._placement import dtype_str
from torchdoctor._report.model import Problem


def var_for(root: Any) -> str:
    """The name a pasted fix uses for the guarded object: ``pipe`` for a pipeline, else ``model``."""
    return "model" if root is None or isinstance(root, nn.Module) else "pipe"


def blame(odd: tuple[str, torch.dtype], lines: Sequence[str], root: Any, dicts: Collection[str],
          mpath: str | None, mtype: str | None, op: str | None) -> tuple[list[str], str, Problem]:
    """(report lines with the component first and its inputs as what fed it, the fix, the component's problem)."""
    comp, want = odd
    name = comp or "<root>"
    whole = "pipeline" if var_for(root) == "pipe" else "model"
    first = (f"culprit `{name}`: computes in float32 while the rest of the {whole} feeds it {dtype_str(want)} "
             f"(the component is the odd one out, not its inputs)")
    rest = ["fed to it: " + x[len("culprit "):].split("  (expected")[0] if x.startswith("culprit ") else x
            for x in lines]
    problem = Problem("dtype", name, "component", "float32", dtype_str(want),
                      f"`{name}` is float32 in a {dtype_str(want)} {whole}; load or cast it in {dtype_str(want)}",
                      op=op, module_path=mpath, module_type=mtype)
    fix = component_fix(comp, want, dicts).replace("model", var_for(root), 1)
    return [first, *rest], fix, problem


def prove_op(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], tensors: Mapping[Any, Any], want: Any,
             op: Any) -> str:
    """strict: the failing op with the component's float32 operands cast to ``want``."""
    keys = [k for k, t in tensors.items() if isinstance(t, torch.Tensor) and t.dtype == torch.float32]
    return prove(func, args, kwargs, [(None, want, keys)], tensors, op)


def prove_module(mod: Any, inputs: Sequence[Any], want: torch.dtype) -> str:
    """explain: a copy of the failing module, cast to ``want``, called on the inputs it failed on."""
    label = type(mod).__name__
    if not isinstance(mod, nn.Module) or not inputs:
        return "fix unproven: the failing module's inputs are not known"
    try:
        trial = copy.deepcopy(mod).to(want)
        with torch.no_grad():
            trial(*inputs)
    except Exception as exc:  # the trial's own failure is the answer, never a crash of the report
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"fix unproven: a copy of {label} cast to {dtype_str(want)}: {type(exc).__name__}: {first}"[:400]
    return f"fix proven: a copy of {label} cast to {dtype_str(want)} runs on the inputs it failed on"

"""Optimizer state against its parameters: Adam's ``exp_avg`` / ``exp_avg_sq`` must sit on the parameter's device
in its dtype, or the next ``step()`` raises (a model moved or cast without its optimizer). Scalars (``step``) are
kept on the cpu in float32 by design. Read through builtin dict/list methods only (no user code runs)."""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._placement import compact, device_str, dtype_str, same_device
from torchdoctor._report.model import Problem
from torchdoctor._walk import Walk


def optimizers(obj: Any) -> list[tuple[str, torch.optim.Optimizer]]:
    """The optimizers ``obj`` is or holds at its top level (a dict, list, tuple or plain object's attributes)."""
    if isinstance(obj, torch.optim.Optimizer):
        return [("", obj)]
    if isinstance(obj, dict):
        items: Any = dict.items(obj)
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif not isinstance(obj, (torch.nn.Module, torch.Tensor)):
        try:
            items = dict.items(object.__getattribute__(obj, "__dict__"))
        except (AttributeError, TypeError):
            return []
    else:
        return []
    return [(str(k), v) for k, v in items if isinstance(v, torch.optim.Optimizer)]


def optimizer_problems(obj: Any, w: Walk) -> list[Problem]:
    found = optimizers(obj)
    if not found:
        return []
    paths = {id(e.tensor): e.path for e in w.entries if e.alias_of is None}
    problems = []
    for _, opt in found:
        state = object.__getattribute__(opt, "__dict__").get("state")
        if not isinstance(state, dict):
            continue
        for p, st in dict.items(state):
            if not isinstance(p, torch.Tensor) or not isinstance(st, dict):
                continue
            for key, v in dict.items(st):
                if not isinstance(v, torch.Tensor) or v.dim() == 0 or id(v) not in paths:
                    continue  # scalars (step) stay on the cpu on purpose
                path, c = paths[id(v)], _compact(v)
                where = f"its parameter {_compact(p)}"
                if not same_device(v.device, p.device) and v.device.type != "meta":
                    problems.append(Problem(
                        "device", path, "container", device_str(v.device), device_str(p.device),
                        f"optimizer state '{key}' {c} is on {device_str(v.device)} but {where} is on "
                        f"{device_str(p.device)}: the next step() raises. Move the optimizer with the model: "
                        f"torchdoctor.move(model, ..., optimizer=opt)", tensors=(c,)))
                elif v.is_floating_point() and p.is_floating_point() and v.dtype != p.dtype:
                    problems.append(Problem(
                        "dtype", path, "container", dtype_str(v.dtype), dtype_str(p.dtype),
                        f"optimizer state '{key}' {c} is {dtype_str(v.dtype)} but {where} is {dtype_str(p.dtype)}: "
                        f"the next step() raises. Cast the optimizer with the model: "
                        f"torchdoctor.move(model, ..., optimizer=opt)", tensors=(c,)))
    return problems


def _compact(t: torch.Tensor) -> str:
    return compact(t.dtype, tuple(t.shape), t.device)


__all__ = ["optimizer_problems", "optimizers"]

"""TorchScript constants: a tensor ``torch.jit.trace`` baked into a module's code (a plain attribute the forward
read while tracing) lives in the graph, not in any parameter, buffer or attribute the walk can reach, and ``.to()``
never moves it. Read from the inlined graph of each TorchScript module the walk met at its top (read, never run)."""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._placement import compact, device_str
from torchdoctor._report.model import Problem


def _constants(mod: Any) -> list[torch.Tensor]:
    """The tensor constants (more than a scalar: a CPU scalar meets any device) of ``mod``'s inlined code."""
    try:
        graph: Any = getattr(mod, "inlined_graph")
        nodes = list(graph.nodes())
    except Exception:  # code that cannot be inlined: nothing read, nothing claimed
        return []
    out = []
    for node in nodes:
        try:
            if node.kind() != "prim::Constant" or node.output().type().kind() != "TensorType":
                continue
            t = node.t("value")
        except RuntimeError:
            continue
        if isinstance(t, torch.Tensor) and t.dim() > 0 and t.device.type != "meta":
            out.append(t)
    return out


def constant_problems(policy: Any) -> list[Problem]:
    """A constant on another device than its TorchScript module is expected on."""
    scripted = [(p, m) for p, m in policy.w.modules if isinstance(m, torch.jit.ScriptModule)]
    if not scripted:
        return []
    out: list[Problem] = []
    done: list[str] = []
    for path, mod in scripted:
        if any(path == d or path.startswith(d + ".") or not d for d in done):
            continue  # an inner module's code is inlined into its parent's
        done.append(path)
        comp, _, hook = policy.ctx(path)
        want = policy.device or hook or (comp.device if comp is not None else None)
        if want is None or want.type == "meta":
            continue
        kind = type(mod).__name__
        for t in _constants(mod):
            if t.device == want:
                continue
            name = f"{path or '<root>'}.<constant>"
            shown = compact(t.dtype, tuple(t.shape), t.device)
            out.append(Problem(
                "device", name, "attribute", device_str(t.device), device_str(want),
                f"{name} {shown} is a constant of the TorchScript module `{path or '<root>'}` ({kind}): torch.jit.trace "
                f"baked it into the code on {device_str(t.device)}, and `.to()` never moves a constant, so it meets the "
                f"inputs on {device_str(want)}; register it as a buffer (self.register_buffer(...)) before tracing, or "
                f"trace on {device_str(want)}", None, path, kind, (shown,)))
    return out


__all__ = ["constant_problems"]

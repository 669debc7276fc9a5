"""What other verbs read from the placement policy: the dtype guard aligns an op to per module, and which peft
adapters are kept fp32 (move's plan leaves them so)."""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._scan.intent import judged_float
from torchdoctor._scan.policy import Policy
from torchdoctor._walk import Walk

_F32 = torch.float32


class Expectations:
    """The dtype guard aligns one op's tensors to, per module path, as the policy decides it for that module's
    weights. Devices stay guard's own: it reads virtual devices (``simulate``) that scan does not."""

    def __init__(self, w: Walk) -> None:
        self.policy = Policy(w, None, None, False)
        self._by_module: dict[str, torch.dtype | None] = {}
        for e, info in self.policy.canon:
            if info.role == "parameter" and judged_float(e.tensor) and e.module_path not in self._by_module:
                d = self.policy.decide(e)
                self._by_module[e.module_path] = d.dtype if d.dtype_ok(e.tensor.dtype) else d.dtype

    def dtype(self, module_path: str) -> torch.dtype | None:
        hit = self._by_module.get(module_path, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        comp = self.policy.ctx(module_path)[0]
        return comp.dtype if comp is not None else None




def adapters_kept_fp32(w: Any) -> dict[str, bool]:
    """Path -> True for tensors of peft adapters that are float32 throughout (kept as peft made them)."""
    if not any(type(m).__module__.startswith("peft.") for _, m in w.modules):
        return {}
    policy = Policy(w, None, None, False)
    groups: dict[tuple[str, str], list[torch.Tensor]] = {}
    for e in w.canonical():
        key = policy.adapter_of.get(e.path)
        if key is not None and e.tensor.is_floating_point():
            groups.setdefault(key, []).append(e.tensor)
    fp32 = {k for k, ts in groups.items() if all(t.dtype == _F32 for t in ts)}
    return {p: k in fp32 for p, k in policy.adapter_of.items()}

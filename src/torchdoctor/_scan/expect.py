"""What guard reads from the placement policy: the dtype it aligns an op to, per module (move reads the same
decisions through ``torchdoctor._scan.casts.cast_target``)."""

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
            if info[1] == "parameter" and judged_float(e.tensor) and e.module_path not in self._by_module:
                d = self.policy.decide(e)
                self._by_module[e.module_path] = d.dtype if d.dtype_ok(e.tensor.dtype) else d.dtype

    def dtype(self, module_path: str) -> torch.dtype | None:
        hit = self._by_module.get(module_path, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        comp = self.policy.ctx(module_path)[0]
        return comp.dtype if comp is not None else None

"""The pytest marker's CPU dtype check (``@pytest.mark.simulate("cpu", dtype="float16")``) runs the test body once,
in place: a plain float32 attribute that promotes an op out of float16 is named by path and gets a cast proven at
that op (hunt O1), as ``simulate(device="cpu")`` proves its own by a re-run."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchdoctor._virtual.cpudtype import Calls, Checks, proven_at_op
from torchdoctor._virtual.prove import fix_text
from torchdoctor._walk import walk


class Spec(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.scale = nn.Linear(16, 16), torch.full((16,), 0.5)  # a plain attribute: .to never casts it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def _checked(m: nn.Module) -> Checks:
    found = walk(m)
    stack: list[Any] = []
    checks = Checks(torch.float16, {id(e.tensor): (e.path, e.role) for e in found.entries}, stack,
                    {id(x): p for p, x in found.modules})
    pre = torch.nn.modules.module.register_module_forward_pre_hook(lambda mod, a: stack.append(mod))
    post = torch.nn.modules.module.register_module_forward_hook(lambda mod, a, o: stack.pop() and None)
    try:
        with checks, Calls(checks):
            m(torch.randn(2, 16, dtype=torch.float16))
    finally:
        pre.remove()
        post.remove()
    return checks


def test_a_promoting_attribute_is_named_and_its_cast_proven_at_the_op() -> None:
    m = Spec().to("cpu", torch.float16)
    checks = _checked(m)
    assert [(p.kind, p.path) for p in checks.problems] == [("dtype", "scale")]
    assert fix_text(proven_at_op(checks)) == [
        "Fix:", "    model.scale.data = model.scale.data.to(torch.float16)",
        "    # fix proven (at the failing op aten.mul.Tensor: with scale cast, it computes in float16)"]
    assert m.scale.dtype == torch.float32  # the proof never touches the model
    m.scale = m.scale.half()  # the fix applied: quiet
    assert _checked(m).problems == [] and proven_at_op(_checked(m)) == []

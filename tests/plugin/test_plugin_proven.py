"""The pytest marker's failure says whether its fix was proven at the failing op (issue 41 point 1), and a silent
promotion fails a marked test by path (issue 42 point 3)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

PROMOTES = """
import pytest, torch
from torch import nn

class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.ones(4)

    def forward(self, x):
        return self.lin(x) * self.scale

@pytest.mark.simulate(device="cuda:0", dtype="bfloat16")
def test_sim():
    m = Scaled().to("cuda:0", torch.bfloat16)
    m.scale = m.scale.to("cuda:0")
    m(torch.ones(2, 4, device="cuda:0", dtype=torch.bfloat16))
"""


def test_a_marked_test_fails_on_a_silent_promotion_with_its_fix_proven_at_the_op(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_promotes=PROMOTES)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore",
                                           timeout=600)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*dtype scale *surfaced at aten.mul.Tensor: scale f32?4?@cuda:0 is float32 while aten.mul.Tensor computes in "
        "bfloat16 and promotes it to float32 silently*",  # ? for the brackets, which fnmatch reads as a class
        "*model.scale.data = model.scale.data.to(torch.bfloat16)",
        "*# fix proven (at the failing op aten.mul.Tensor at test_promotes.py:11: *",
    ])
    assert "fix unproven" not in result.stdout.str()

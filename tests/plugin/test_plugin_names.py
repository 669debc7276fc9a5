"""A failing test's fix is written with the names the test holds: ``m.scale`` where the test calls its model ``m``,
so pasting it into the test runs (hunt: the plugin's fix said ``model.`` for a model the test named otherwise)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import torch, torch.nn as nn

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.ones(4)  # a plain float32 attribute: .to(bfloat16) leaves it
    def forward(self, x):
        return self.lin(x) * self.scale

def test_named_m():
    m = M().to(torch.bfloat16)
    m(torch.randn(2, 4, dtype=torch.bfloat16))

def test_named_model():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model[2].bias.data = model[2].bias.data.to(torch.bfloat16)
    model(torch.randn(3, 4))
"""


def test_the_fix_uses_the_tests_own_names(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "--torchdoctor=strict",
                                           timeout=600)
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "m.scale.data = m.scale.data.to(torch.bfloat16)" in out, out[-3000:]
    assert "model.scale" not in out
    assert "model[2].bias.data = model[2].bias.data.to(torch.float32)" in out  # `model` is the test's own name

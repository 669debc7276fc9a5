"""Under ``@pytest.mark.simulate`` the error is raised after the test body returned, so no frame of the test is on its
traceback: the fix is still written with the names the test held (``net.out``, not ``model.out``), and a test that
holds no other name keeps ``model``."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import pytest, torch, torch.nn as nn

class Net(nn.Module):
    def __init__(s):
        super().__init__()
        s.encoder = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GELU())
        s.out = nn.Conv2d(8, 3, 1)
    def forward(s, x):
        return s.out(s.encoder(x))

@pytest.mark.simulate(device="cuda:1", dtype="bfloat16")
def test_head_after_cast():
    net = Net().to("cuda:1", torch.bfloat16)
    net.out = nn.Conv2d(8, 2, 1).to("cuda:1")  # a new float32 head after the cast
    net(torch.randn(1, 3, 16, 16, device="cuda:1", dtype=torch.bfloat16))

@pytest.mark.simulate(device="cuda:1", dtype="bfloat16")
def test_head_fixed():
    net = Net().to("cuda:1", torch.bfloat16)
    net.out = nn.Conv2d(8, 2, 1).to("cuda:1")
    net.out.to(torch.bfloat16)
    net(torch.randn(1, 3, 16, 16, device="cuda:1", dtype=torch.bfloat16))
"""


def test_the_markers_fix_uses_the_tests_own_names(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(failed=1, passed=1)  # the printed fix, pasted into the test, passes
    out = result.stdout.str()
    assert "    net.out.to(torch.bfloat16)  # every floating tensor of out is float32" in out, out[-3000:]
    assert "model.out" not in out, out[-3000:]

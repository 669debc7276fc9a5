"""What a failing test shows (issue 27, point 5; issue 42 point 7): a simulate failure points at the test's call
line and the failing line of the forward, as pytest's own traceback does, the short
summary line reads like pytest's own, assert_placement's frame is hidden, the marker help is exact."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import pytest, torch
from torch import nn
import torchdoctor

@pytest.mark.simulate(device="cuda:1")
def test_sim():
    m = nn.Sequential(nn.Linear(4, 4))
    m.extra = [nn.Linear(4, 4)]
    m.to("cuda:1")
    m.extra[0](m(torch.ones(1, 4, device="cuda:1")))

def test_assert():
    torchdoctor.assert_placement(nn.Linear(2, 2), dtype=torch.bfloat16)
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_suite=SUITE)
    return pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore", *args,
                                         timeout=600)


def test_failures_point_at_the_test_and_summaries_read_like_pytest(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "-rf")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([  # the test's call line, as pytest's traceback shows it (torch's frames left out)
        "test_suite.py:10: in test_sim",
        '    m.extra[0](m(torch.ones(1, 4, device="cuda:1")))',
        "E   torchdoctor.PlacementError: * placement problem(s) on virtual cuda:1*",
    ])
    result.stdout.fnmatch_lines([
        "test_suite.py:13: in test_assert",
        "    torchdoctor.assert_placement(nn.Linear(2, 2), dtype=torch.bfloat16)",
        "E   AssertionError: placement is not dtype=bfloat16: 2 problem(s)",
    ])
    assert "def assert_placement" not in out and "_scan/scan.py" not in out  # the helper's frame is hidden
    summary = out.split("short test summary info", 1)[1].splitlines()
    sim = next(line for line in summary if "test_sim" in line)
    assert sim.startswith("FAILED test_suite.py::test_sim - torchdoctor.PlacementError: ") and " E " not in sim


def test_marker_help_is_exact(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--markers", timeout=300)
    line = next(ln for ln in result.stdout.lines if ln.startswith("@pytest.mark.simulate("))
    assert line.startswith("@pytest.mark.simulate(device, dtype=None, profile=None, count=None, data='cpu'): ")
    assert "device='cuda:1'" in line and "'cuda: 1'" not in line


def test_marker_failure_says_where_its_expectation_came_from(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_marked="""
import pytest, torch
from torch import nn

@pytest.mark.simulate(device="cuda:1", dtype="float16", profile="t4")
def test_sim():
    m = nn.Sequential(nn.Linear(4, 4))
    m.extra = [nn.Linear(4, 4)]
    m.to("cuda:1", torch.float16)
    m.extra[0](m(torch.ones(1, 4, device="cuda:1", dtype=torch.float16)))
""")
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore",
                                           timeout=600)
    result.assert_outcomes(failed=1)
    where = "@pytest.mark.simulate(device='cuda:1', dtype='float16', profile='t4')"
    result.stdout.fnmatch_lines([f"E   *expected: cuda:1 float16 on NVIDIA T4 16GB (device from {where}; dtype from "
                                 f"{where}; profile from {where})"])


FORWARD = """
import pytest, torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.mask = torch.ones(4)  # a plain attribute: Module.to never moves it

    def forward(self, x):
        h = self.lin(x)
        return h * self.mask


@pytest.mark.simulate(device="cuda:1")
def test_sim():
    model = Net().to("cuda:1")
    x = torch.ones(1, 4, device="cuda:1")
    model(x)

"""


def test_marker_failure_points_at_the_call_line_then_the_forward_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_forward=FORWARD)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore",
                                           timeout=600)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "test_forward.py:20: in test_sim",
        "    model(x)",
        "test_forward.py:13: in forward",
        "    return h * self.mask",
        "E   torchdoctor.PlacementError: 1 placement problem(s) on virtual cuda:1*",
        "E     device mask f32?4?@cpu is on cpu *",  # fnmatch: [4] would be a class
    ])
    out = result.stdout.str()
    assert "session.py" not in out and "runtime.py" not in out  # no frame of the simulator

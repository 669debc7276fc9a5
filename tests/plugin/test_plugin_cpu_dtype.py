"""``@pytest.mark.simulate("cpu", dtype="float16")`` checks the dtype on this CPU for real (issue 41 point 6, the
marker): a silent promotion out of the dtype fails the test by module, a clean body passes, no dtype is a usage
error that says what to add."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import pytest, torch
from torch import nn


class Upcast(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.ones(4)  # float32: promotes a float16 forward

    def forward(self, x):
        return self.lin(x) * self.scale


@pytest.mark.simulate("cpu", dtype="float16")
def test_upcast():
    m = Upcast().to(torch.float16)
    m(torch.ones(1, 4, dtype=torch.float16))


@pytest.mark.simulate("cpu", dtype="float16")
def test_fine():
    m = nn.Linear(4, 4).to(torch.float16)
    assert m(torch.ones(1, 4, dtype=torch.float16)).dtype == torch.float16


@pytest.mark.simulate("cpu")
def test_no_dtype():
    pass
"""


def test_marker_checks_a_dtype_on_the_cpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_cpu=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore", "-rfE",
                                           timeout=600)
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "E   torchdoctor.PlacementError: 1 dtype problem(s) on cpu in float16:",
        "E     dtype * promotes aten.mul.Tensor out of float16 into float32*(in <root>, Upcast)",
        "E   expected: cpu float16 (dtype from @pytest.mark.simulate(*dtype='float16'*))",
    ])
    result.stdout.fnmatch_lines(["*test_no_dtype*@pytest.mark.simulate('cpu') checks a dtype on this CPU: add dtype=*"])

"""``virtual_devices(raise_on_exit=False)``: an exception after recorded problems is kept on the session
(``session.failure``), and the program's own failed ``assert`` is raised, never swallowed as a consequence."""

from __future__ import annotations

import pytest
import torch

import torchdoctor


class _LeftBehind(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scale = torch.ones(4)  # a plain attribute Module.to never moves

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def test_the_programs_own_assert_after_a_problem_is_raised() -> None:
    with pytest.raises(AssertionError, match="the program's own check"):
        with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
            model = _LeftBehind().to("cuda:0")
            model(torch.ones(2, 4, device="cuda:0"))
            assert not sim.problems, "the program's own check"
    assert [p.path for p in sim.problems] == ["scale"]


def test_a_consequence_is_kept_on_the_session_with_the_problems() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        model = _LeftBehind().to("cuda:0")
        model(torch.ones(2, 4, device="cuda:0"))
        raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices")
    assert [p.path for p in sim.problems] == ["scale"]
    assert isinstance(sim.failure, RuntimeError) and "same device" in str(sim.failure)


def test_a_block_without_problems_has_no_failure() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        torch.nn.Linear(4, 4).to("cuda:0")(torch.ones(2, 4, device="cuda:0"))
    assert sim.ok and sim.failure is None

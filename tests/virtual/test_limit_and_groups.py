"""The problem limit never skips user code (issue 40, point 5): a block that reaches it runs to its end, stores the
first problems and says how many more it met."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class _Network(nn.Module):
    """An sd-scripts-style LoRA network: its modules are held apart from the model they patch."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_block_that_reaches_the_limit_runs_to_its_end() -> None:
    reached_the_end = []
    with torchdoctor.virtual_devices("cuda:1", limit=5, raise_on_exit=False) as sim:
        network = _Network(8)  # forgot network.to("cuda:1"): 16 tensors left on the cpu
        out = network(torch.ones(2, 4, device="cuda:1"))
        result = out.sum()  # the line that assigns the result runs
        reached_the_end.append(result.device)
    assert reached_the_end == [torch.device("cuda:1")]
    stored = [p for p in sim.problems if p.kind == "device"]
    assert len(stored) == 5 and sim.stopped is None
    last = sim.problems[-1]
    assert last.kind == "truncated" and last.found == "11 more"
    assert last.message.startswith("11 more problem(s) not stored: at most 5 are kept")


def test_the_marker_error_says_how_many_were_not_stored() -> None:
    try:
        with torchdoctor.virtual_devices("cuda:1", limit=2):
            _Network(3)(torch.ones(2, 4, device="cuda:1"))
    except torchdoctor.PlacementError as e:
        assert "4 more problem(s) not stored" in str(e)
    else:
        raise AssertionError("no PlacementError")


class _Patched(nn.Module):
    """sd-scripts' mechanism in a few lines: a LoRA module replaces the forward of the layer it patches and holds
    its own weights, so ``model.to`` never reaches them; only ``network.to`` does."""

    def __init__(self, org: nn.Linear) -> None:
        super().__init__()
        self.lora_down, self.lora_up = nn.Linear(4, 2, bias=False), nn.Linear(2, 4, bias=False)
        self.org_forward = org.forward
        org.forward = self.forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.org_forward(x) + self.lora_up(self.lora_down(x))


def test_many_tensors_of_one_object_left_behind_are_one_finding() -> None:
    try:
        with torchdoctor.virtual_devices("cuda:1"):
            model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(4)))
            network = nn.ModuleList(_Patched(layer) for layer in model)  # noqa: F841  (held apart, not moved)
            model.to("cuda:1")(torch.ones(2, 4, device="cuda:1"))
    except torchdoctor.PlacementError as e:
        text, problems = str(e), e.problems
        assert len(e.problems) == 8  # every tensor is still a problem, by path
    else:
        raise AssertionError("no PlacementError")
    # the network is named as the program holds it (its variable), never by ``….forward.__self__.…``
    grouped = [line for line in text.splitlines() if "the LoRA network was not moved: `network.to(device)` "
               "(network.to('cuda:1')): 8 tensors of `network`, patched into the model's forward, are on cpu while "
               "the run is on cuda:1; e.g. network.0.lora_down.weight, network.0.lora_up.weight" in line]
    assert len(grouped) == 1, text
    assert sum("lora_down.weight" in line for line in text.split("Fix:")[0].splitlines()) == 1  # one, not eight
    assert "__self__" not in text.split("Fix:")[0]
    assert "network.to('cuda:1') where the network is built" in text.split("Fix:")[1]  # never a move of the model
    assert {p.path for p in problems} == {f"network.{i}.lora_{w}.weight" for i in range(4) for w in ("down", "up")}

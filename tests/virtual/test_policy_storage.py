"""Storage judged by what computes with it, the same in scan, simulate and a virtual run (issue 41 point 3):
integer codes (GGUF-style uint8 blocks) and float8 weights in a plain ``nn.Linear`` / ``nn.Conv*`` are problems at
the weight (the layer computes with them as they are, and torch refuses); behind a layer that dequantizes or casts
per call they are not. The quantisation and the dequantizing layer are ours (``tests/scan/test_storage_compute``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from scan.test_storage_compute import _blocks, _model
from torch import nn

import torchdoctor

BF16 = torch.bfloat16
F8 = torch.float8_e4m3fn
KINDS = ("cuda:0", "xpu:0", "mps:0")


class UpcastLinear(nn.Linear):
    """Keeps float8 storage and casts it to the input's dtype per call (what layerwise casting does)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype), self.bias)


def _fp8(layer: Callable[[], nn.Module], conv: bool = False) -> nn.Module:
    m = nn.Sequential(*(nn.Conv2d(2, 2, 1) if conv else layer() for _ in range(3))).to(BF16)
    m[1].weight.data = m[1].weight.data.to(F8)
    return m


CASES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], bool]] = {
    # name: (model, input shape, a problem at 1.weight)
    "uint8 in nn.Linear": (lambda: _model(plain=True), (1, 8), True),
    "uint8 in nn.Conv3d": (lambda: _model(plain=True, conv=True), (1, 2, 1, 1, 1), True),
    "uint8 behind a dequantizing layer": (lambda: _model(plain=False), (1, 8), False),
    "float8 in nn.Linear": (lambda: _fp8(lambda: nn.Linear(8, 8)), (1, 8), True),
    "float8 in nn.Conv2d": (lambda: _fp8(lambda: nn.Linear(8, 8), conv=True), (1, 2, 2, 2), True),
    "float8 behind a casting layer": (lambda: _fp8(lambda: UpcastLinear(8, 8)), (1, 8), False),
}


def _found(problems: object) -> list[tuple[str, str]]:
    return sorted({(p.path, p.kind) for p in problems if p.kind == "dtype"})  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(CASES))
def test_scan_simulate_and_a_virtual_run_judge_storage_alike(case: str, kind: str) -> None:
    make, shape, bad = CASES[case]
    expected = [("1.weight", "dtype")] if bad else []
    simulated = torchdoctor.simulate(make(), (torch.ones(shape, dtype=BF16),), device=kind)
    m = make()
    with torchdoctor.virtual_devices(kind, raise_on_exit=False) as sim:
        m.to(kind)
        scanned = torchdoctor.scan(m)
        with torch.no_grad():
            m(torch.ones(shape, dtype=BF16, device=kind))  # refused by torch in the bad cases: the session reports it
    assert _found(scanned.problems) == expected and len(scanned.problems) == len(expected), scanned.problems
    assert _found(simulated.problems) == expected, simulated.problems
    assert _found(sim.problems) == expected, sim.problems
    refused = kind.startswith("mps") and "float8" in case  # MPS holds no float8: the move itself raises, as on a Mac
    assert {p.path for p in sim.problems} == {p.path for p in simulated.problems} == \
        {e[0] for e in expected} | ({"1.weight"} if refused else set())
    moved = [(p.path, p.found) for p in (*sim.problems, *simulated.problems) if p.op == "Tensor.to"]
    assert moved == ([("1.weight", "float8_e4m3fn")] * 2 if refused else []), moved
    if refused:
        assert all("Trying to convert Float8_e4m3fn to the MPS backend" in p.message for p in sim.problems
                   if p.op == "Tensor.to")
    if bad:
        (p,) = [p for p in sim.problems if p.kind == "dtype"]
        integer = "uint8" in case
        assert ("quantized integer" in p.message) == integer and "computes with it as it is" in p.message
        assert ("is not a dequantization" if integer else "cast it to bfloat16") in p.message
        (s,) = scanned.problems
        assert s.message.split(" storage but ")[1].split(" (")[0] == p.message.split(" storage but ")[1].split(" (")[0]


def test_a_plain_layer_quantized_beside_dequantizing_ones_is_the_only_one_named_in_a_run() -> None:
    m = _model(plain=False)
    m[2].weight = nn.Parameter(_blocks(m[2].weight.detach())[0], requires_grad=False)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m.to("cuda:0")
        with torch.no_grad():
            m(torch.ones(1, 8, dtype=BF16, device="cuda:0"))
    assert _found(sim.problems) == [("2.weight", "dtype")] == _found(torchdoctor.scan(m).problems)

"""Fixes that are the program's own lines, never a move of the whole model (issue 41 point 1, hunt s15 V3, V7, V10):
a bf16 tensor read with ``.numpy()`` through a subscript (``pred["boxes"].cpu().numpy()``) is fixed at that line
(``.float()`` first), proven by a re-run; a device the simulated profile lacks is a setting of the check, never a
placement fix; a float32 tuple of tables is cast by a line that runs (a tuple has no ``.to``)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class Detector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.box = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"boxes": self.box(x).sigmoid()}


def boxes(m: Detector, fixed: bool = False) -> object:
    m.to("cuda:0")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        pred = m(torch.randn(2, 4, device="cuda:0"))
    if fixed:
        return pred["boxes"].cpu().detach().float().numpy()
    return pred["boxes"].cpu().detach().numpy()


def test_a_bf16_numpy_read_is_fixed_at_its_line() -> None:
    r = torchdoctor.simulate(Detector(), device="cuda:0", call=boxes)
    [p] = r.problems
    assert p.message.startswith("a bfloat16 tensor read with .numpy() at tests/virtual/test_fix_never_model_wide.py:")
    [fix] = r.fixes
    assert fix.code == 'return pred["boxes"].cpu().detach().float().numpy()  # numpy has no bfloat16: cast it to ' \
        'float32 first'
    assert fix.proven and fix.diff is not None and "torchdoctor.move" not in str(r)
    assert torchdoctor.simulate(Detector(), device="cuda:0", call=lambda m: boxes(m, fixed=True)).ok


def two_gpus(m: nn.Sequential) -> torch.Tensor:
    m[0].to("cuda:0")
    m[1].to("cuda:1")
    return m[1](m[0](torch.randn(2, 4, device="cuda:0")).to("cuda:1"))


def test_a_device_the_profile_lacks_is_no_placement_fix() -> None:
    r = torchdoctor.simulate(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), device="cuda:0", call=two_gpus)
    assert any("cuda:1 does not exist (invalid device ordinal)" in p.message for p in r.problems)
    codes = [f.code for f in r.fixes]
    assert codes == ["# cuda:1 is a device the simulated profile does not have: simulate as many devices as the "
                     "program uses (simulate(..., profile=torchdoctor.DeviceProfile.for_device('cuda:1')), or run "
                     "--device cuda:1); no placement change is needed for it"]
    assert torchdoctor.simulate(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), device="cuda:1", call=two_gpus).ok


class Rope(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.freqs = (torch.ones(8, 4), torch.ones(8, 4))  # a plain tuple attribute: Module.to never moves it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.freqs[0].device != x.device:  # moved per call (Wan), kept float32
            self.freqs = tuple(f.to(x.device) for f in self.freqs)
        h = self.proj(x)
        return h * self.freqs[0][: h.shape[0]] + h * self.freqs[1][: h.shape[0]]


def test_a_tuple_of_tables_gets_a_cast_that_runs() -> None:
    from torchdoctor._virtual.groups import whole_component

    bf16, fp32 = torch.bfloat16, torch.float32
    have = {"proj.weight": (bf16, "xpu:0"), "proj.bias": (bf16, "xpu:0"), "freqs.0": (fp32, "xpu:0"),
            "freqs.1": (fp32, "xpu:0")}
    fixes, rest = whole_component([("freqs.0", "freqs.0", "dtype", bf16), ("freqs.1", "freqs.1", "dtype", bf16)], have)
    [fix] = fixes
    assert not rest and fix.code.startswith(
        "model.freqs = type(model.freqs)(t.to(torch.bfloat16) for t in model.freqs)  # every tensor of freqs is "
        "float32 while the rest of the model is bfloat16")
    m = Rope()
    exec(fix.code, {"model": m, "torch": torch})  # the printed line runs on the object as the program holds it
    assert [type(m.freqs), *(t.dtype for t in m.freqs)] == [tuple, bf16, bf16]

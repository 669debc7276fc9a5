"""A program that keeps ONE component in float32 on purpose (a VAE decoding in float32 inside a float16 pipeline,
fed ``lat.float()``) ran in the dtype asked for: its float16 parts computed in float16, and the float32 part is
consistent in itself. No ``<run>`` note says the code "ran with float32 weights", however large that component is;
a program left in float32 as a whole still gets it."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


class Pipe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.unet = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
        # larger than the denoiser here, as the float32 share of the ops' bytes must not decide
        self.vae = nn.Sequential(nn.Conv2d(1, 64, 3, padding=1), nn.SiLU(), nn.Conv2d(64, 64, 3, padding=1),
                                 nn.Conv2d(64, 3, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lat = self.unet(x)
        return self.vae(lat.float().view(-1, 1, 4, 4))  # the VAE decodes in float32 on purpose


def kept_fp32(p: nn.Module) -> torch.Tensor:
    p.to("cuda:0")
    p.unet.half()  # the denoiser in float16, the VAE kept float32 deliberately
    return p(torch.randn(2, 16, device="cuda:0", dtype=torch.float16))


def left_fp32(p: nn.Module) -> torch.Tensor:
    p.to("cuda:0")
    return p(torch.randn(2, 16, device="cuda:0"))


def test_simulate_of_a_component_kept_float32_on_purpose_is_quiet() -> None:
    report = torchdoctor.simulate(Pipe(), device="cuda:0", dtype=torch.float16, call=kept_fp32)
    assert report.ok and report.fix is None, report.text()
    assert "ran with float32" not in report.text()


def test_a_block_with_a_component_kept_float32_on_purpose_is_quiet() -> None:
    with torchdoctor.virtual_devices("cuda:0", torch.float16, raise_on_exit=False) as sim:
        kept_fp32(Pipe())
    assert sim.problems == [], [p.message for p in sim.problems]


def test_the_same_pipeline_left_float32_as_a_whole_still_says_so() -> None:
    report = torchdoctor.simulate(Pipe(), device="cuda:0", dtype=torch.float16, call=left_fp32)
    assert [p.path for p in report.problems] == ["<run>"]
    assert "the code ran with float32 weights, not float16" in report.problems[0].message

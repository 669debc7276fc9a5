"""A cast of a tensor already on the device to a dtype the device cannot hold (a sampler's
``sigmas.to(torch.float64)`` on mps, ComfyUI-Spectrum-MiniMax-H3 #8) keeps the program's line of the cast, in the
message and as the problem's source, so its fix can be written there; a move that the device refuses keeps its maker."""

from __future__ import annotations

import os
import sys

import torch

import torchdoctor

# as reports write a file: relative to the working directory when below it
HERE = os.path.relpath(__file__) if __file__.startswith(os.getcwd() + os.sep) else \
    os.sep.join(__file__.split(os.sep)[-2:])


def _sample(noise: torch.Tensor, sigmas: torch.Tensor) -> tuple[torch.Tensor, int]:
    sig = sigmas.to(torch.float64); line = sys._getframe().f_lineno  # noqa: E702
    return noise * sig[0], line


def test_a_refused_cast_on_the_device_keeps_its_line() -> None:
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        sigmas = torch.linspace(1.0, 0.0, 5, device="mps")
        _, line = _sample(torch.randn(1, 4, device="mps"), sigmas)
    [p] = [p for p in sim.problems if p.kind == "unsupported_dtype"]
    assert f"moved to mps:0 as float64 (cast at {HERE}:{line}): mps cannot hold float64" in p.message, p.message
    assert sim.sources[(p.kind, p.path, p.op or "", p.found)] == (f"cast at {HERE}:{line}",)


def test_a_refused_move_says_no_cast_line() -> None:
    import numpy as np

    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        torch.from_numpy(np.ones(3)).to("mps")
    [p] = [p for p in sim.problems if p.kind == "unsupported_dtype"]
    assert "(cast at " not in p.message and "made by torch.from_numpy" in p.message, p.message

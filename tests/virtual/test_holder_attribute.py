"""A tensor a caching wrapper keeps (ComfyUI-TeaCache#71: ``self.previous_residual = (out - x).to(cache_device)``,
added back on a skipped step) is named by its maker's line when the run made it, and as the holder's attribute
(``Cache.residual``) when it was made before the run (hunt T26, maker part)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


class _Cache:  # patched in as model.forward, as the caching nodes do
    def __init__(self, model: nn.Module, residual: torch.Tensor | None = None) -> None:
        self.orig, self.residual = model.forward, residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.residual is not None:
            return x + self.residual  # a skipped step
        out = self.orig(x)
        self.residual = (out - x).to("cpu")  # the bug: kept on the cache device
        return out


def _run(residual: torch.Tensor | None) -> torchdoctor.VirtualSession:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = nn.Linear(8, 8).to("cuda:0")
        m.forward = _Cache(m, residual).forward
        x = torch.randn(1, 8, device="cuda:0")
        for _ in range(2):
            x = m(x)
    return sim


def test_a_residual_the_run_moved_to_cpu_is_named_at_its_line() -> None:
    [p] = _run(None).problems
    assert p.kind == "device" and p.found == "cpu" and "while aten.add.Tensor runs on cuda:0" in p.message
    assert "a tensor made by Tensor.to" in p.message and f"{__name__.rsplit('.', 1)[-1]}.py:" in p.message


def test_a_residual_made_before_the_run_is_named_as_its_holder_keeps_it() -> None:
    [p] = _run(torch.zeros(1, 8)).problems
    assert p.path == "_Cache.residual"
    assert p.message.startswith("_Cache.residual f32[1,8]@cpu is on cpu while aten.add.Tensor runs on cuda:0")


def test_diffusers_ema_pinned_to_cpu_is_named_as_the_program_holds_it() -> None:
    """bghira/SimpleTuner#1497: ``ema.to("cpu")`` then ``ema.step(model.parameters())`` on the GPU model; the maker
    on record is diffusers' own line, so the name is the program's: ``ema.shadow_params[0]``, fixed on ``ema``."""
    training_utils = pytest.importorskip("diffusers.training_utils")
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to("cuda:0")
        ema = training_utils.EMAModel(m.parameters(), decay=0.999)
        ema.to("cpu")  # the bug: pinned to the CPU, stepped with the GPU parameters
        m(torch.randn(2, 8, device="cuda:0")).square().mean().backward()
        ema.step(m.parameters())
    p = sim.problems[0]
    assert (p.kind, p.path, p.role, p.found) == ("device", "ema.shadow_params[0]", "held", "cpu")
    assert "site-packages" not in p.message and "diffusers" not in p.message
    assert any(f.code.startswith("ema.to('cuda:0')") for f in sim.fixes)

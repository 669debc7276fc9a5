"""A tensor a caching wrapper keeps (ComfyUI-TeaCache#71: ``self.previous_residual = (out - x).to(cache_device)``,
added back on a skipped step) is named by its maker's line when the run made it, and as the holder's attribute
(``Cache.residual``) when it was made before the run (hunt T26, maker part)."""

from __future__ import annotations

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

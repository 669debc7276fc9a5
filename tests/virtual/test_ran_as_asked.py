"""A run asked for a dtype says in which dtype it ran only when its matmul-like ops computed in another one: AMP's
autocast over float32 weights and diffusers' layerwise casting (float8 storage, bf16 compute) are correct setups."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


def _amp(m: nn.Module) -> torch.Tensor:
    m.to("cuda:0")
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        return m(torch.randn(2, 8, device="cuda:0"))


def _layerwise(m: nn.Module) -> torch.Tensor:
    from diffusers.hooks import apply_layerwise_casting

    m.to("cuda:0", torch.bfloat16)
    apply_layerwise_casting(m, storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    return m(torch.randn(2, 8, device="cuda:0", dtype=torch.bfloat16))


def _left_fp32(m: nn.Module) -> torch.Tensor:
    m.to("cuda:0")
    return m(torch.randn(2, 8, device="cuda:0"))


@pytest.mark.parametrize("app", [_amp, _layerwise], ids=["autocast", "layerwise-casting"])
def test_a_run_that_computed_in_the_dtype_asked_is_quiet(app: object) -> None:
    r = torchdoctor.simulate(_model(), device="cuda:0", dtype=torch.bfloat16, call=app)
    assert r.ok, r.problems
    assert "asked for" not in str(r)


def test_a_run_left_in_float32_still_says_so() -> None:
    r = torchdoctor.simulate(_model(), device="cuda:0", dtype=torch.bfloat16, call=_left_fp32)
    assert [p.path for p in r.problems] == ["<run>"]
    assert "the code ran with float32 weights, not bfloat16" in r.problems[0].message


def test_a_block_under_autocast_is_quiet() -> None:
    m = _model()
    with torchdoctor.virtual_devices("cuda:0", dtype=torch.bfloat16) as sim:
        _amp(m)
    assert not [p for p in sim.problems if p.path == "<run>"], sim.problems

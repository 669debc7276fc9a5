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


class _Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.v = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.v(self.q(x))


def test_peft_lora_adapters_kept_float32_over_an_fp16_base_are_a_correct_setup() -> None:
    # peft keeps adapters fp32 by design (it casts x to them and the result back): their low-rank matmuls, more ops
    # than the base's, must not outvote the layers they adapt (hunt R1)
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    m = get_peft_model(_Base().to(torch.float16), LoraConfig(r=2, target_modules=["q", "v"]))
    assert {p.dtype for n, p in m.named_parameters() if "lora_" in n} == {torch.float32}

    def app(model: nn.Module) -> torch.Tensor:
        model.to("cuda:0")
        return model(torch.randn(2, 8, device="cuda:0", dtype=torch.float16))

    report = torchdoctor.simulate(m, device="cuda:0", dtype=torch.float16, call=app)
    assert report.ok and report.fix is None, report.text()
    with torchdoctor.virtual_devices("cuda:0", torch.float16, raise_on_exit=False) as sim:
        app(m)
    assert sim.problems == []
    report = torchdoctor.simulate(_Base(), device="cuda:0", dtype=torch.float16, call=lambda b: b.to("cuda:0")(
        torch.randn(2, 8, device="cuda:0")))  # the same model left float32 still says so
    assert [p.path for p in report.problems] == ["<run>"]

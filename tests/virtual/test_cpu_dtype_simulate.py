"""simulate(..., device="cpu", dtype=...) checks the dtype on this CPU for real (issue 41 point 6): the ops with no
kernel in it and the silent promotions out of it are named by path, the run goes on past each, and the fixes are
proven by a re-run; the user's model is untouched."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


class Spectral(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = torch.ones(8)  # a plain attribute: .to(dtype) leaves it float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x) * self.scale
        return torch.fft.rfft(h, dim=-1).abs()  # CPU has no float16 FFT


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.spec, self.out = Spectral(), nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.spec(x))


class Solves(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.svdvals(self.proj(x))


def test_no_kernel_and_silent_promotion_are_named_by_path_with_proven_fixes() -> None:
    model = Net()
    report = torchdoctor.simulate(model, (torch.randn(2, 8),), device="cpu", dtype=torch.float16)
    assert [(p.kind, p.path) for p in report.problems] == [("dtype", "spec.scale"), ("unsupported_dtype", "spec")]
    assert report.problems[1].message == ("_fft.fft_rfft has no float16 kernel on cpu: Unsupported dtype Half "
                                          "(in spec, Spectral)")
    assert report.problems[0].message.startswith("spec.scale float32[8] promotes aten.mul.Tensor out of float16 "
                                                 "into float32: a silent promotion")
    assert [(f.code.split("  #")[0], f.proven) for f in report.fixes] == [
        ("model.spec.scale.data = model.spec.scale.data.to(torch.float16)", True),
        ("model.to(torch.float32)", True)]
    assert "cpu has no float16 kernel for _fft.fft_rfft (in spec)" in report.fixes[1].code
    text = report.text()
    assert text.startswith("2 problem(s) (") and " ops on cpu in float16, " in text
    assert report.to_dict()["device"] == "cpu" and report.to_dict()["dtype"] == "float16"
    assert model.spec.scale.dtype == torch.float32 and model.out.weight.dtype == torch.float32  # untouched


def test_an_op_not_implemented_for_half_is_named_and_the_run_goes_on() -> None:
    report = torchdoctor.simulate(Solves(), (torch.randn(3, 4),), device="cpu", dtype="float16")
    assert [(p.kind, p.path) for p in report.problems] == [("unsupported_dtype", "<root>")]
    assert "not implemented for 'Half'" in report.problems[0].message
    fix = report.fixes[-1]
    assert fix.proven and fix.code.startswith("model.to(torch.float32)  # cpu has no float16 kernel for ")


def test_a_model_that_runs_in_the_dtype_on_cpu_is_ok() -> None:
    report = torchdoctor.simulate(nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8)), (torch.randn(2, 8),),
                                  device="cpu", dtype=torch.bfloat16)
    assert report.ok and report.ops > 0 and report.fixes == ()


def test_cpu_without_a_dtype_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match=r"simulate on device='cpu' checks a dtype on this CPU: pass dtype="):
        torchdoctor.simulate(nn.Linear(2, 2), (torch.randn(1, 2),), device="cpu")


def test_with_call_the_dtype_switch_is_never_claimed_proven() -> None:
    def app(m: nn.Module) -> None:  # the caller's own code casts the model: a re-run cannot try another dtype
        m.to("cpu", torch.float16)
        m(torch.randn(2, 8, dtype=torch.float16))

    report = torchdoctor.simulate(Net(), device="cpu", dtype=torch.float16, call=app)
    assert ("unsupported_dtype", "spec") in [(p.kind, p.path) for p in report.problems]
    last = report.fixes[-1]
    assert last.kind == "note" and not last.proven and "model.to(" not in last.code
    assert last.tried == "not re-run: call= casts the model itself, so no re-run can put it in another dtype"


class _ChosenFloat32(nn.Module):
    """A timestep embedding computed in float32 on purpose and cast back, then a gate made with no dtype."""

    def __init__(self, gate: bool) -> None:
        super().__init__()
        self.lin, self.time_mlp, self.gate = nn.Linear(8, 8), nn.Linear(8, 8), gate

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        freqs = torch.exp(-9.2 * torch.arange(4, dtype=torch.float32) / 4)  # chosen: float32 by name
        emb = torch.cat([torch.cos(t[:, None] * freqs), torch.sin(t[:, None] * freqs)], -1).to(x.dtype)
        h = self.lin(x) + self.time_mlp(emb)
        return h * torch.ones(8) if self.gate else h  # torch.ones(8): float32 by default, nobody chose it


def test_a_float32_the_code_chose_and_casts_back_is_quiet_a_default_dtype_factory_is_not() -> None:
    args = (torch.randn(1, 8), torch.tensor([500.0]))
    for dtype in (torch.float16, torch.bfloat16):
        assert torchdoctor.simulate(_ChosenFloat32(False), args, device="cpu", dtype=dtype).ok
        bad = torchdoctor.simulate(_ChosenFloat32(True), args, device="cpu", dtype=dtype)
        assert [p.kind for p in bad.problems] == ["dtype"] and "silent promotion" in bad.problems[0].message

"""A fix that switches the dtype the run asks for (bf16 -> fp16 for a convolution on a T4 or a V100, float64 -> float32
on an Arc) is
proven by a re-run that asks for the new dtype, and says so (hunt S13); a float8 weight bound for MPS, which holds
no float8, is cast before the move, as torch refuses it there (hunt S14)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))


def _conv() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.GELU(), nn.Conv2d(8, 8, 3))


_CONV, _MLP = (_conv, (1, 3, 8, 8)), (_mlp, (2, 8))


@pytest.mark.parametrize(("device", "dtype", "profile", "new", "size", "net"), [
    ("cuda:0", torch.bfloat16, "t4", "float16", "float16 has the same size", _CONV),
    ("cuda:0", torch.bfloat16, "v100", "float16", "float16 has the same size", _CONV),
    ("xpu", torch.float64, "arc", "float32", "float32 is half its size", _MLP),
])
def test_a_dtype_switch_is_proven_by_a_re_run_asking_the_new_dtype(device: str, dtype: torch.dtype, profile: str,
                                                                   new: str, size: str, net: tuple) -> None:
    build, shape = net
    report = torchdoctor.simulate(build(), (torch.randn(*shape),), device, dtype, profile=profile)
    assert [p.kind for p in report.problems] == ["unsupported_dtype"]
    (fix,) = report.fixes
    assert fix.code.startswith(f"model.to(torch.{new})  #") and fix.code.endswith(size), fix.code
    assert fix.proven and fix.tried == f"applied in a virtual re-run asking {new}, the dtype it switches to: no " \
        "problem left", fix.tried
    assert f"Fix (proven: a virtual re-run with it applied asking {new}, the dtype it switches to, has no problem " \
        "left):" in str(report)


def test_the_same_model_in_the_new_dtype_is_quiet_there() -> None:  # what the re-run asked, asked by the user
    assert torchdoctor.simulate(_conv(), (torch.randn(1, 3, 8, 8),), "cuda:0", torch.float16, profile="t4").ok


def test_float8_bound_for_mps_is_refused_at_the_move_and_cast_before_it() -> None:
    m = _mlp().to(torch.bfloat16)
    m[0].weight.data = m[0].weight.data.to(torch.float8_e4m3fn)
    report = torchdoctor.simulate(m, (torch.randn(2, 8, dtype=torch.bfloat16),), "mps")
    moved = [p for p in report.problems if p.op == "Tensor.to"]
    assert [(p.kind, p.path, p.found) for p in moved] == [("unsupported_dtype", "0.weight", "float8_e4m3fn")]
    assert "TypeError: Trying to convert Float8_e4m3fn to the MPS backend but it does not have support for that " \
        "dtype" in moved[0].message
    assert "cast it to a dtype mps holds (float16, bfloat16 or float32) before the move" in moved[0].message
    (fix,) = report.fixes
    assert fix.code == "model[0].weight.data = model[0].weight.data.to(torch.bfloat16)  # float8_e4m3fn storage " \
        "computed with directly: cast it before the model moves" and fix.proven, fix.code
    assert m[0].weight.dtype == torch.float8_e4m3fn  # the user's model untouched
    m[0].weight.data = m[0].weight.data.to(torch.bfloat16)  # the fix applied: quiet
    assert torchdoctor.simulate(m, (torch.randn(2, 8, dtype=torch.bfloat16),), "mps").ok


def test_a_session_names_the_refused_float8_move_by_path() -> None:
    m = _mlp()
    m[2].weight.data = m[2].weight.data.to(torch.float8_e5m2)
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        m.to("mps")
    assert [(p.kind, p.path, p.found) for p in sim.problems] == [("unsupported_dtype", "2.weight", "float8_e5m2")]
    assert "Trying to convert Float8_e5m2 to the MPS backend" in sim.problems[0].message

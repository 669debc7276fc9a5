"""``simulate(model, x, device="cpu", dtype=torch.float16)`` names the operand behind every refusal torch's CPU
kernels word (hunt N, N2, X).

- ``spec @ self.mel_fb`` with a float32 plain attribute: CPU's ``mm`` says ``expected m1 and m2 to have the same
  dtype`` (not the ``mat1 and mat2`` of ``addmm``); it is named, never a traceback out of ``simulate``.
- an stft front end: the fft has no Half kernel, so it runs wide; the magnitude taken from its complex spectrum goes
  on in float16, as on hardware with that kernel, and the float32 filterbank is named too (not only the fft).
- ALiBi slopes made by ``torch.tensor(numpy float64 array)``: the factory is named at its line with the dtype read
  from its data, and fixed there with ``dtype=x.dtype`` (a diff), proven by the re-run.
Each claim is checked against the real CPU: the same model really raises in float16 until the fix is applied.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchdoctor
from tests.support.apps import load_file


class MelOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mel_fb = torch.rand(17, 8)  # a plain attribute: Module.to never casts it
        self.proj = nn.Linear(8, 16)

    def forward(self, spec: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.log(spec @ self.mel_fb + 1e-5))


class MelFrontend(MelOnly):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(32))

    def forward(self, wav: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        spec = torch.stft(wav, 32, hop_length=8, window=self.window, return_complex=True).abs()
        return super().forward(spec.transpose(1, 2))


def _real(model: nn.Module, x: torch.Tensor) -> str:
    try:
        model.to(torch.float16)(x.half())
    except RuntimeError as exc:
        return str(exc)
    return ""


def test_mm_refusal_names_the_float32_attribute_and_its_cast_is_proven() -> None:
    x = torch.rand(1, 5, 17)
    assert "expected m1 and m2 to have the same dtype" in _real(MelOnly(), x)  # what this CPU really says
    model = MelOnly()
    report = torchdoctor.simulate(model, (x,), device="cpu", dtype=torch.float16)
    (p,) = report.problems
    assert (p.kind, p.path) == ("dtype", "mel_fb")
    assert "meets float16 in aten.mm.default, which refuses the mix: expected m1 and m2" in p.message
    (fix,) = report.fixes
    assert fix.proven and "model.mel_fb" in fix.code and "torch.float16" in fix.code
    assert model.mel_fb.dtype == torch.float32 and model.proj.weight.dtype == torch.float32  # read-only


def test_an_fft_without_a_kernel_does_not_hide_the_filterbank_after_it() -> None:
    report = torchdoctor.simulate(MelFrontend(), (torch.randn(1, 256),), device="cpu", dtype=torch.float16)
    kinds = {(p.kind, p.path) for p in report.problems}
    assert ("dtype", "mel_fb") in kinds, report
    assert any(p.kind == "unsupported_dtype" and "fft" in (p.op or "") for p in report.problems), report


PROGRAM = '''
import math
import numpy as np
import torch
from torch import nn


class AlibiAttn(nn.Module):
    def __init__(self, heads=2, dim=32):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        slopes = torch.tensor(np.array([2 ** (-8 * (i + 1) / self.heads) for i in range(self.heads)]), device=x.device)
        pos = torch.arange(n, device=x.device)
        bias = slopes[:, None, None] * (pos[None, None, :] - pos[None, :, None]).abs().neg()
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads) + bias
        return self.out((att.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d))
'''


def test_a_float64_tensor_made_from_numpy_data_is_named_at_its_line_and_fixed_there(tmp_path: Path) -> None:
    path = tmp_path / "alibi_app.py"
    path.write_text(PROGRAM, encoding="utf-8")
    mod = load_file(path)
    x = torch.randn(1, 5, 32)
    assert "same dtype" in _real(mod.AlibiAttn(), x)  # float64 slopes really break the float16 attention here
    report = torchdoctor.simulate(mod.AlibiAttn(), (x,), device="cpu", dtype=torch.float16)
    (p,) = report.problems
    line = next(i for i, t in enumerate(PROGRAM.splitlines(), 1) if "slopes = torch.tensor" in t)
    assert f"a tensor made by torch.tensor in `<root>` at " in p.message, p.message
    assert f"alibi_app.py:{line} (no dtype given: from its data, float64)" in p.message, p.message
    (fix,) = report.fixes
    assert fix.proven and fix.diff and "device=x.device, dtype=x.dtype)" in fix.diff
    fixed = tmp_path / "alibi_fixed.py"
    fixed.write_text(PROGRAM.replace("device=x.device)\n", "device=x.device, dtype=x.dtype)\n", 1), encoding="utf-8")
    assert _real(load_file(fixed).AlibiAttn(), x) == ""  # the proven fix really runs in float16 here

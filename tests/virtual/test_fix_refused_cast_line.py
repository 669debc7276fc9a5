"""A tensor already on MPS cast to float64 by the program (a sampler's ``sigmas.to(torch.float64)`` "for precision")
is fixed at that cast's line (a diff to float32), proven at the device's storage: never a cast "before the move" of
a tensor nothing moved."""

from __future__ import annotations

from pathlib import Path

from support.apps import run_json

SAMPLER = """\
import torch
def outer_sample(noise, sigmas):
    sig = sigmas.to(torch.float64)  # precision
    x = noise * sig[0]
    for i in range(len(sig) - 1):
        x = x + (sig[i + 1] - sig[i]) * x.to(sig.dtype) * 0.1
    return x.float()
sigmas = torch.linspace(1.0, 0.0, 5, device="mps")
print(outer_sample(torch.randn(1, 4, 8, 8, device="mps"), sigmas).shape)
"""

DOUBLE = """\
import torch
t = torch.arange(6, device="mps").float()
table = t.double().cumsum(0)
print(table.shape)
"""


def test_the_float64_cast_is_fixed_at_its_line(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(SAMPLER)
    doc = run_json(app, "mps")
    (fix,) = doc["fixes"]
    assert fix["code"].startswith("# app.py:3: `sig = sigmas.to(torch.float64)` casts to float64 on mps:0, which "
                                  "cannot hold float64: cast to float32 there"), fix
    assert fix["proven"], fix["tried"]
    assert "+    sig = sigmas.to(torch.float32)  # precision" in doc["patch"], doc["patch"]


def test_a_double_call_is_fixed_at_its_line_too(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(DOUBLE)
    doc = run_json(app, "mps")
    assert "+table = t.to(torch.float32).cumsum(0)" in (doc["patch"] or ""), doc

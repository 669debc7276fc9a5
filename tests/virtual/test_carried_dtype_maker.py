"""A cast whose dtype is read from another tensor (``emb.to(t.dtype)``, ``emb.type_as(t)``) only carries that
tensor's dtype: the maker of a float64 operand is the line that made ``t`` float64 — numpy timesteps through
``torch.from_numpy`` (spacepxl/WanTraining #10) — never the dtype-following helper, which stays untouched. On a
device that cannot hold float64 such a cast is no problem of its own either: the line that made ``t`` is."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

import torchdoctor
from support.apps import run_json


def _embed(t: torch.Tensor, how: str) -> torch.Tensor:
    freqs = torch.exp(-math.log(10000) * torch.arange(8, device=t.device) / 8)
    args = t.float()[:, None] * freqs[None]
    emb = torch.cat([args.cos(), args.sin()], dim=-1)
    return emb.to(t.dtype) if how == "to" else emb.type_as(t)  # in the timesteps' dtype


def _steps(how: str) -> None:
    lin = nn.Linear(16, 4).to("cuda", torch.bfloat16)
    t = torch.from_numpy(np.array([1.0, 500.0]) * 1.0).to("cuda")
    with torch.no_grad():
        lin(_embed(t, how))


def test_the_maker_of_a_carried_dtype_is_the_donor_s() -> None:
    for how in ("to", "type_as"):
        with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
            _steps(how)
        [p] = [p for p in sim.problems if p.kind == "dtype"]
        assert "made by torch.from_numpy at " in p.message and "float64" in p.message, (how, p.message)
        assert "to(t.dtype)" not in p.message and "type_as" not in p.message, (how, p.message)


APP = """
    import math, numpy as np, torch, torch.nn as nn

    def sinusoidal(t):
        freqs = torch.exp(-math.log(10000) * torch.arange(8, device=t.device) / 8)
        args = t.float()[:, None] * freqs[None]
        return torch.cat([args.cos(), args.sin()], dim=-1).to(t.dtype)  # in the timesteps' dtype

    net = nn.Linear(16, 4).to("cuda", torch.bfloat16)
    t = torch.from_numpy(np.array([1.0, 500.0]) * 1000).to("cuda")
    print(net(sinusoidal(t)).shape)
"""


def test_run_patches_the_donor_s_line_never_the_helper(tmp_path: Path) -> None:
    from support.apps import committed

    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP))
    committed(tmp_path)
    doc = run_json(app, "cuda")
    [p] = doc["problems"]
    assert "made by torch.from_numpy at app.py:10" in p["message"], p["message"]
    patch = doc["patch"] or ""
    assert "-t = torch.from_numpy(np.array([1.0, 500.0]) * 1000).to(\"cuda\")" in patch, patch
    assert "-    return torch.cat" not in patch, patch  # the helper follows its input's dtype, as written


def test_a_carried_cast_on_mps_is_the_donor_s_problem() -> None:
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        sig = torch.linspace(1.0, 0.0, 5, device="mps").to(torch.float64)
        x = torch.randn(4, device="mps")
        (x.to(sig.dtype) * sig[0]).float()
    refused = [p for p in sim.problems if p.kind == "unsupported_dtype"]
    assert len(refused) == 1 and "as float64 (cast at " in refused[0].message, [p.message for p in refused]

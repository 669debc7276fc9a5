"""A library that computes in float64 at two sites, reached from two lines of the program (diffusers' Helios DMD
scheduler on an Apple GPU, huggingface/diffusers #14367, hunt B4: ``set_timesteps`` moves float64 timesteps to the
device, ``step`` upcasts with ``.double()``): one run names both, each with the program's line that reached it --
never one site per run. The program's own repeated casts of one dtype stay one problem."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
from diffusers import HeliosDMDScheduler  # noqa: E402  # the real library's scheduler, present in this diffusers

APP = """import torch, torch.nn as nn
from diffusers import HeliosDMDScheduler
device = torch.device("mps" if torch.backends.mps.is_available() else "cpu")
denoiser = nn.Conv3d(4, 4, 3, padding=1).to(device)
scheduler = HeliosDMDScheduler()
latents = torch.randn(1, 4, 2, 8, 8, device=device)
with torch.no_grad():
    scheduler.set_timesteps(2, stage_index=0, device=device)
    noisy = torch.randn_like(latents)
    for i, t in enumerate(scheduler.timesteps):
        latents = scheduler.step(denoiser(latents), t, latents, cur_sampling_step=i, dmd_noisy_tensor=noisy,
                                 dmd_sigmas=scheduler.sigmas, dmd_timesteps=scheduler.timesteps,
                                 all_timesteps=scheduler.timesteps, return_dict=False)[0]
print(latents.shape)
"""


def test_both_float64_sites_of_a_library_are_named_in_one_run(tmp_path: Path) -> None:
    assert HeliosDMDScheduler is not None
    (tmp_path / "app.py").write_text(APP)
    r = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "mps", "app.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    fix = out.split("Fix:", 1)[1]
    assert "(HeliosDMDScheduler.set_timesteps, diffusers' own code, reached from your line app.py:8 " in fix, out
    assert "HeliosDMDScheduler.convert_flow_pred_to_x0" in fix and "reached from your line app.py:11 " in fix, out

"""Whole programs from the twenty-ninth session's hunts, each a mechanism the virtual run or its fixes had wrong.

- A GRU tagger with ``batch_first=True``: ``nn.GRU`` / ``nn.RNN`` end with ``output.transpose_(0, 1)``, an in-place op
  that changes the tensor's shape, which left the virtual output (seq, batch, hidden); the correct program crashed
  under ``run`` ("view size is not compatible"). It runs clean now.
- A cuda model wrapped in ``torch.autocast(device_type="cpu")``: on the GPU the cpu's autocast casts nothing and the
  fp16 input meets the fp32 weight; the virtual run let the cpu's autocast cast the device's op and said "no
  placement error". The dtype mismatch is found now.
- A bf16 UNet fed by a ControlNet the program left in fp32: the fixes were ``torchdoctor.move(unet, torch.bfloat16)``
  three times, "proven", for a UNet that is already bf16 (a no-op); a cast of a module the program holds to the dtype
  all its floating tensors have is never printed. The ControlNet's cast is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from run.test_run_cli import run, write
from run.test_run_hunt26 import _report

GRU_TAGGER = """
    import torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rnn = nn.GRU(8, 8, batch_first=True).to(device)
    head = nn.Linear(8, 3).to(device)
    x = torch.randn(4, 6, 8, device=device)
    out, _ = rnn(x)
    loss = head(out).logsumexp(-1).mean()
    loss.backward()
    print("shape", tuple(out.shape))
"""

CPU_AUTOCAST = """
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lin = torch.nn.Linear(8, 8).to(device)
    x = torch.randn(2, 8, device=device, dtype=torch.float16)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        y = lin(x)
    print(y.dtype)
"""


def test_a_batch_first_gru_runs_clean(tmp_path: Path) -> None:
    write(tmp_path / "app.py", GRU_TAGGER)
    proc = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    assert "shape (4, 6, 8)" in proc.stdout, proc.stdout + proc.stderr
    report = _report(proc)
    assert report["ok"] and not report["problems"], report["problems"]


def test_autocast_for_the_cpu_does_not_hide_a_cuda_dtype_mismatch(tmp_path: Path) -> None:
    write(tmp_path / "app.py", CPU_AUTOCAST)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    assert not report["ok"]
    assert any(p["kind"] == "dtype" and p["found"] == "float16" and p["expected"] == "float32"
               for p in report["problems"]), report["problems"]


CONTROLNET = """
    import torch
    from diffusers import ControlNetModel, UNet2DConditionModel
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16
    kw = dict(in_channels=4, layers_per_block=1, block_out_channels=(32, 64),
              down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), cross_attention_dim=32,
              norm_num_groups=8, attention_head_dim=8)
    unet = UNet2DConditionModel(sample_size=8, out_channels=4, up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                                **kw).to(device, dtype).eval()
    controlnet = ControlNetModel(conditioning_embedding_out_channels=(8, 16), **kw).to(device).eval()
    latents = torch.randn(1, 4, 8, 8, device=device, dtype=dtype)
    cond = torch.randn(1, 7, 32, device=device, dtype=dtype)
    hint = torch.rand(1, 3, 16, 16, device=device, dtype=dtype)
    with torch.no_grad():
        down, mid = controlnet(latents, 500, encoder_hidden_states=cond, controlnet_cond=hint, return_dict=False)
        eps = unet(latents, 500, encoder_hidden_states=cond, down_block_additional_residuals=down,
                   mid_block_additional_residual=mid).sample
"""


def test_no_cast_of_a_module_already_in_that_dtype(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    write(tmp_path / "app.py", CONTROLNET)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    codes = [f["code"] for f in report["fixes"]]
    assert not any(x in c for c in codes for x in ("move(unet, torch.bfloat16)", "move(unet, dtype)", "unet.to(")), codes
    assert any(c.startswith("controlnet.to(dtype)") for c in codes), codes  # (the program's name for its dtype)

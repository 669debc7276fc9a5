"""A generator made on cuda handed to a pipeline never moved (real diffusers ``DDPMPipeline`` with a tiny
``UNet2DModel``, SD.Next with offload "none"): diffusers' ``randn_tensor`` refuses ("Cannot generate a cpu tensor
from a generator of type cuda."). ``torchdoctor run`` names the generator and its line, the pipeline the program
called and where its modules are, and moves the pipeline before the call (a patch), by the program's own names —
never a name the program does not have (explain's ``latents``); the patched program runs clean, and the moved
pipeline (the control) is quiet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

APP = """
    import torch
    from diffusers import UNet2DModel, DDPMPipeline, DDPMScheduler
    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(4, 8),
                       norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D"))
    pipe = DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=4))
    gen = torch.Generator("cuda").manual_seed(42)
    image = pipe(batch_size=1, generator=gen, num_inference_steps=1, output_type="np").images
    print("image", image.shape)
"""


def _run(root: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "--json", "app.py"],
                          cwd=root, env=ENV, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = proc.stdout
    return proc, json.loads(out[out.index('{\n  "schema"'):])


def test_a_cuda_generator_for_a_pipeline_left_on_the_cpu_moves_the_pipeline(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent(APP).lstrip())
    proc, doc = _run(tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = doc["findings"][0]
    assert "Cannot generate a cpu tensor from a generator of type cuda." in finding["error"], finding
    assert finding["culprit"].startswith("culprit `gen` (a torch.Generator on cuda:0, made at app.py:8) handed to "
                                         "`pipe` (DDPMPipeline), whose modules are all on cpu"), finding["culprit"]
    assert finding["fix_from"] == "run", finding
    assert finding["fix"].startswith("pipe.to(\"cuda\")  # before app.py:9: move `pipe` where `gen` draws") or \
        finding["fix"].startswith("pipe.to('cuda')  # before app.py:9: move `pipe` where `gen` draws"), finding["fix"]
    assert "fix proven (on copies: the call drew for cpu, the device of its modules (cpu)" in finding["fix"]
    assert "latents" not in finding["fix"] and "seed" not in finding["fix"], finding["fix"]
    assert "+pipe.to('cuda')" in finding["diff"] or '+pipe.to("cuda")' in finding["diff"], finding["diff"]
    subprocess.run(["git", "init", "-q", "."], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=doc["patch"], text=True, check=True)
    again, doc2 = _run(tmp_path)
    assert again.returncode == 0 and doc2["findings"] == [] and doc2["problems"] == [], again.stderr[-2000:]
    assert "image (1, 8, 8, 3)" in again.stdout


def test_a_library_draw_the_program_calls_directly_keeps_its_device_label(tmp_path: Path) -> None:
    """No object of the program's is called (``randn_tensor`` itself): nothing to move, the finding is as before."""
    (tmp_path / "app.py").write_text(textwrap.dedent("""
        import torch
        from diffusers.utils.torch_utils import randn_tensor
        gen = torch.Generator("cuda").manual_seed(42)
        latents = randn_tensor((1, 4), generator=gen, device=torch.device("cpu"))
    """).lstrip())
    proc, doc = _run(tmp_path)
    assert proc.returncode == 1
    assert doc["findings"][0]["fix_from"] != "run" and not doc["findings"][0].get("diff"), doc["findings"][0]

"""Outputs saved from a virtual run are real files (issue 40, points 2 and 8): ComfyUI's SaveLatent (safetensors
with metadata, of ``samples``) and SaveImage (``255. * image.cpu().numpy()`` -> clip -> uint8 -> PIL -> png),
re-created in a few lines, finish under ``torchdoctor run --device cuda:0`` and ``--device xpu`` and the files
read back with the right shapes and dtypes; in a subprocess under a timeout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from run.test_run_cli import run, write

NODES = """
    import json
    import numpy as np
    import torch
    from PIL import Image
    from safetensors.torch import save_file

    device = torch.device(torch.accelerator.current_accelerator().type, 0)  # the app's own choice

    def sample():  # a latent and a decoded image, made on the device
        torch.manual_seed(0)
        latent = torch.randn(1, 4, 8, 8, device=device, dtype=torch.float16)
        image = torch.sigmoid(torch.randn(1, 16, 16, 3, device=device))
        return latent, image

    def save_latent(samples, path):  # SaveLatent: a dict of tensors, with metadata
        output = {"latent_tensor": samples["samples"].contiguous(), "latent_format_version_0": torch.tensor([])}
        save_file(output, path, metadata={"prompt": json.dumps({"1": "test"})})

    def save_image(images, path):  # SaveImage
        for image in images:
            i = 255. * image.cpu().numpy()
            img = Image.fromarray(np.clip(i, 0, 255).astype(np.uint8))
            img.save(path, compress_level=4)

    latent, image = sample()
    save_latent({"samples": latent}, "latent.latent")
    save_image(image, "image.png")
    print("saved on", latent.device, image.device)
"""


@pytest.mark.parametrize("device", ["cuda:0", "xpu"])
def test_save_latent_and_save_image_finish_and_read_back(tmp_path: Path, device: str) -> None:
    script = write(tmp_path / "main.py", NODES)
    proc = run("--device", device, "--json", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kind = device.split(":")[0]
    assert f"saved on {kind}:0 {kind}:0" in proc.stdout
    doc = json.loads(proc.stdout[proc.stdout.index("\n{") + 1:])
    assert doc["ok"] and doc["problems"] == []

    import numpy as np
    import torch
    from PIL import Image
    from safetensors import safe_open

    with safe_open(str(tmp_path / "latent.latent"), "pt") as f:
        assert json.loads(f.metadata()["prompt"]) == {"1": "test"}
        latent = f.get_tensor("latent_tensor")
    assert latent.shape == (1, 4, 8, 8) and latent.dtype == torch.float16 and latent.abs().sum() > 0
    torch.manual_seed(0)
    assert torch.equal(latent, torch.randn(1, 4, 8, 8, dtype=torch.float16))  # the values the program computed
    img = np.asarray(Image.open(tmp_path / "image.png"))
    assert img.shape == (16, 16, 3) and img.dtype == np.uint8 and 0 < img.mean() < 255

"""A host tensor moved to meet fp16 / bf16 data on the device is moved and cast in one fix: a device-only fix of a
float32 numpy mask (``torch.from_numpy(m).float()``) would promote the latents it multiplies to float32 silently."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.apps import run_json

MASK = """\
import numpy as np, torch
def apply_mask(latent, np_mask):
    mask = torch.from_numpy(np_mask).float() / 255.0
    return latent * mask
latent = torch.randn(1, 4, 8, 8, device="cuda", dtype=torch.{dtype})
np_mask = (np.random.rand(8, 8) > 0.5).astype(np.uint8) * 255
print("result", apply_mask(latent, np_mask).dtype)
"""

IMAGE = """\
import numpy as np, torch
def blend(x, image):
    img = torch.from_numpy(image)
    return x + img
x = torch.zeros(3, 4, device="cuda", dtype=torch.bfloat16)
print("result", blend(x, np.ones((3, 4), dtype=np.float32)).dtype)
"""


def _applied(tmp_path: Path, text: str) -> tuple[dict, str]:
    app = tmp_path / "app.py"
    app.write_text(text)
    doc = run_json(app, "cuda")
    subprocess.run(["git", "init", "-q", "."], cwd=tmp_path, check=True)
    (tmp_path / "p.diff").write_text(doc["patch"])
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True)
    again = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "app.py"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    return doc, again.stdout + again.stderr


def test_a_numpy_mask_is_moved_and_cast_to_the_latents_dtype(tmp_path: Path) -> None:
    doc, again = _applied(tmp_path, MASK.format(dtype="float16"))
    (fix,) = doc["fixes"]
    assert "torch.from_numpy(...).to(latent.device, latent.dtype)" in fix["code"] and fix["proven"], fix
    assert "+    mask = torch.from_numpy(np_mask).to(latent.device, latent.dtype) / 255.0" in doc["patch"]
    assert "result torch.float16" in again and "no placement error" in again, again


def test_float32_image_data_added_to_bf16_is_cast_too(tmp_path: Path) -> None:
    doc, again = _applied(tmp_path, IMAGE)
    assert "+    img = torch.from_numpy(image).to(x.device, x.dtype)" in doc["patch"], doc["patch"]
    assert "result torch.bfloat16" in again and "no placement error" in again, again


def test_float32_latents_keep_the_device_only_fix(tmp_path: Path) -> None:
    doc, again = _applied(tmp_path, MASK.format(dtype="float32"))
    assert "+    mask = torch.from_numpy(np_mask).to(latent.device).float() / 255.0" in doc["patch"], doc["patch"]
    assert "result torch.float32" in again and "no placement error" in again, again

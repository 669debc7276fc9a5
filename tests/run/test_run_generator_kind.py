"""A generator on one device drawing for a tensor on another (diffusers' ``randn_tensor``: "Cannot generate a cpu
tensor from a generator of type cuda.", an SD.Next run with the model never moved) is a device error, said as one:
never "dtype mismatch"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from torchdoctor._guard.message import kind_of

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def test_the_generator_text_is_a_device_kind() -> None:
    assert kind_of("Cannot generate a cpu tensor from a generator of type cuda.") == "device"
    assert kind_of("expected scalar type Float but found BFloat16") == "dtype"


def test_run_says_device_mismatch_for_a_cuda_generator_drawing_for_the_cpu(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent("""
        import torch
        from diffusers.utils.torch_utils import randn_tensor
        generator = torch.Generator("cuda").manual_seed(42)
        latents = randn_tensor((1, 4), generator=generator, device=torch.device("cpu"))
    """))
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "app.py"], cwd=tmp_path,
                          env=ENV, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr
    assert "Cannot generate a cpu tensor from a generator of type cuda." in proc.stderr
    assert "device mismatch outside the guarded model" in proc.stderr, proc.stderr
    assert "dtype mismatch" not in proc.stderr

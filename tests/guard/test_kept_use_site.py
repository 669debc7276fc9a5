"""guard and ``run`` on the CPU (the real error) on a reused pipeline whose first call upcasts its ``force_upcast`` VAE in
place: the second call hands the VAE the denoiser's float16 latents (diffusers #14183). The latents' maker also feeds
the float16 denoiser, so a fix there breaks it (and the next run would propose the reverse): the latents are cast where
the program hands them to the VAE (``self.vae.decode(latents.to(self.vae.dtype) / …)``, the fix of diffusers PR
#14184), never the VAE. Applied, the whole program — both calls, denoiser included — runs clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torchdoctor
from support.apps import committed, load_file

pytest.importorskip("diffusers")

APP = """\
    import torch
    from torch import nn
    from diffusers import AutoencoderKL


    class Pipe:
        def __init__(self, transformer, vae):
            self.transformer, self.vae = transformer, vae

        @torch.no_grad()
        def __call__(self, steps):
            latents = torch.randn(1, 4, 8, 8, dtype=torch.float16)
            for _ in range(steps):
                latents = latents - 0.1 * self.transformer(latents)
            if self.vae.dtype == torch.float16 and self.vae.config.force_upcast:
                self.vae.to(torch.float32)
                latents = latents.to(torch.float32)
            image = self.vae.decode(latents / self.vae.config.scaling_factor, return_dict=False)[0]
            return image.float()


    def build():
        vae = AutoencoderKL(block_out_channels=(8,), down_block_types=("DownEncoderBlock2D",),
                            up_block_types=("UpDecoderBlock2D",), latent_channels=4, norm_num_groups=8,
                            sample_size=16, force_upcast=True).to(torch.float16)
        return Pipe(nn.Conv2d(4, 4, 1).to(torch.float16), vae)


    def main(pipe):
        pipe(1)
        return pipe(2)


    if __name__ == "__main__":
        main(build())
"""

FIXED = "image = self.vae.decode(latents.to(self.vae.dtype) / self.vae.config.scaling_factor, return_dict=False)[0]"
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")


def _app(tmp_path: Path) -> Path:
    path = tmp_path / "reuse.py"
    path.write_text(textwrap.dedent(APP), encoding="utf-8")
    committed(tmp_path)
    return path


def _apply(tmp_path: Path, patch: str) -> None:
    (tmp_path / "fix.diff").write_text(patch, encoding="utf-8")
    done = subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@needs_git
def test_guard_casts_the_latents_at_the_decode_not_where_the_denoiser_gets_them_too(tmp_path: Path) -> None:
    path = _app(tmp_path)
    mod = load_file(path, "kept_use_guard")
    pipe = mod.build()
    with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(pipe.vae, mode="explain"):
        mod.main(pipe)
    e, text = info.value, str(info.value)
    assert e.fix is not None and e.fix.startswith(FIXED + "  # reuse.py:18: latents cast where self.vae is handed it")
    assert "`AutoencoderKL` computes in float32 on purpose (its config sets force_upcast)" in text
    assert "fix proven: Conv2d runs on the inputs it failed on cast to float32 (guard re-runs the failing layer, " \
        "not the whole program)" in text
    assert "torch.float32)  # reuse.py:12" not in e.fix and ".to(torch.float16)" not in e.fix  # never the maker
    _apply(tmp_path, e.patch or "")
    fixed = load_file(path, "kept_use_guard_fixed")
    pipe = fixed.build()
    with torchdoctor.guard(pipe.vae, mode="explain"):  # both calls: the denoiser still reads float16 latents
        fixed.main(pipe)
    assert pipe.vae.dtype == torch.float32


@needs_git
def test_run_on_the_cpu_names_the_vae_kept_in_float32_and_casts_the_latents_at_the_decode(tmp_path: Path) -> None:
    path = _app(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", path.name], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "`AutoencoderKL` computes in float32 on purpose (its config sets force_upcast)" in out
    assert "the component is the odd one out" not in out and "model.to(torch.float16)" not in out
    fix = out[out.index("  fix:\n"):]
    assert fix.split("\n")[1].strip().startswith(FIXED + "  # reuse.py:18: "), fix
    lines = fix[fix.index("patch (git apply):\n"):].splitlines()[1:]
    patch = [line[4:] for line in lines[:next((i for i, x in enumerate(lines) if not x.startswith("    ")), None)]]
    _apply(tmp_path, "\n".join(patch) + "\n")
    again = subprocess.run([sys.executable, "reuse.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr

"""A component the program keeps in its own dtype or on its own device on purpose, fed an input made for another
component, is fixed where the program hands it that input, never by casting or moving the component and never at the
input's maker (the other component reads it too): a diffusers VAE whose config sets ``force_upcast``, upcast in place
by a pipeline's first call and fed the denoiser's float16 latents on the second (diffusers #14183); a decoder the app
casts to float32 itself; a VAE an app's model cache keeps on the cpu while the latents are on the GPU (InvokeAI
#9293). One cause, one problem; the fix a diff proven at the failing op, and the patched program runs clean."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

import torchdoctor
from support.apps import committed, load_file

REUSED = """\
    import torch
    from torch import nn
    from diffusers import AutoencoderKL


    class Denoiser(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Conv2d(4, 4, 1)

        def forward(self, x):
            return self.proj(x)


    class Pipe:
        def __init__(self, transformer, vae):
            self.transformer, self.vae = transformer, vae

        @torch.no_grad()
        def __call__(self, steps):
            latents = torch.randn(1, 4, 8, 8).to("cuda", torch.float16)
            for _ in range(steps):
                latents = latents - 0.1 * self.transformer(latents)
            if self.vae.dtype == torch.float16 and self.vae.config.force_upcast:
                self.vae.to(torch.float32)
                latents = latents.to(torch.float32)
            image = self.vae.decode(latents / self.vae.config.scaling_factor, return_dict=False)[0]
            return image.float().cpu()


    def main():
        vae = AutoencoderKL(block_out_channels=(8,), down_block_types=("DownEncoderBlock2D",),
                            up_block_types=("UpDecoderBlock2D",), latent_channels=4, norm_num_groups=8,
                            sample_size=16, force_upcast=True).to("cuda", torch.float16)
        pipe = Pipe(Denoiser().to("cuda", torch.float16), vae)
        pipe(1)
        return pipe(2)
"""

PLAIN = """\
    import torch
    from torch import nn


    def main():
        den = nn.Conv2d(4, 4, 1).to("cuda", torch.float16)
        dec = nn.Sequential(nn.Conv2d(4, 3, 3, padding=1), nn.GroupNorm(1, 3)).to("cuda")
        dec.to(torch.float32)
        x = torch.randn(1, 4, 8, 8, device="cuda", dtype=torch.float16)
        for _ in range(2):
            x = x - 0.1 * den(x)
        img = dec(x)
        return den(x), img
"""

CACHE = """\
    import torch
    from torch import nn


    class Cache:
        def __init__(self, device):
            self.device = device

        def load(self, model, cpu_only):
            model.to(torch.device("cpu") if cpu_only else self.device)
            return model


    def decode(vae, latents):
        latents = latents.to("cuda")
        return vae(latents).clamp(0, 1)


    def main():
        cache = Cache(torch.device("cuda"))
        vae = cache.load(nn.Sequential(nn.Conv2d(4, 3, 3, padding=1), nn.SiLU()), cpu_only=True)
        return decode(vae, torch.randn(1, 4, 8, 8, device="cuda"))
"""

NOT_KEPT = """\
    import torch
    from torch import nn


    def main():
        den = nn.Conv2d(4, 4, 1).to("cuda", torch.float16)
        dec = nn.Conv2d(4, 3, 3, padding=1).to("cuda")
        x = den(torch.randn(1, 4, 8, 8, device="cuda", dtype=torch.float16))
        return dec(x)
"""

SIMULATED = """\
    import torch
    from torch import nn


    class App(nn.Module):
        def __init__(self):
            super().__init__()
            self.den = nn.Conv2d(4, 4, 1)
            self.dec = nn.Sequential(nn.Conv2d(4, 3, 3, padding=1), nn.GroupNorm(1, 3))


    def run(app):
        app.den.to("cuda", torch.float16)
        app.dec.to("cuda", torch.float32)
        x = torch.randn(1, 4, 8, 8, device="cuda", dtype=torch.float16)
        x = x - 0.1 * app.den(x)
        return app.dec(x)
"""

CAST_AT_USE = """\
    import torch
    from torch import nn


    def main():
        weight_dtype = torch.float16
        enc = nn.Conv2d(3, 4, 3, padding=1).to("cuda", dtype=torch.float32)
        img = torch.rand(1, 3, 8, 8)
        a = enc(img.to("cuda", dtype=torch.float32))
        b = enc(img.to("cuda", dtype=weight_dtype))
        return torch.cat([a, b], 1)
"""

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")


def _run(path: Path, name: str) -> Any:
    mod = load_file(path, name)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as s:
        mod.main()
    return s


def _app(tmp_path: Path, text: str, name: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    committed(tmp_path)
    return path


def _applied_clean(tmp_path: Path, path: Path, diff: str, name: str) -> None:
    (tmp_path / "fix.diff").write_text(diff, encoding="utf-8")
    done = subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    again = _run(path, name)
    assert not again.problems, [p.message for p in again.problems]


@needs_git
def test_a_force_upcast_vae_upcast_by_a_first_call_gets_the_latents_cast_at_the_decode(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    path = _app(tmp_path, REUSED, "reused")
    s = _run(path, "kept_reused")
    assert len(s.problems) == 1, [p.message for p in s.problems]  # one cause: the rest of the VAE ran in float32
    p = s.problems[0]
    assert (p.kind, p.found, p.expected, p.role) == ("dtype", "float16", "float32", "activation")
    [fix] = s.fixes
    code, _, why = fix.code.partition("  # at ")
    assert code == "image = self.vae.decode(latents.to(self.vae.dtype) / self.vae.config.scaling_factor, " \
        "return_dict=False)[0]", fix.code
    assert why.split(": ", 1)[0].endswith("reused.py:27") and ": AutoencoderKL computes in float32 on purpose (its " \
        "config sets force_upcast; " in why and "reused.py:25 casts it to float32); latents (float16, made by cast " \
        "at " in why and "reused.py:21) is made for another component: cast where self.vae is handed it" in why, why
    assert "never self.vae itself" in fix.code and "torchdoctor.move" not in fix.code
    assert fix.proven, fix.tried
    assert fix.diff is not None and "+        image = self.vae.decode(latents.to(self.vae.dtype) / " in fix.diff
    _applied_clean(tmp_path, path, fix.diff, "kept_reused_fixed")  # the denoiser still reads float16 latents


@needs_git
def test_a_decoder_the_program_casts_to_float32_itself_gets_its_input_cast_where_it_is_called(tmp_path: Path) -> None:
    path = _app(tmp_path, PLAIN, "plain")
    s = _run(path, "kept_plain")
    assert len(s.problems) == 1, [p.message for p in s.problems]
    [fix] = s.fixes
    # a plain nn.Module has no .dtype: its first parameter's, which follows the program's cast
    code, _, why = fix.code.partition("  # at ")
    assert code == "img = dec(x.to(next(dec.parameters()).dtype))", fix.code
    assert "plain.py:12: Sequential computes in float32 on purpose (" in why and "plain.py:8 casts it to float32); x " \
        "(float16) is made for another component" in why, why
    assert "never dec itself" in fix.code and fix.proven, fix.tried
    assert fix.diff is not None
    _applied_clean(tmp_path, path, fix.diff, "kept_plain_fixed")


@needs_git
def test_a_model_a_cache_keeps_on_the_cpu_gets_the_latents_moved_where_it_is_called(tmp_path: Path) -> None:
    path = _app(tmp_path, CACHE, "cache")
    s = _run(path, "kept_cache")
    assert len(s.problems) == 1, [p.message for p in s.problems]
    assert s.problems[0].found == "cuda:0"  # the latents, not the VAE's weights
    [fix] = s.fixes
    code, _, why = fix.code.partition("  # at ")
    assert code == "return vae(latents.to(next(vae.parameters()).device)).clamp(0, 1)", fix.code
    assert "cache.py:16: Sequential is kept on cpu on purpose (" in why and "cache.py:10 puts it there); latents " \
        "(cuda:0) is made for another component: moved where vae is handed it, never vae itself" in why, why
    assert fix.proven, fix.tried
    assert fix.diff is not None and "+    return vae(latents.to(next(vae.parameters()).device)).clamp(0, 1)\n" in \
        fix.diff
    _applied_clean(tmp_path, path, fix.diff, "kept_cache_fixed")


def test_a_component_the_program_never_put_in_its_dtype_is_not_kept(tmp_path: Path) -> None:
    # built in float32 by default and never cast: nothing says float32 is the program's choice
    path = tmp_path / "notkept.py"
    path.write_text(textwrap.dedent(NOT_KEPT), encoding="utf-8")
    s = _run(path, "kept_not")
    assert s.problems
    assert not any("on purpose" in f.code for f in s.fixes), [f.code for f in s.fixes]


def test_simulate_casts_an_input_another_component_reads_where_the_decoder_gets_it(tmp_path: Path) -> None:
    # the decoder is in the model's own dtype (float32) here, and x also feeds the float16 denoiser: a fix at x's
    # maker (dtype=torch.float32) would break the denoiser, so x is cast where the decoder is handed it
    path = tmp_path / "simapp.py"
    path.write_text(textwrap.dedent(SIMULATED), encoding="utf-8")
    mod = load_file(path, "kept_simulated")
    report = torchdoctor.simulate(mod.App(), device="cuda", call=mod.run)
    assert len(report.problems) == 1, [p.message for p in report.problems]
    [fix] = report.to_dict()["fixes"]
    assert fix["code"].startswith("return app.dec(x.to(next(app.dec.parameters()).dtype))  # at "), fix["code"]
    assert "dtype=torch.float32" not in fix["code"] and fix["proven"], fix["tried"]
    assert "a virtual re-run with the line changed" in fix["tried"], fix["tried"]


@needs_git
def test_an_input_cast_on_the_line_that_hands_it_over_gets_the_components_dtype_there(tmp_path: Path) -> None:
    # kohya's --no_half_vae (sd-scripts PR #2320): the masked image is encoded in weight_dtype by the VAE kept in
    # float32; the cast on the encode line itself is written with the component's dtype
    path = _app(tmp_path, CAST_AT_USE, "castuse")
    s = _run(path, "kept_cast_use")
    assert len(s.problems) == 1, [p.message for p in s.problems]
    [fix] = s.fixes
    code, _, why = fix.code.partition("  # at ")
    assert code == 'b = enc(img.to("cuda", dtype=next(enc.parameters()).dtype))', fix.code
    assert "castuse.py:10: Conv2d computes in float32 on purpose (" in why and "castuse.py:7 casts it to float32)" \
        in why and fix.proven, (why, fix.tried)
    assert fix.diff is not None
    _applied_clean(tmp_path, path, fix.diff, "kept_cast_use_fixed")

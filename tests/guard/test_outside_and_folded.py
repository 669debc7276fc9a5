"""Issue 41 for guard, the last gaps: an error raised in the user's code between modules (a scheduler step, a
matmul with a host-made tensor) keeps its note — the maker, the fix aimed at it, the proof and the diff — in
every mode, as an error inside a module does; a float32 component in a float16 model is one finding (count and
first paths) with one fix, in explain, strict, fix and warn, never a line per tensor; a running statement of an
outer frame is never named as the maker of a tensor its callee made."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys
import types
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import torchdoctor

diffusers = pytest.importorskip("diffusers")
H = torch.float16
BF = torch.bfloat16

SOURCE = '''\
import numpy as np
import torch


def denoise(unet, latents):
    w = torch.from_numpy(np.ones((8, 8), dtype=np.float32))
    out = unet(latents)
    return out @ w


def step(unet, latents, i):
    sigmas = torch.tensor(np.linspace(1.0, 0.1, 10), dtype=torch.float32)
    unet(latents)
    sigma = sigmas[i:i + 1]
    return latents * sigma
'''
TEXT = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


def _git(repo: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture()
def app(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "proj"
    root.mkdir()
    assert _git(root, "init", "-q").returncode == 0
    (root / "app.py").write_text(SOURCE)
    return _load(root / "app.py", f"td_outside_{tmp_path.name}", monkeypatch)


def _load(path: pathlib.Path, name: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)
    spec.loader.exec_module(mod)
    return mod


class Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def _guarded(model: nn.Module, mode: str, call: Any, outer: Any = None) -> tuple[Any, Any, list[str]]:
    err = None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            with torch.no_grad(), (outer if outer is not None else torch.no_grad()), \
                    torchdoctor.guard(model, mode=mode) as g:
                call()
        except torchdoctor.PlacementError as e:
            err = e
    return err, g, [str(w.message) for w in seen if issubclass(w.category, torchdoctor.PlacementWarning)]


# --- an error between modules ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["explain", "strict", "fix", "warn"])
def test_a_host_made_tensor_between_modules_keeps_maker_fix_proof_and_diff(app: types.ModuleType,
                                                                           mode: str) -> None:
    net = Lin().to(BF)
    err, g, said = _guarded(net, mode, lambda: app.denoise(net, torch.randn(2, 8, dtype=BF)))
    assert (err is None) == (mode in ("fix", "warn"))
    data = g.report().to_dict()
    note = data["problems"][0]
    assert "made by `torch.from_numpy` at " in note["maker"] and "app.py:6 (`w = torch.from_numpy(" in note["maker"]
    assert note["fix"] == "w = torch.from_numpy(np.ones((8, 8), dtype=np.float32)).to(torch.bfloat16)  # app.py:6"
    assert note["proven"], note["proof"]
    assert "+    w = torch.from_numpy(np.ones((8, 8), dtype=np.float32)).to(torch.bfloat16)\n" in note["patch"]
    if mode == "explain":
        assert str(err).startswith("dtype mismatch outside the guarded model, at app.py:8")
        assert note["proof"] == "fix proven: `out @ w` runs again with w -> bfloat16"
        assert err.to_dict()["patch"] == note["patch"] and err.proof == note["proof"]
    if mode == "strict":
        assert str(err).startswith("dtype problem in code outside any module at aten.mm.default")
    if mode == "warn":
        assert len(said) == 1 and "in code outside any module" in said[0] and "NoneType" not in said[0]
    if mode == "fix":  # the diff, applied, makes the error go away
        root = pathlib.Path(app.__file__).parent
        (root / "fix.patch").write_text(note["patch"])
        assert _git(root, "apply", "fix.patch").returncode == 0, _git(root, "apply", "fix.patch").stderr
        fixed = _load(root / "app.py", "td_outside_fixed", pytest.MonkeyPatch())
        try:
            with torch.no_grad(), torchdoctor.guard(net, mode="strict"):
                assert fixed.denoise(net, torch.randn(2, 8, dtype=BF)).dtype == BF
        finally:
            sys.modules.pop("td_outside_fixed", None)


class GPUText(TorchDispatchMode):
    """What a real GPU raises when a tensor on cuda:0 (a label here) meets one on the CPU."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        ts = [a for a in args if isinstance(a, torch.Tensor) and a.dim() > 0]
        if len(ts) == 2 and len({"_td_device" in t.__dict__ for t in ts}) == 2:
            raise RuntimeError(TEXT)
        return func(*args, **(kwargs or {}))


class Noise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


@pytest.fixture()
def per_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU is a label here: strict's module-boundary gate compares real devices, so check every op."""
    import torchdoctor._virtual  # noqa: F401 - the rules read the labels in a process where it is loaded
    from torchdoctor._guard import fastpath

    monkeypatch.setattr(fastpath, "ENABLED", False)


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_schedule_table_made_on_the_cpu_is_named_at_its_factory_in_a_step_outside_the_model(
        app: types.ModuleType, per_op: None, mode: str) -> None:
    net = Noise()
    cuda = torch.device("cuda:0")
    net.scale._td_device = cuda  # type: ignore[attr-defined]
    latents = torch.randn(2, 8)
    latents._td_device = cuda  # type: ignore[attr-defined]
    err, g, _ = _guarded(net, mode, lambda: app.step(net, latents, 3), GPUText() if mode == "explain" else None)
    assert err is not None
    note = g.report().to_dict()["problems"][0]
    assert "made by `torch.tensor` at " in note["maker"] and "app.py:12" in note["maker"]
    assert note["maker"].endswith("with no device= (made on the CPU)")
    assert "dtype read from" not in note["maker"]  # `dtype=torch.float32` is written there, not read
    assert note["fix"] == ("sigmas = torch.tensor(np.linspace(1.0, 0.1, 10), dtype=torch.float32, "
                           "device=latents.device)  # app.py:12")
    assert "+    sigmas = torch.tensor(np.linspace(1.0, 0.1, 10), dtype=torch.float32, device=latents.device)\n" \
        in note["patch"]
    # no GPU here to move it to: unproven, with what was tried
    assert note["proof"].startswith("fix unproven: ") and "cuda:0" in note["proof"]
    if mode == "explain":
        assert "culprit sigma: f32[1]@cpu  (expected cuda:0)" in str(err)
        assert "`latents * sigma` re-run with sigma -> cuda:0" in note["proof"]


# --- a float32 component in a float16 model: one finding -------------------------------------------------------


class _Pipe(nn.Module):
    def __init__(self, unet: nn.Module, vae: nn.Module) -> None:
        super().__init__()
        self.unet, self.vae = unet, vae

    def forward(self, sample: torch.Tensor) -> torch.Tensor:
        lat = self.unet(sample)
        return self.vae.decode(lat / 0.18).sample


def _unet() -> nn.Module:  # a denoiser larger than the tiny VAE: the float16 majority
    return nn.Sequential(nn.Conv2d(4, 200, 3, padding=1), nn.Conv2d(200, 4, 3, padding=1))


def _vae(force_upcast: bool = True) -> nn.Module:
    return diffusers.AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=4, layers_per_block=1,
                                   force_upcast=force_upcast)


@pytest.fixture(scope="module")
def pipe() -> _Pipe:
    torch.manual_seed(0)
    return _Pipe(_unet().to(H), _vae())  # the VAE left in float32


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(1, 4, 4, 4, dtype=H),)


@pytest.mark.parametrize("mode", ["explain", "strict", "fix", "warn"])
def test_a_float32_vae_in_a_float16_model_is_one_finding_with_one_fix(pipe: _Pipe, mode: str) -> None:
    err, g, said = _guarded(pipe, mode, lambda: pipe(*_inputs()))
    assert (err is None) == (mode in ("fix", "warn"))
    notes = g.report().to_dict()["problems"]
    assert notes and all(n["fix"] == "model.vae.to(torch.float16)" for n in notes), [n["fix"] for n in notes]
    if err is not None:
        text = str(err)
        assert "also off-policy" not in text, text  # the VAE's other tensors are counted in its one finding
        n = sum(1 for t in pipe.vae.parameters())
        assert f"culprit `vae`: every tensor in it is float32 while the rest of the model is float16 ({n} tensors: " \
               "vae.encoder.conv_in.weight, vae.encoder.conv_in.bias, " in text
        assert err.fix == "model.vae.to(torch.float16)"
        assert err.proof == "fix proven: the whole forward runs again on a copy of the model with `vae` -> float16"
    if mode == "warn":  # one warning for the component, not one per layer of it
        assert len(said) == 1 and "fix (proven): model.vae.to(torch.float16)" in said[0], said
    if mode in ("fix", "warn"):
        assert len(g.fixes) > 2 and all(f.code == "model.vae.to(torch.float16)" for f in g.fixes)
    assert next(pipe.vae.parameters()).dtype == torch.float32  # the proof cast a copy


class _DPipe(diffusers.DiffusionPipeline):  # type: ignore[misc,name-defined]
    def __init__(self, unet: nn.Module, vae: nn.Module) -> None:
        super().__init__()
        self.register_modules(unet=unet, vae=vae)

    def __call__(self, sample: torch.Tensor) -> torch.Tensor:
        lat = self.unet(sample)
        return self.vae.decode(lat / 0.18).sample


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_in_a_pipeline_the_vae_is_the_culprit_and_the_callers_line_is_not_its_inputs_maker(
        pipe: _Pipe, mode: str) -> None:
    torch.manual_seed(0)
    dp = _DPipe(pipe.unet, _vae(force_upcast=False))  # float32 by nobody's choice: its config asks for no upcast
    err, g, _ = _guarded(dp, mode, lambda: dp(torch.randn(1, 4, 4, 4, dtype=H)))
    assert err is not None
    text = str(err)
    assert "culprit `vae`: computes in float32 while the rest of the pipeline feeds it float16" in text
    assert (err.fix or "").startswith("pipe.vae.to(torch.float16)  # or load it with torch_dtype=torch.float16")
    assert err.proof is not None and err.proof.startswith("fix proven")
    # the VAE's input is `lat / 0.18`, made in the pipeline's __call__: the caller's `dp(torch.randn(...))` line
    # passed other tensors and is not where it was made
    assert "made by `torch.randn`" not in text, text


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_in_a_pipeline_a_vae_kept_in_float32_gets_its_latents_cast_where_the_pipeline_decodes(pipe: _Pipe,
                                                                                            mode: str) -> None:
    dp = _DPipe(pipe.unet, pipe.vae)  # its config sets force_upcast: float32 is what it asks for at the decode
    err, _, _ = _guarded(dp, mode, lambda: dp(torch.randn(1, 4, 4, 4, dtype=H)))
    assert err is not None
    text = str(err)
    assert "`AutoencoderKL` computes in float32 on purpose (its config sets force_upcast)" in text, text
    assert (err.fix or "").startswith("return self.vae.decode(lat.to(self.vae.dtype) / 0.18).sample  # "
                                      "test_outside_and_folded.py:"), err.fix
    assert "vae.to(torch.float16)" not in (err.fix or "") and "+        return self.vae.decode(lat.to(" \
        "self.vae.dtype) / 0.18).sample\n" in (err.patch or ""), err.patch

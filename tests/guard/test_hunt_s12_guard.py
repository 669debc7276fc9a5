"""Session 12's hunt, guard (issue 41 points 1, 2, 5): each report's printed fix is aimed at the maker, and applied
to the user's file (its ``git apply`` diff, or the printed line) the program runs."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys
import types
import warnings
from typing import Any

import numpy as np
import pytest
import torch

import torchdoctor

BF = torch.bfloat16


def _git(repo: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture()
def project(tmp_path: pathlib.Path) -> pathlib.Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "proj"
    root.mkdir()
    assert _git(root, "init", "-q").returncode == 0
    return root


def _load(path: pathlib.Path, name: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)  # inspect reads a class's source through its module
    spec.loader.exec_module(mod)
    return mod


def _fails(mod: types.ModuleType, mode: str) -> Any:
    """The error ``mod.app`` raises under guard in ``mode`` (a PlacementError, or the error it explained)."""
    model = mod.build()
    with pytest.raises(Exception) as info:
        with torchdoctor.guard(model, mode=mode):
            mod.app(model)
    return info.value


def _applied(project: pathlib.Path, patch: str | None, name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The patch applied with git, the file loaded again and its ``app`` run under strict guard: its result."""
    assert patch is not None
    (project / "fix.patch").write_text(patch)
    done = _git(project, "apply", "fix.patch")
    assert done.returncode == 0, done.stderr
    fixed = _load(project / "app.py", name, monkeypatch)
    model = fixed.build()
    with torchdoctor.guard(model, mode="strict"):
        return fixed.app(model)


def _reset(project: pathlib.Path, source: str) -> None:
    (project / "app.py").write_text(source)


DTYPE_NONE = '''\
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        gate = torch.ones(4, dtype=None)
        return self.b(self.a(x) * gate)


def build():
    return Gate().to(torch.bfloat16)


def app(m):
    return m(torch.ones(2, 4, dtype=torch.bfloat16))
'''


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_factory_told_dtype_none_is_a_default_dtype_factory(project: pathlib.Path, mode: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, DTYPE_NONE)
    err = _fails(_load(project / "app.py", f"td_h3_none_{mode}", monkeypatch), mode)
    assert "made by `torch.ones` at " in str(err) and "app.py:12" in str(err)
    assert err.fix == "gate = torch.ones(4, dtype=torch.bfloat16)  # app.py:12"
    assert "-        gate = torch.ones(4, dtype=None)\n+        gate = torch.ones(4, dtype=torch.bfloat16)\n" in err.patch
    assert err.proof.startswith("fix proven")
    assert _applied(project, err.patch, f"td_h3_none_{mode}_fixed", monkeypatch).dtype == BF


def test_strict_on_every_op_stops_at_the_promoting_mul_of_a_dtype_none_factory(
        project: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, DTYPE_NONE)
    mod = _load(project / "app.py", "td_h3_none_every", monkeypatch)
    model = mod.build()
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.guard(model, mode="strict", every_op=True):
            mod.app(model)
    assert info.value.op == "aten.mul.Tensor" and "promotes the model's bfloat16" in str(info.value)
    assert info.value.fix == "gate = torch.ones(4, dtype=torch.bfloat16)  # app.py:12"


NUMPY = '''\
import numpy as np
import torch
from torch import nn


def build():
    return nn.Sequential(nn.Linear(8, 12), nn.Sigmoid()).to(torch.bfloat16)


def save(images):
    arr = (255.0 * images.cpu().numpy()).clip(0, 255).astype(np.uint8)
    return np.asarray(images.detach()).shape, arr


@torch.inference_mode()
def app(m):
    images = m(torch.randn(1, 8, dtype=torch.bfloat16)).view(-1, 2, 2, 3)
    return save(images)
'''


@pytest.mark.parametrize("mode", ["explain", "strict", "fix"])
def test_numpy_of_a_bf16_tensor_is_explained_with_the_cast_at_its_line(project: pathlib.Path, mode: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, NUMPY)
    err = _fails(_load(project / "app.py", f"td_h3_np_{mode}", monkeypatch), mode)
    assert isinstance(err, TypeError)  # the program's own error, with guard's note
    said = str(err)  # in the message itself, not a note some frontends drop
    assert not getattr(err, "__notes__", None)
    assert str(err).startswith("Got unsupported ScalarType BFloat16")
    assert "`images.cpu().numpy()` converts a bfloat16 tensor, and numpy has no bfloat16" in said
    # both conversions of the tensor in the function, :11 and :12, fixed in one patch, each proven on a CPU copy
    assert "fix proven: the 2 conversions (`images.float().cpu().numpy()`, `np.asarray(images.float().detach())`) " \
           "run on CPU copies (ndarray of float32)" in said, said
    assert "images is converted again at app.py:12: each conversion is fixed" in said
    assert "arr = (255.0 * images.float().cpu().numpy()).clip(0, 255).astype(np.uint8)  # app.py:11" in said
    assert "return np.asarray(images.float().detach()).shape, arr  # app.py:12" in said
    patch = said.split("Patch (git apply):\n", 1)[1]
    patch = "\n".join(line[4:] for line in patch.splitlines()) + "\n"
    (project / "fix.patch").write_text(patch)
    assert _git(project, "apply", "fix.patch").returncode == 0
    fixed = _load(project / "app.py", f"td_h3_np_{mode}_2", monkeypatch)  # one patch: the program runs through
    model = fixed.build()
    with torchdoctor.guard(model, mode=mode):
        shape, arr = fixed.app(model)
    assert shape == (1, 2, 2, 3) and arr.dtype == np.uint8


HUBER = '''\
import torch
import torch.nn.functional as F
from torch import nn


def build():
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).to(torch.bfloat16)


def app(m):
    latents = torch.randn(2, 8, dtype=torch.bfloat16)
    noise = torch.randn_like(latents)
    noise_pred = m(latents + noise)
    target = noise
    loss = F.huber_loss(noise_pred.float(), target, reduction="none", delta=0.1).mean()
    loss.backward()
    return loss
'''
HUBER_FIX = 'loss = F.huber_loss(noise_pred.float(), target.float(), reduction="none", delta=0.1).mean()  # app.py:15'


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_bf16_target_beside_the_users_float_cast_is_the_culprit_not_the_cast(
        project: pathlib.Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, HUBER)
    err = _fails(_load(project / "app.py", f"td_h3_huber_{mode}", monkeypatch), mode)
    assert isinstance(err, torchdoctor.PlacementError)
    assert "culprit target: bf16[2,8]@cpu  (expected float32: it meets `.float()` at app.py:15" in str(err)
    assert err.fix == HUBER_FIX and "noise_pred.to(" not in err.fix  # the trainer's upcast stays
    assert err.proof.startswith("fix proven: `F.huber_loss(noise_pred.float(), target")
    assert err.proof.endswith("with target.float() runs forward and backward on copies")
    loss = _applied(project, err.patch, f"td_h3_huber_{mode}_fixed", monkeypatch)
    assert loss.dtype == torch.float32


def test_fix_mode_aligns_the_target_to_the_loss_not_the_users_cast_to_the_model(
        project: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, HUBER)
    mod = _load(project / "app.py", "td_h3_huber_fixmode", monkeypatch)
    model = mod.build()
    with torchdoctor.guard(model, mode="fix") as g:
        assert mod.app(model).dtype == torch.float32
    first = g.report().to_dict()["problems"][0]
    assert (first["path"], first["found"], first["expected"]) == ("arg 1 (target)", "bfloat16", "float32")
    assert first["fix"] == HUBER_FIX and first["proven"]
    assert "-    loss = F.huber_loss(noise_pred.float(), target, " in first["patch"]


def test_warn_mode_tells_the_loss_once_and_its_backward_carries_the_same_fix(
        project: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """autograd saved the bf16 target as it was: huber_loss_backward meets it again. That is the same problem, one
    warning, and its alignment carries the loss line's fix, never `# pass arg 2 (target) as tensor...`."""
    _reset(project, HUBER)
    mod = _load(project / "app.py", "td_h3_huber_warnmode", monkeypatch)
    model = mod.build()
    with warnings.catch_warnings(record=True) as w, torchdoctor.guard(model, mode="warn") as g:
        warnings.simplefilter("always")
        mod.app(model)
    told = [str(x.message) for x in w if issubclass(x.category, torchdoctor.PlacementWarning)]
    assert len(told) == 1 and "aten.huber_loss.default: arg 1 (target) is bfloat16" in told[0]
    assert [f.op for f in g.fixes] == ["aten.huber_loss.default", "aten.huber_loss_backward.default"]
    assert all(f.code == HUBER_FIX and f.proven for f in g.fixes)


LERP = '''\
import torch
from torch import nn


def build():
    return nn.Linear(8, 8).to(torch.bfloat16)


def opt_step(params, state, beta2=0.95):
    for p in params:
        st = state.setdefault(p, {})
        if "buf" not in st:
            st["buf"] = torch.zeros(p.shape[0], 1, device=p.device, dtype=torch.float32)
        v_mean = (p.grad * p.grad).mean(dim=-1, keepdim=True) if p.grad.ndim > 1 else p.grad[:, None] ** 2
        st["buf"].lerp_(v_mean, 1 - beta2)
    return state


def app(m):
    m(torch.randn(2, 8, dtype=torch.bfloat16)).float().pow(2).mean().backward()
    return opt_step(list(m.parameters()), {})
'''
LERP_FIX = 'st["buf"].lerp_(v_mean.float(), 1 - beta2)  # app.py:15'


@pytest.mark.parametrize("mode", ["explain", "strict", "fix"])
def test_an_optimizer_lerp_after_backward_is_told_at_its_line_with_the_state_maker(
        project: pathlib.Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, LERP)
    mod = _load(project / "app.py", f"td_h3_lerp_{mode}", monkeypatch)
    if mode == "fix":
        model = mod.build()
        with torchdoctor.guard(model, mode="fix") as g:
            mod.app(model)
        note = g.report().to_dict()["problems"][0]
        fix, patch, maker, proof = note["fix"], note["patch"], note["maker"], note["proof"]
        assert note["module_path"] is None and (note["found"], note["expected"]) == ("bfloat16", "float32")
    else:
        err = _fails(mod, mode)
        fix, patch, maker, proof, text = err.fix, err.patch, str(err), err.proof, str(err)
        assert "during backward" not in text and "<root>" not in text  # after backward, outside any module
        assert "culprit v_mean: bf16[8,1]@cpu  (expected float32)" in text
    assert fix == LERP_FIX
    assert "st['buf'] (written in place by `.lerp_`) made by `torch.zeros` at " in maker and "app.py:13" in maker
    assert proof.startswith("fix proven")
    state = _applied(project, patch, f"td_h3_lerp_{mode}_fixed", monkeypatch)
    assert all(s["buf"].dtype == torch.float32 for s in state.values())


TE = '''\
import torch
from accelerate import cpu_offload_with_hook
from torch import nn


class TE(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(16, 8)
        self.enc = nn.Linear(8, 8)

    def forward(self, ids):
        return self.enc(self.tok(ids))


class Pipe(nn.Module):
    def __init__(self):
        super().__init__()
        self.text_encoder = TE()
        self.text_encoder_2 = TE()
        self.proj = nn.Linear(8, 8)
        self.blocks = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])

    def forward(self, ids, x):
        return self.blocks(x + self.proj(self.text_encoder(ids)) + self.text_encoder_2(ids))


def build():
    m = Pipe().to(torch.bfloat16)
    m.text_encoder.to(torch.float16)
    hook = None
    for comp in (m.text_encoder, m.text_encoder_2):
        _, hook = cpu_offload_with_hook(comp, execution_device=torch.device("cpu"), prev_module_hook=hook)
    return m


def app(m):
    return m(torch.tensor([[1, 2, 3]]), torch.randn(1, 3, 8, dtype=torch.bfloat16))
'''


@pytest.mark.parametrize("mode", ["explain", "strict", "warn"])
def test_a_component_whose_every_tensor_differs_gets_the_component_line(
        project: pathlib.Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("accelerate")
    _reset(project, TE)
    mod = _load(project / "app.py", f"td_h3_te_{mode}", monkeypatch)
    if mode == "warn":
        model = mod.build()
        with pytest.warns(torchdoctor.PlacementWarning), torchdoctor.guard(model, mode="warn") as g:
            mod.app(model)
        fix, proof = g.report().to_dict()["problems"][0]["fix"], g.report().to_dict()["problems"][0]["proof"]
    else:
        err = _fails(mod, mode)
        fix, proof = err.fix, err.proof
        assert "culprit `text_encoder`: every tensor in it is float16" in str(err)
    assert fix == "model.text_encoder.to(torch.bfloat16)"
    assert proof is not None and "`text_encoder` -> bfloat16" in proof and proof.startswith("fix proven")
    model = mod.build()
    exec(fix, {"model": model, "torch": torch})  # the printed fix, as the user pastes it
    with torchdoctor.guard(model, mode="strict"):
        assert mod.app(model).dtype == BF


SCALER = '''\
import torch
import torch.nn.functional as F
from torch import nn


def build():
    return nn.Sequential(nn.Embedding(32, 8), nn.Linear(8, 32))


def app(m, dtype=torch.float16):
    m.to(dtype)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu")
    ids = torch.randint(0, 32, (2, 4))
    with torch.autocast("cpu", dtype=dtype):
        loss = F.cross_entropy(m(ids).reshape(-1, 32).float(), ids.reshape(-1))
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    return loss
'''


@pytest.mark.parametrize("mode", ["explain", "strict", "warn", "fix"])
def test_a_grad_scaler_on_float16_parameters_is_explained_with_the_cast_line(
        project: pathlib.Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, SCALER)
    mod = _load(project / "app.py", f"td_h3_scaler_{mode}", monkeypatch)
    err = _fails(mod, mode)
    assert isinstance(err, ValueError)
    said = str(err)
    assert "GradScaler met float16 gradients because 3 trained parameters are float16 themselves" in said
    assert "culprit 0.weight: f16[32,8]@cpu  (trained in float16: expected float32 master weights)" in said
    assert "the model was cast to float16 at app.py:11 (`m.to(dtype)`)" in said
    # proven on copies: a fresh GradScaler unscales float32 copies of the parameters and their gradients, and
    # refuses float16 ones as the program's did
    assert "fix proven: a GradScaler unscales float32 copies of the 3 parameters and their gradients (float32 " \
           "master weights), and refuses the float16 ones as the program's did" in said
    fix = said.split("Fix:\n", 1)[1]
    assert fix.splitlines()[0].strip().startswith("m.float()  # float32 master weights")
    model = mod.build()  # the fix applied: the model kept in float32, autocast computing in float16
    monkeypatch.setattr(model, "to", lambda *a, **k: model)  # the app's own cast to float16 left out
    exec(fix.splitlines()[0].strip(), {"m": model})
    with torchdoctor.guard(model, mode="strict"):
        assert mod.app(model).dtype == torch.float32


TIMESTEP = '''\
import math
import torch
from torch import nn


class K5(nn.Module):
    def __init__(self):
        super().__init__()
        self.time_mlp = nn.Linear(8, 8)
        self.x_in = nn.Linear(8, 8)

    def forward(self, hidden_states, timestep):
        freqs = torch.exp(-math.log(10000) * torch.arange(4, dtype=torch.float32) / 4)
        args = timestep[:, None] * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return self.x_in(hidden_states) + self.time_mlp(emb)


def build():
    return K5().to(torch.bfloat16)


def app(m):
    return m(hidden_states=torch.randn(1, 8, dtype=torch.bfloat16), timestep=torch.tensor([999.0]))
'''
TIMESTEP_FIX = "emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(hidden_states.dtype)  # app.py:15"


@pytest.mark.parametrize("mode", ["explain", "strict", "warn"])
def test_an_embedding_computed_from_fp32_sources_is_cast_where_it_is_assigned(
        project: pathlib.Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, TIMESTEP)
    mod = _load(project / "app.py", f"td_h3_ts_{mode}", monkeypatch)
    if mode == "warn":
        model = mod.build()
        with pytest.warns(torchdoctor.PlacementWarning), torchdoctor.guard(model, mode="warn") as g:
            mod.app(model)
        note = g.report().to_dict()["problems"][0]
        fix, proof, patch, maker = note["fix"], note["proof"], note["patch"], note["maker"]
    else:
        err = _fails(mod, mode)
        fix, proof, patch, maker = err.fix, err.proof, err.patch, str(err)
    assert fix == TIMESTEP_FIX  # never the caller's timestep cast, which the float32 freqs undo
    assert "emb computed by `torch.cat` at " in maker and "app.py:15" in maker
    assert proof == "fix proven: K5 runs again with `torch.cat` at app.py:15 -> torch.bfloat16"
    assert _applied(project, patch, f"td_h3_ts_{mode}_fixed", monkeypatch).dtype == BF


LOKR = '''\
import torch
import torch.nn.functional as F
from torch import nn


class LoKr(nn.Module):
    def __init__(self, org):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(2, 2) * 0.01)
        self.w2 = nn.Parameter(torch.zeros(4, 4))
        self.org_forward = org.forward
        org.forward = self.forward

    def forward(self, x):
        return self.org_forward(x) + F.linear(x, torch.kron(self.w1, self.w2))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(8, 8)
        self.mlp = nn.Linear(8, 8)

    def forward(self, x):
        return self.mlp(torch.relu(self.attn(x)))


def build():
    return Block()


def app(m):
    m.to(torch.bfloat16).requires_grad_(False)
    network = nn.ModuleList([LoKr(m.attn), LoKr(m.mlp)])
    opt = torch.optim.AdamW(network.parameters(), lr=1e-4)
    loss = F.mse_loss(m(torch.randn(2, 8, dtype=torch.bfloat16)).float(), torch.zeros(2, 8))
    loss.backward()
    opt.step()
    return loss
'''


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_lokr_network_patched_into_the_forwards_is_cast_as_the_program_holds_it(
        project: pathlib.Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, LOKR)
    err = _fails(_load(project / "app.py", f"td_h3_lokr_{mode}", monkeypatch), mode)
    text = str(err)
    assert "forward.__self__" not in text and "model.to(" not in (err.fix or "")  # no no-op, no model path
    assert "dtype mismatch in `network` (LoKr patched into `attn`, `mlp`)" in text
    assert "culprit network.0.w1: f32[2,2]@cpu  (expected bfloat16)" in text
    assert "w1, w2 read by `" in text and "torch.kron(self.w1, self.w2)" in text and "app.py:15" in text
    assert err.fix == "network.to(torch.bfloat16)  # after app.py:34"
    assert err.proof == "fix proven: Block runs again with `network` -> torch.bfloat16"
    assert "+    network.to(torch.bfloat16)\n" in err.patch
    assert _applied(project, err.patch, f"td_h3_lokr_{mode}_fixed", monkeypatch).dtype == torch.float32



@pytest.mark.parametrize("mode", ["warn", "fix"])
def test_fix_and_warn_say_the_same_of_the_patched_network(project: pathlib.Path, mode: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _reset(project, LOKR)
    mod = _load(project / "app.py", f"td_h3_lokr_{mode}", monkeypatch)
    model = mod.build()
    with warnings.catch_warnings(record=True), torchdoctor.guard(model, mode=mode) as g:
        warnings.simplefilter("always")
        mod.app(model)
    note = g.report().to_dict()["problems"][0]
    assert note["fix"] == "network.to(torch.bfloat16)  # after app.py:34"
    assert note["proof"] == "fix proven: Block runs again with `network` -> torch.bfloat16"
    assert _applied(project, note["patch"], f"td_h3_lokr_{mode}_fixed", monkeypatch).dtype == torch.float32

"""What follows a backward (the optimizer step, an optimizer state's ``lerp_``, an EMA update) is checked by strict
too (``_guard/aftergrad.py``), and each problem there is told alike in every mode: the maker, the line, the fix aimed
there and its proof (issue 41 points 1 and 2)."""

from __future__ import annotations

import copy
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
from torch.optim import optimizer as optim_module

import torchdoctor

BF = torch.bfloat16

NORMUON = '''\
import torch
from torch import nn


def zeropower(g):
    x = g / (g.norm() + 1e-7)
    return (1.5 * x - 0.5 * x @ x.t() @ x).float()


def normuon_update(grad, momentum, second_momentum, beta=0.95, beta2=0.95):
    momentum.lerp_(grad, 1 - beta)
    update = zeropower(momentum)
    v_mean = update.square().mean(dim=-1, keepdim=True)
    second_momentum.lerp_(v_mean, 1 - beta2)
    return update / (second_momentum.sqrt() + 1e-8)


def build():
    torch.manual_seed(0)
    return nn.Linear(8, 8, bias=False).to(torch.bfloat16)


def app(m):
    loss = m(torch.randn(2, 8, dtype=torch.bfloat16)).float().square().mean()
    loss.backward()
    p = m.weight
    momentum = torch.zeros_like(p)
    second = torch.zeros(p.shape[0], 1, dtype=p.dtype)
    with torch.no_grad():
        p.add_(normuon_update(p.grad, momentum, second).to(p.dtype), alpha=-0.01)
    return p
'''


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
    monkeypatch.setitem(sys.modules, name, mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("mode", ["explain", "strict", "warn", "fix"])
def test_a_float_update_lerped_into_bf16_state_is_told_with_the_helper_cast_that_made_it(
        project: pathlib.Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (project / "app.py").write_text(NORMUON)
    mod = _load(project / "app.py", f"td_h3_normuon_{mode}", monkeypatch)
    path = str(project / "app.py")
    maker = (f"v_mean made by `.float()` at {path}:7 (`return (1.5 * x - 0.5 * x @ x.t() @ x).float()`) in "
             f"zeropower(), called at {path}:12 (`update = zeropower(momentum)`), through update")
    fix = "second_momentum.lerp_(v_mean.bfloat16(), 1 - beta2)  # app.py:14"
    model = mod.build()
    if mode in ("explain", "strict"):
        with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model, mode=mode):
            mod.app(model)
        said, patch = str(info.value), info.value.patch
        assert maker in said and fix in said and "fix proven" in said
        if mode == "strict":  # checked after the backward, before the op ran: no error of torch's to explain
            assert said.startswith("dtype problem in code outside any module at aten.lerp_.Scalar: arg 1 (end) is "
                                   "float32, expected bfloat16")
            assert "line app.py:14: second_momentum.lerp_(v_mean, 1 - beta2)" in said
            assert "original error" not in said
        else:
            assert "original error: RuntimeError: expected dtype c10::BFloat16 for `end` but got dtype float" in said
    else:
        with warnings.catch_warnings(record=True) as w, torchdoctor.guard(model, mode=mode) as g:
            warnings.simplefilter("always")
            mod.app(model)
        (f,) = g.fixes
        assert (f.path, f.found, f.expected) == ("<root>: arg 1 (end)", "float32", "bfloat16")
        assert f.op == "aten.lerp_.Scalar"
        assert maker in (f.maker or "") and fix == f.code and f.proven
        told = [str(x.message) for x in w if issubclass(x.category, torchdoctor.PlacementWarning)]
        assert len(told) == (1 if mode == "warn" else 0) and all(maker in t for t in told)
        patch = f.patch
    assert patch is not None
    (project / "fix.patch").write_text(patch)
    assert _git(project, "apply", "fix.patch").returncode == 0
    fixed = _load(project / "app.py", f"td_h3_normuon_{mode}_fixed", monkeypatch)
    model = fixed.build()
    with torchdoctor.guard(model, mode="strict") as g:
        assert fixed.app(model).dtype == BF
    assert not g.problems


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _train(model: nn.Module, after: Any, steps: int = 2, opt_cls: Any = torch.optim.AdamW) -> None:
    opt = opt_cls(model.parameters(), lr=1e-3)
    for _ in range(steps):
        loss = model(torch.randn(2, 8, dtype=BF)).float().square().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            after()


def test_strict_checks_an_ema_update_after_the_backward() -> None:
    torch.manual_seed(0)
    model = _Net().to(BF)
    ema = copy.deepcopy(model).requires_grad_(False)

    def update() -> None:
        for pe, pm in zip(ema.parameters(), model.parameters()):
            pe.copy_(pm * torch.ones(pm.shape))  # the float32 ones promote the bf16 update silently

    funcs = torch._C._len_torch_function_stack()
    hooks = len(optim_module._global_optimizer_pre_hooks)
    with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model, mode="strict"):
        _train(model, update)
    said = str(info.value)
    assert said.startswith("dtype problem in code outside any module at aten.mul.Tensor: arg 1 (other) is float32 and "
                           "promotes the model's bfloat16 to float32 silently")
    assert "made by `torch.ones` at " in said and "pe.copy_(pm * torch.ones(pm.shape, dtype=torch.bfloat16))" in said
    # the first stage and the optimizer hook leave with the guard
    assert torch._C._len_torch_function_stack() == funcs
    assert len(optim_module._global_optimizer_pre_hooks) == hooks


@pytest.mark.parametrize("opt_cls", [torch.optim.AdamW, torch.optim.SGD])
def test_correct_training_steps_stay_quiet_in_strict(opt_cls: Any) -> None:
    """A float32 EMA of a bf16 model (mul_/add_ and lerp_ of a float32 copy), clipping and the optimizer's own step:
    no problem, and the loss built from the output before the backward is not checked per op."""
    torch.manual_seed(0)
    model = _Net().to(BF)
    ema = copy.deepcopy(model).float().requires_grad_(False)

    def update() -> None:
        for pe, pm in zip(ema.parameters(), model.parameters()):
            pe.mul_(0.99).add_(pm, alpha=0.01)
            pe.lerp_(pm.float(), 0.01)

    with torchdoctor.guard(model, mode="strict") as g:
        _train(model, update, opt_cls=opt_cls)
        after = g._local.sessions[-1].dispatch.gate.after
        assert after is not None and after.ready  # the backward ended: what followed it was looked at
    assert not g.problems and not g.fixes


STATE = '''\
import torch
from torch import nn


class Lion32(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["avg"] = torch.zeros(p.shape, dtype=torch.float32)
                st["avg"].lerp_(p.grad, 0.1)
                p.add_(st["avg"].sign().to(p.dtype), alpha=-group["lr"])


def build():
    torch.manual_seed(0)
    return nn.Linear(4, 4).to(torch.bfloat16)


def app(m):
    opt = Lion32(m.parameters())
    m(torch.ones(2, 4, dtype=torch.bfloat16)).float().sum().backward()
    opt.step()
'''


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_float32_optimizer_state_of_a_bf16_model_is_told_at_the_step_line(
        project: pathlib.Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (project / "app.py").write_text(STATE)
    mod = _load(project / "app.py", f"td_h3_state_{mode}", monkeypatch)
    model = mod.build()
    with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model, mode=mode):
        mod.app(model)
    said = str(info.value)
    assert f"st['avg'] (written in place by `.lerp_`) made by `torch.zeros` at {project / 'app.py'}:15" in said
    assert 'st["avg"].lerp_(p.grad.float(), 0.1)  # app.py:16' in said and "fix proven" in said
    assert "culprit p.grad: bf16[4,4]@cpu  (expected float32)" in said  # the gradient, never `p` cast
    assert "p.float()" not in said
    assert ("original error" in said) is (mode == "explain")  # strict stops it before the op runs


@pytest.mark.parametrize("mode", ["explain", "strict", "warn", "fix"])
def test_an_ema_copy_on_cpu_updated_from_cuda_parameters_is_told_in_every_mode(mode: str) -> None:
    """A real GPU raises at the update; on a virtual one the run names the EMA's tensor, the line and a proven fix."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8))

    def app() -> None:
        model.to("cuda:0")
        ema = copy.deepcopy(model).cpu().requires_grad_(False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(torch.randn(2, 8, device="cuda:0")).square().mean()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 0.01)

    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.virtual_devices("cuda:0"), torchdoctor.guard(model, mode=mode):
            app()
    said = str(info.value)
    assert "ema.0.weight f32[8,8]@cpu is on cpu while aten.lerp_.Scalar runs on cuda:0" in said
    # the program keeps its EMA on the cpu on purpose: what the update reads goes to the EMA's device at that line
    assert "pe.lerp_(pm.to(pe.device), 0.01)" in said and "# fix proven (at the failing op aten.lerp_.Scalar at " in said
    assert "ema.to(" not in said
    assert "test_after_backward.py:" in said.split("# fix proven", 1)[1]  # the update's line


SCALED_BF16 = '''\
import torch
from torch import nn


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))


def app(m, dtype=torch.bfloat16, cuda_text=False):
    m.to(dtype)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = m(torch.randn(4, 8, dtype=dtype)).float().square().mean()
    scaler.scale(loss).backward()
    if cuda_text:  # what the same step raises on a GPU
        raise RuntimeError("\\"_amp_foreach_non_finite_check_and_unscale_cuda\\" not implemented for 'BFloat16'")
    scaler.step(opt)
    scaler.update()
    return loss.detach()
'''


@pytest.mark.parametrize("mode", ["explain", "strict", "warn", "fix"])
def test_a_grad_scaler_over_bf16_parameters_is_told_before_the_gpu_would_refuse_it(
        project: pathlib.Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (project / "app.py").write_text(SCALED_BF16)
    mod = _load(project / "app.py", f"td_h3_scaled_bf16_{mode}", monkeypatch)
    model = mod.build()
    head = ("GradScaler unscales bfloat16 gradients because 4 trained parameters are bfloat16: CUDA has no unscale "
            "kernel for bfloat16, and bfloat16 needs no loss scaling")
    proof = "fix proven: an optimizer step runs on bfloat16 copies of the 4 parameters and their gradients"
    if mode == "warn":
        with pytest.warns(torchdoctor.PlacementWarning) as w, torchdoctor.guard(model, mode=mode) as g:
            mod.app(model)
        said = "\n".join(str(x.message) for x in w if issubclass(x.category, torchdoctor.PlacementWarning))
        assert said.count(head) == 1 and [p.path for p in g.problems] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    else:  # explain: this CPU's kernel takes bfloat16, so only the GPU's error is told
        with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.guard(model, mode=mode):
            mod.app(model, cuda_text=mode == "explain")
        said = str(info.value)
        assert ("original error: RuntimeError: \"_amp_foreach_non_finite_check_and_unscale_cuda\" not implemented for "
                "'BFloat16'" in said) is (mode == "explain")
    assert head in said and proof in said
    assert "the model was cast to bfloat16 at app.py:11 (`m.to(dtype)`)" in said
    assert "loss.backward(); optimizer.step()  # bfloat16 keeps float32's exponent range: no GradScaler" in said


def test_a_grad_scaler_over_float32_weights_with_bf16_autocast_is_quiet_in_strict(
        project: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (project / "app.py").write_text(SCALED_BF16)
    mod = _load(project / "app.py", "td_h3_scaled_fp32", monkeypatch)
    model = mod.build()
    with torchdoctor.guard(model, mode="strict") as g:
        mod.app(model, dtype=torch.float32)
    assert not g.problems

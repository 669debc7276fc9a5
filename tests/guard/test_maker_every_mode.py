"""Issue 41 points 1-2 in every guard mode: the maker of an operand made in a forward (a cast whose dtype a class
attribute or a config holds, ids concatenated from CPU labels, ``torch.arange`` positions, ``torch.randint``
timesteps) is named with its line in explain, strict, fix and warn, with the same fix aimed at it, its proof and
its diff, in the report's JSON (``err.to_dict()``, ``guard.report().to_dict()``, ``guard.fixes``).

Devices: a CPU-only machine has no second device, so the GPU is played by labels (``_td_device``, what the strict
rules read) and, for explain mode, by the text a real GPU raises at the embedding. The same scenario on a real GPU
runs in all four modes at the end (skipped without CUDA)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys
import types
import warnings
from typing import Any

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

import torchdoctor

SOURCE = '''\
import torch
from torch import nn


class QLinear(nn.Module):
    compute_dtype = torch.float16

    def __init__(self, n, m):
        super().__init__()
        self.register_buffer("qweight", torch.randint(-8, 8, (m, n), dtype=torch.int8))
        self.register_buffer("scale", torch.ones(m, 1, dtype=torch.bfloat16))

    def forward(self, x):
        w = self.qweight.to(self.compute_dtype) * self.scale.to(self.compute_dtype)
        return x @ w.t()


class Chat(nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, prompt, labels):
        ids = torch.cat([prompt, labels], dim=1)
        return self.lm(input_ids=ids).logits


class Positions(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(64, 8)
        self.pos = nn.Embedding(16, 8)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1])
        return self.tok(ids) + self.pos(positions)


class Noise(nn.Module):
    def __init__(self):
        super().__init__()
        self.t_emb = nn.Embedding(1000, 8)

    def forward(self, x):
        t = torch.randint(0, 1000, (x.shape[0],))
        return x + self.t_emb(t)


class Config:
    torch_dtype = torch.float32


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = Config()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = x.to(self.config.torch_dtype)
        return self.proj(h)
'''
MODES = ["explain", "strict", "fix", "warn"]
GPU_TEXT = ("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! (when "
            "checking argument for argument index in method wrapper_CUDA__index_select)")


def _git(repo: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture()
def project(tmp_path: pathlib.Path) -> pathlib.Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "proj"
    root.mkdir()
    assert _git(root, "init", "-q").returncode == 0
    (root / "app.py").write_text(SOURCE)
    return root


def _load(path: pathlib.Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # inspect reads a class's source through its module
    spec.loader.exec_module(mod)
    return mod


def _llama(**kw: Any) -> transformers.LlamaForCausalLM:
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, **kw)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _run(model: torch.nn.Module, mode: str, *args: Any, outer: Any = None) -> tuple[Any, Any, list[str]]:
    """(the error or None, the guard, the PlacementWarnings' texts) of one guarded call."""
    err, caught = None, []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            with torch.no_grad(), (outer or _Nothing()), torchdoctor.guard(model, mode=mode) as g:
                model(*args)
        except torchdoctor.PlacementError as e:
            err = e
        caught = [str(w.message) for w in seen if issubclass(w.category, torchdoctor.PlacementWarning)]
    return err, g, caught


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _said(err: Any, g: Any) -> dict[str, Any]:
    """The one record every mode keeps: the error's JSON (explain, strict), else the first fix (fix, warn); and
    the problem's note in ``guard.report()`` must say the same."""
    data = g.report().to_dict()
    assert json.loads(json.dumps(data)) == data
    noted = [p for p in data["problems"] if p["maker"]]
    assert noted, data
    if err is not None:
        out = err.to_dict()
        assert noted[0]["fix"] == err.fix and noted[0]["proof"] == out["proof"] and noted[0]["patch"] == out["patch"]
        return {"maker": noted[0]["maker"], "fix": err.fix, "proof": out["proof"], "patch": out["patch"],
                "text": str(err)}
    fix = g.fixes[0].to_dict()
    assert json.loads(json.dumps(fix)) == fix
    assert fix["maker"] == noted[0]["maker"] and fix["code"] == noted[0]["fix"]
    return {"maker": fix["maker"], "fix": fix["code"], "proof": fix["proof"], "patch": fix["patch"], "text": ""}


# --- a bf16 model whose layer casts with a class-level compute_dtype ----------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_class_attribute_compute_dtype_in_a_bf16_llama_is_named_fixed_and_proven_in_every_mode(
        project: pathlib.Path, mode: str) -> None:
    app = _load(project / "app.py", f"td_every_{mode}")
    lm = _llama().to(torch.bfloat16)
    lm.model.layers[0].mlp.down_proj = app.QLinear(32, 16)
    ids = torch.randint(0, 64, (1, 5))
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    err, g, caught = _run(lm, mode, ids)
    assert (err is None) == (mode in ("fix", "warn"))
    said = _said(err, g)
    assert "made by `.to(self.compute_dtype)` at " in said["maker"] and "app.py:14" in said["maker"]
    assert "the dtype read from class attribute `QLinear.compute_dtype`" in said["maker"]
    assert said["fix"].startswith("type(model.model.layers[0].mlp.down_proj).compute_dtype = torch.bfloat16")
    assert said["proof"] == "fix proven: QLinear runs again with compute_dtype = torch.bfloat16 on `QLinear`"
    assert "-    compute_dtype = torch.float16\n+    compute_dtype = torch.bfloat16\n" in said["patch"]
    assert app.QLinear.compute_dtype == torch.float16 and "compute_dtype" not in vars(lm.model.layers[0].mlp.down_proj)
    assert all(torch.equal(before[k], v) for k, v in lm.state_dict().items())  # the re-run changed nothing
    if mode == "warn":
        assert len(caught) == 1 and "aligned for this call" in caught[0]
        assert "made by `.to(self.compute_dtype)`" in caught[0] and "; fix (proven): type(model." in caught[0]
    if mode == "fix":  # the diff, applied, makes the error go away
        (project / "fix.patch").write_text(said["patch"])
        assert _git(project, "apply", "fix.patch").returncode == 0
        fixed = _load(project / "app.py", "td_every_fixed")
        lm.model.layers[0].mlp.down_proj = fixed.QLinear(32, 16)
        with torch.no_grad(), torchdoctor.guard(lm, mode="strict"):
            assert lm(ids).logits.dtype == torch.bfloat16


def test_fix_mode_tells_a_problem_once_across_calls(project: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchdoctor._guard import maker

    app = _load(project / "app.py", "td_every_once")
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), app.QLinear(32, 16)).to(torch.bfloat16)
    calls: list[Any] = []
    real = maker.find
    monkeypatch.setattr(maker, "find", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad(), torchdoctor.guard(net, mode="fix") as g:
        for _ in range(3):
            assert net(torch.randn(2, 32, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert len(calls) == 1 and len(g.fixes) == 1 and g.fixes[0].proven


@pytest.mark.parametrize("mode", ["fix", "warn", "strict"])
def test_a_dtype_read_from_a_config_attribute_is_the_fix(project: pathlib.Path, mode: str) -> None:
    app = _load(project / "app.py", f"td_every_cfg_{mode}")
    net = app.Head().to(torch.bfloat16)
    err, g, _ = _run(net, mode, torch.randn(2, 8, dtype=torch.bfloat16))
    said = _said(err, g)
    assert "made by `.to(self.config.torch_dtype)`" in said["maker"] and "app.py:60" in said["maker"]
    assert "the dtype read from config `self.config.torch_dtype`" in said["maker"]
    assert said["fix"].startswith("model.config.torch_dtype = torch.bfloat16")
    assert said["proof"] is not None and said["proof"].startswith("fix proven")


# --- ids, positions and timesteps made on the CPU for a model on the GPU ------------------------------------


def _on_gpu(*tensors: torch.Tensor) -> None:
    for t in tensors:
        t._td_device = torch.device("cuda:0")  # type: ignore[attr-defined]


@pytest.fixture()
def per_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU is a label here: strict's module-boundary gate compares real devices, so check every op."""
    import torchdoctor._virtual  # noqa: F401 - the rules read the labels in a process where it is loaded

    try:
        from torchdoctor._guard import fastpath
    except ImportError:
        return
    monkeypatch.setattr(fastpath, "ENABLED", False)


class GPUText(TorchDispatchMode):
    """What a real GPU raises when an embedding's weight is on cuda:0 and its ids on the CPU."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.embedding.default and "_td_device" in args[0].__dict__ and \
                "_td_device" not in args[1].__dict__:
            raise RuntimeError(GPU_TEXT)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_ids_concatenated_from_cpu_labels_are_named_by_their_maker(project: pathlib.Path, per_op: None,
                                                                   mode: str) -> None:
    app = _load(project / "app.py", f"td_every_ids_{mode}")
    lm = _llama()
    _on_gpu(*lm.parameters(), *lm.buffers())
    chat = app.Chat(lm)
    prompt, labels = torch.randint(0, 64, (1, 4)), torch.randint(0, 64, (1, 3))
    err, g, _ = _run(chat, mode, prompt, labels, outer=GPUText() if mode == "explain" else None)
    assert err is not None and err.module_path == "lm.model.embed_tokens"
    said = _said(err, g)
    assert "made by `torch.cat` at " in said["maker"] and "app.py:24 (`ids = torch.cat([prompt, labels], dim=1)`)" \
        in said["maker"] and said["maker"].endswith("from prompt (cpu), labels (cpu)")
    assert said["fix"] == "ids = torch.cat([prompt, labels], dim=1).to(next(self.parameters()).device)  # app.py:24"
    assert "-        ids = torch.cat([prompt, labels], dim=1)\n" \
           "+        ids = torch.cat([prompt, labels], dim=1).to(next(self.parameters()).device)\n" in said["patch"]
    # this machine has no GPU to move the ids to: the proof says what was tried and why it failed
    assert said["proof"].startswith("fix unproven: ") and "cuda:0" in said["proof"]
    assert "Torch not compiled with CUDA enabled" in said["proof"] or torch.cuda.is_available()
    (project / "fix.patch").write_text(said["patch"])
    assert _git(project, "apply", "--check", "fix.patch").returncode == 0


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_ids_a_wrapper_made_are_named_when_only_the_inner_model_is_guarded(project: pathlib.Path, per_op: None,
                                                                           mode: str) -> None:
    app = _load(project / "app.py", f"td_every_inner_{mode}")
    lm = _llama()
    _on_gpu(*lm.parameters(), *lm.buffers())
    chat = app.Chat(lm)
    err = None
    try:
        with torch.no_grad(), (GPUText() if mode == "explain" else _Nothing()), torchdoctor.guard(lm, mode=mode) as g:
            chat(torch.randint(0, 64, (1, 4)), torch.randint(0, 64, (1, 3)))
    except torchdoctor.PlacementError as e:
        err = e
    assert err is not None and "input_ids (an argument of the LlamaForCausalLM call)" in str(err)
    assert "input_ids made by `torch.cat` at " in str(err) and "from prompt (cpu), labels (cpu)" in str(err)
    assert "input_ids made by `torch.cat`" in (g.report().to_dict()["problems"][0]["maker"] or "")


@pytest.mark.parametrize(("cls", "line", "fix"), [
    ("Positions", "positions = torch.arange(ids.shape[1])", "positions = torch.arange(ids.shape[1], device=ids.device)"),
    ("Noise", "t = torch.randint(0, 1000, (x.shape[0],))", "t = torch.randint(0, 1000, (x.shape[0],), device=x.device)"),
])
def test_positions_and_timesteps_made_without_a_device_are_fixed_at_their_factory(
        project: pathlib.Path, per_op: None, cls: str, line: str, fix: str) -> None:
    app = _load(project / "app.py", f"td_every_{cls}")
    net = getattr(app, cls)()
    _on_gpu(*net.parameters())
    x = torch.randint(0, 16, (2, 5)) if cls == "Positions" else torch.randn(2, 8)
    _on_gpu(x)
    err, g, _ = _run(net, "strict", x)
    said = _said(err, g)
    assert f"(`{line}`), with no device= (made on the CPU)" in said["maker"]
    assert said["fix"].startswith(fix + "  # app.py:")
    assert f"+        {fix}\n" in said["patch"]


# --- the same on a real GPU, in every mode -------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", MODES)
def test_on_a_gpu_cpu_ids_are_named_in_every_mode_and_the_fix_is_proven(project: pathlib.Path, mode: str) -> None:
    app = _load(project / "app.py", f"td_every_gpu_{mode}")
    chat = app.Chat(_llama().cuda())
    prompt, labels = torch.randint(0, 64, (1, 4)), torch.randint(0, 64, (1, 3))
    err, g, caught = _run(chat, mode, prompt, labels)
    assert (err is None) == (mode in ("fix", "warn"))
    said = _said(err, g)
    assert "made by `torch.cat` at " in said["maker"] and "from prompt (cpu), labels (cpu)" in said["maker"]
    assert said["fix"] == "ids = torch.cat([prompt, labels], dim=1).to(next(self.parameters()).device)  # app.py:24"
    assert said["proof"] is not None and said["proof"].startswith("fix proven"), said["proof"]
    if mode == "warn":
        assert any("made by `torch.cat`" in w for w in caught)

"""simulate prints a fix only after a virtual re-run with it applied came out clean (issue 41 point 1): the cases
measured in the issue, each with the fix it must get, proven; what must never be printed (a no-op re-cast, a cast of
activations to storage, a model-wide cast for a tensor outside the model); a fix the re-run disproves labelled so;
and the diff of a cast's line, which real ``git apply --check`` takes."""

from __future__ import annotations

import copy
import importlib.util
import inspect
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchdoctor


class Dequant(nn.Module):
    compute_dtype = torch.bfloat16  # the class says bf16, the model around it is fp16

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4).half(), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.ones(4), requires_grad=False)  # fp32, cast per call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(self.compute_dtype) * self.weight_scale.to(self.compute_dtype)[:, None]
        return x @ w.t()


class FloatsInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h = h.float()  # the maker of the float32 tensor: this line
        return self.b(h)


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.ones(4)  # a plain attribute: Module.to moves neither its device nor its dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def _line_of(cls: type, text: str) -> int:
    lines, start = inspect.getsourcelines(cls)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_class_level_compute_dtype_is_fixed_at_the_attribute_and_proven() -> None:
    model = nn.Sequential(nn.Linear(4, 4), Dequant()).half()
    model[1].weight_scale.data = model[1].weight_scale.data.float()
    report = torchdoctor.simulate(model, (torch.randn(2, 4).half(),), device="cuda:0")
    assert "dtype read from the class attribute Dequant.compute_dtype" in report.problems[0].message
    assert [(f.kind, f.proven) for f in report.fixes] == [("path", True)]
    assert report.fix is not None and report.fix.startswith("model[1].compute_dtype = torch.float16  # ")
    assert "weight_scale.data" not in report.fix and "weight.data" not in report.fix  # casting them changes nothing
    # the cast is two ops upstream of the failing op (mul, t), combined with another tensor on the way: the failing op
    # alone cannot prove it (a block says unproven), the re-run does
    assert "Fix (proven: a virtual re-run with it applied has no problem left):" in report.text()
    fixed = copy.deepcopy(model)
    exec(report.fix, {"model": fixed, "torch": torch})  # the printed code, run on the user's own kind of object
    assert torchdoctor.simulate(fixed, (torch.randn(2, 4).half(),), device="cuda:0").ok
    assert "compute_dtype" not in vars(model[1])  # the user's model was not touched by the proof


def test_float_cast_in_a_bf16_forward_is_fixed_at_its_line_never_by_recasting_bf16_weights() -> None:
    model = FloatsInForward().to(torch.bfloat16)
    report = torchdoctor.simulate(model, (torch.randn(2, 4).bfloat16(),), device="cuda:0")
    line = _line_of(FloatsInForward, "h = h.float()")
    assert f"a tensor made by `float()` at tests/virtual/{Path(__file__).name}:{line} in `<root>` from a tensor made " \
           "by aten.addmm in `a` f32[2,4]@cuda:0 is float32" in report.problems[0].message
    assert [(f.kind, f.proven) for f in report.fixes] == [("line", True)]
    fix = report.fixes[0]
    assert fix.site.lineno == line and "casts to float32 where aten.addmm.default computes in bfloat16" in fix.code
    assert "a.weight" not in (report.fix or "") and "a.bias" not in (report.fix or "")


def test_uint8_weights_in_a_plain_conv3d_get_the_weight_fixed_not_activations_cast_to_uint8() -> None:
    model = nn.Sequential(nn.Conv3d(2, 2, 1)).half()
    model[0].weight = nn.Parameter(model[0].weight.data.to(torch.uint8), requires_grad=False)
    report = torchdoctor.simulate(model, (torch.randn(1, 2, 2, 2, 2).half(),), device="cuda:0")
    assert report.fix is not None and "torch.uint8" not in report.fix
    # the storage is what is fixed (the problem is at the weight when its module starts, or at the op that met it)
    assert report.fix.startswith("model[0].weight.data = model[0].weight.data.to(torch.float16)")
    # a bare cast of stored integers runs, with the integers as its values: said, never proven
    assert [(f.kind, f.proven) for f in report.fixes] == [("note", False)]
    assert "only their scale dequantizes" in report.fixes[0].tried
    assert model[0].weight.dtype == torch.uint8


def test_float64_tensor_outside_the_model_on_mps_is_never_fixed_with_model_to() -> None:
    def step(m: nn.Module) -> torch.Tensor:
        m.to("mps")
        sigmas = torch.from_numpy(np.linspace(0, 1, 4)).to("mps")  # float64: MPS has none
        return m(torch.ones(1, 4, device="mps")) * sigmas[0]

    report = torchdoctor.simulate(nn.Linear(4, 4), device="mps", call=step)
    assert [p.kind for p in report.problems] == ["unsupported_dtype"]
    assert report.fix is not None and "model.to(" not in report.fix
    assert "# a float64 tensor made outside the model moves to mps:0, which cannot hold float64: cast that tensor " \
           "to float32 before moving it, at tests/virtual/test_proof_fixes.py:109 where torch.from_numpy makes it" \
           in report.fix  # at its maker's line, never advice alone
    [fix] = report.fixes
    assert fix.kind == "factory" and fix.proven and fix.diff is not None and \
        "torch.from_numpy(np.linspace(0, 1, 4)).to(torch.float32).to(\"mps\")" in fix.diff, fix


def test_dtype_asked_casts_a_plain_attribute_too_and_the_fix_is_proven() -> None:
    report = torchdoctor.simulate(Scaled(), (torch.randn(2, 4),), device="cuda:0", dtype=torch.bfloat16)
    assert report.fix is not None
    assert report.fix.splitlines()[0] == "model.scale.data = model.scale.data.to('cuda:0', torch.bfloat16)"
    assert [(f.kind, f.proven) for f in report.fixes] == [("path", True), ("note", False)]
    assert report.to_dict()["fixes"][0] == {"code": report.fixes[0].code, "kind": "path", "proven": True,
                                            "tried": f"at the failing op aten.mul.Tensor at tests/virtual/"
                                                     f"{Path(__file__).name}:{_line_of(Scaled, '* self.scale')}: its "
                                                     "operands as the fix leaves them run with no problem; its "
                                                     "output is the one the ops after it ran on"}


class MovesBack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.table = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.table = self.table.cpu()  # puts it back on cpu on every call: moving it once fixes nothing
        return self.lin(x) + self.table


def test_a_fix_the_re_run_disproves_is_labelled_unproven_with_what_was_tried() -> None:
    report = torchdoctor.simulate(MovesBack(), (torch.randn(2, 4),), device="cuda:0")
    assert not report.ok
    applied = [f for f in report.fixes if f.kind != "note"]
    assert applied and not any(f.proven for f in applied)
    # the failing op alone runs once the table is moved; the re-run shows the forward moves it back every call
    assert applied[0].tried.startswith("at the failing op aten.add.Tensor at ")
    assert applied[0].tried.endswith("; but a virtual re-run with it applied still found: table f32[4]@cpu is on "
                                     "cpu while aten.add.Tensor runs on cuda:0 (in <root>, MovesBack)")
    assert "# fix unproven: at the failing op aten.add.Tensor at " in report.text()
    assert all(d["proven"] is False for d in report.to_dict()["fixes"])


_MODEL_PY = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        h = h.float()
        return self.b(h)
"""


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_a_line_fix_in_the_users_file_comes_as_a_diff_git_apply_takes(tmp_path: Path) -> None:
    pytest.importorskip("torchdoctor._report.diff")
    (tmp_path / "pkg").mkdir()
    path = tmp_path / "pkg" / "netmod_proof.py"
    path.write_text(_MODEL_PY)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "model"]):
        subprocess.run([*git, *cmd], cwd=tmp_path, check=True, timeout=60)
    spec = importlib.util.spec_from_file_location("netmod_proof", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["netmod_proof"] = mod
    try:
        spec.loader.exec_module(mod)
        report = torchdoctor.simulate(mod.Net().bfloat16(), (torch.randn(2, 4).bfloat16(),), device="cuda:0")
    finally:
        del sys.modules["netmod_proof"]
    fixes = report.to_dict()["fixes"]
    assert [(d["kind"], d["proven"]) for d in fixes] == [("line", True)]
    diff = fixes[0]["diff"]
    assert "-        h = h.float()\n+        h = h.to(torch.bfloat16)\n" in diff
    assert diff.startswith("--- a/pkg/netmod_proof.py\n+++ b/pkg/netmod_proof.py\n")
    (tmp_path / "fix.diff").write_text(diff)
    done = subprocess.run(["git", "apply", "--check", "fix.diff"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True, timeout=60)
    assert "h = h.to(torch.bfloat16)" in path.read_text() and textwrap.dedent(_MODEL_PY) != path.read_text()


def test_activations_meeting_storage_get_the_storage_cast_never_the_activations() -> None:
    from torchdoctor._report.model import Problem
    from torchdoctor._virtual.fixes import fix_items

    # what a kernel's own check reports when a plain layer computes with integer storage: the input named
    met = Problem("dtype", "0", "activation", "float16", "uint8", "input 0 is float16 where 0 (Conv3d) expects uint8",
                  op="Conv3d.forward", module_path="0", module_type="Conv3d")
    held = {"0.weight": (torch.uint8, torch.device("cuda:0")), "0.bias": (torch.float16, torch.device("cuda:0"))}
    items = fix_items([met], torch.device("cuda:0"), None, {}, held) or []
    assert [f.kind for f in items] == ["path"]
    assert items[0].code.startswith("model[0].weight.data = model[0].weight.data.to(torch.float16)  # `0` (Conv3d) "
                                    "computes with uint8 storage directly: dequantize it")
    assert "torch.uint8" not in items[0].code


class _Lora(nn.Module):
    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.lora_down, self.lora_up = nn.Linear(4, 2, bias=False), nn.Linear(2, 4, bias=False)
        self.org_forward = base.forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.org_forward(x) + self.lora_up(self.lora_down(x))


class _Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.k(self.q(x))


def test_a_network_held_apart_gets_network_to_never_a_move_of_the_model() -> None:
    def run(model: _Two) -> None:
        network = [_Lora(model.q), _Lora(model.k)]  # the program holds it; the model only sees its bound forwards
        for lora, base in zip(network, (model.q, model.k)):
            base.forward = lora.forward
        model.to("cuda:0")  # network.to(...) forgotten
        model(torch.ones(2, 4, device="cuda:0"))

    report = torchdoctor.simulate(_Two(), device="cuda:0", call=run)
    assert report.fix is not None and "torchdoctor.move(model" not in report.fix
    assert "# network.to('cuda:0') where the network is built: 4 tensors of a network patched into the model's " \
           "forward are held apart from the model (e.g. q.forward.__self__.lora_down.weight" in report.fix

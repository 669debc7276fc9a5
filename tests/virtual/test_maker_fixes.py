"""A tensor made in a forward is fixed at the call that made it, for its device and its dtype at once, proven at the
failing op and offered as a diff of the user's file (issue 41 points 1 and 2; the hunt's S1-S4, S6): never "pass
the tensors made in float32" for a tensor no caller passed, never a model-wide cast the model does not need."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import torchdoctor
from torchdoctor._virtual.prove import Fix


class FromNumpy(nn.Module):  # ComfyUI audio node: numpy features into an fp16 layer
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = torch.from_numpy(np.ones((x.shape[0], 8), dtype=np.float32))
        return self.proj(x) + self.proj(feats)


class Gate(nn.Module):  # adapters: a gate made in float32 on the right device inside a bf16 model
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.ones(x.shape[-1], device=x.device)
        return self.b(self.a(x) * gate)


class Mean64(nn.Module):  # DepthAnything: a float64 mean moved to mps inside the forward
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = torch.from_numpy(np.full((8,), 0.5)).to(x.device)
        return self.head(x - mean)


def _one(report: torchdoctor.SimulationReport) -> Fix:
    assert len(report.fixes) == 1, [f.code for f in report.fixes]
    return report.fixes[0]


def test_a_host_tensor_wrong_in_device_and_dtype_gets_one_proven_fix_at_its_maker() -> None:
    report = torchdoctor.simulate(FromNumpy(), (torch.randn(2, 8),), device="cuda:0", dtype=torch.float16)
    assert {(p.kind, p.found) for p in report.problems} == {("device", "cpu"), ("dtype", "float32")}
    fix = _one(report)
    assert fix.code == "# torch.from_numpy in `<root>` made it on cpu and in float32: move it: " \
                       "torch.from_numpy(...).to(x.device, x.dtype)"
    assert fix.proven and fix.tried.startswith("at the failing op aten.addmm.default at ")
    assert fix.diff is not None and \
        "+        feats = torch.from_numpy(np.ones((x.shape[0], 8), dtype=np.float32)).to(x.device, x.dtype)\n" \
        in fix.diff


def test_a_factory_in_the_wrong_dtype_gets_dtype_at_its_call() -> None:
    report = torchdoctor.simulate(Gate(), (torch.randn(2, 8),), device="cuda:0", dtype=torch.bfloat16)
    fix = _one(report)
    assert fix.code == "# torch.ones in `<root>` made it in float32: pass dtype= the input's dtype " \
                       "(torch.ones(..., dtype=x.dtype))"
    assert fix.proven and "pass the tensors made" not in (report.fix or "")
    assert fix.diff is not None and \
        "+        gate = torch.ones(x.shape[-1], device=x.device, dtype=x.dtype)\n" in fix.diff


def test_float64_made_in_a_forward_on_mps_is_fixed_there_never_by_a_model_wide_cast() -> None:
    report = torchdoctor.simulate(Mean64(), (torch.randn(2, 8),), device="mps")
    assert not report.ok
    fix = _one(report)
    assert fix.code == "# torch.from_numpy in `<root>` made it in float64: move it: torch.from_numpy(...).to(x.dtype)"
    assert fix.proven and "model.to(" not in (report.fix or "") and "outside the model" not in (report.fix or "")
    assert fix.diff is not None and \
        "+        mean = torch.from_numpy(np.full((8,), 0.5)).to(x.dtype).to(x.device)\n" in fix.diff


def test_float8_weights_in_a_plain_layer_get_no_model_wide_cast() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)).to(torch.bfloat16)
    model[0].weight = nn.Parameter(model[0].weight.data.to(torch.float8_e4m3fn), requires_grad=False)

    def app(m: nn.Module) -> None:
        m.to("cuda:0")
        m(torch.randn(2, 8, device="cuda:0", dtype=torch.bfloat16))

    report = torchdoctor.simulate(model, device="cuda:0", dtype=torch.bfloat16, call=app)
    assert report.fix is not None and report.fix.startswith("model[0].weight.data = model[0].weight.data.to(")
    assert "model.to(torch.float32)" not in report.fix and "outside the model" not in report.fix
    assert "float8" not in report.fix.split("#")[0]


def test_position_ids_made_on_the_cpu_are_named_through_the_library_s_cast() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)

    def app(m: nn.Module) -> None:
        m.to("cuda:0")
        m(input_ids=torch.tensor([[1, 2, 3]], device="cuda:0"), position_ids=torch.arange(3)[None])

    report = torchdoctor.simulate(LlamaForCausalLM(cfg).eval(), device="cuda:0", call=app)
    [p] = report.problems
    assert "position_ids (an argument of the LlamaForCausalLM call, made by torch.arange at " \
           "tests/virtual/test_maker_fixes.py:" in p.message
    fix = _one(report)
    assert fix.code == "# torch.arange made it on cpu: pass device= (torch.arange(..., device='cuda:0'))"
    assert fix.proven and "torchdoctor.move(model" not in (report.fix or "")

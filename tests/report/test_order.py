"""Problems ordered by what the user must act on (issue 27, point 3): the README's first call on a CPU machine,
``scan(pipe, "cuda:0", torch.bfloat16)``, puts the real problems first and summarises "you asked for cuda:0,
it is on cpu" per component with the one move that fixes it, in text, JSON and the HTML map."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo
from torchdoctor._report.html import render_html


@pytest.fixture(scope="module")
def report() -> torchdoctor.ScanReport:
    pipe = zoo.tiny_sd_pipeline(torch.bfloat16)
    pipe.unet.extra = [nn.Linear(2, 2).to(torch.bfloat16)]  # a list-held module: .to() never moves it
    pipe.unet.latent_scale = torch.ones(1, dtype=torch.bfloat16)  # a plain attribute: .to() never moves it either
    return torchdoctor.scan(pipe, "cuda:0", torch.bfloat16)


def test_text_puts_real_problems_first_and_one_line_per_component(report: torchdoctor.ScanReport) -> None:
    lines = report.text().splitlines()
    real, moves = report.relocations()
    assert {p.path for p in real} == {"unet.extra.0.weight", "unet.extra.0.bias", "unet.latent_scale"}
    assert sorted(m.component for m in moves) == ["text_encoder", "unet", "vae"]
    assert sum(len(m.members) for m in moves) + len(real) == len(report.problems) > 300
    assert lines[0] == (f"{len(report.problems)} problem(s) in StableDiffusionPipeline; first the {len(real)} to fix, "
                        f"then {len(report.problems) - len(real)} not yet on the device asked for:")
    assert "unet.extra.0.bias" in lines[1] and "Module.to never moves it" in lines[1]
    i = lines.index("not yet on the device you asked for (cuda:0): one move per component fixes them")
    assert i <= len(real) + 1  # the real problems fill the lines before it
    unet = next(m for m in moves if m.component == "unet")
    assert lines[i + 2] == f"  unet          {len(unet.members)} tensors on cpu  ->  model.unet.to('cuda:0')"
    assert lines[i + 4] == "  or all at once: torchdoctor.move(model, device='cuda:0')"
    assert len(lines) < 20


def test_json_carries_the_relocations(report: torchdoctor.ScanReport) -> None:
    doc = report.to_dict()
    assert {r["component"]: r["fix"] for r in doc["relocations"]} == {
        "text_encoder": "model.text_encoder.to('cuda:0')", "unet": "model.unet.to('cuda:0')",
        "vae": "model.vae.to('cuda:0')"}
    assert len(doc["problems"]) == len(report.problems)  # every finding is still there, by path


def test_html_map_has_a_card_per_real_problem_and_per_component(report: torchdoctor.ScanReport) -> None:
    page = render_html(report.to_dict())
    assert page.count('class="card move"') == 3
    real_cards = page.count('<div class="card" ')
    assert 0 < real_cards <= 4
    assert page.index("unet.extra.0") < page.index("Not yet on the device asked for")


def test_a_component_left_on_another_device_is_not_a_relocation() -> None:
    """Everything else on meta (a device the rest sits on): a lone cpu weight is a problem, not a move."""
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(6)]).to("meta")
    model[3].weight = nn.Parameter(torch.ones(2, 2))
    report = torchdoctor.scan(model, device="meta")
    real, moves = report.relocations()
    assert [p.path for p in real] == ["3.weight"] and moves == []


def test_a_tensor_in_the_wrong_dtype_is_never_folded_into_a_move() -> None:
    """The README's planted float32 weight: on another device *and* in another dtype, a move alone would not fix
    it, so it stays in the list (whether the scan reports its dtype apart or not)."""
    pipe = zoo.tiny_sd_pipeline(torch.bfloat16)
    pipe.unet.conv_in.weight.data = pipe.unet.conv_in.weight.data.float()
    report = torchdoctor.scan(pipe, "cuda:0", torch.bfloat16)
    real, moves = report.relocations()
    assert "unet.conv_in.weight" in {p.path for p in real}
    assert "unet.conv_in.weight" not in {p.path for m in moves for p in m.members}
    assert "unet.conv_in.weight" in report.text().splitlines()[1]


def test_a_float32_pipeline_asked_for_cuda_bf16_is_three_moves_that_cast() -> None:
    """The README's first call on a pipeline loaded in float32 (the default): each component is one move that
    also casts, not hundreds of "to fix" lines; a stray float32 weight in a bf16 component stays a problem."""
    pipe = zoo.tiny_sd_pipeline(torch.float32)
    report = torchdoctor.scan(pipe, "cuda:0", torch.bfloat16)
    real, moves = report.relocations()
    assert real == [] and sorted(m.fix() for m in moves) == [
        "model.text_encoder.to('cuda:0', torch.bfloat16)", "model.unet.to('cuda:0', torch.bfloat16)",
        "model.vae.to('cuda:0', torch.bfloat16)"]
    text = report.text()
    assert "  or all at once: torchdoctor.move(model, device='cuda:0', dtype=torch.bfloat16)" in text
    assert "tensors on cpu in float32  ->  model.unet.to('cuda:0', torch.bfloat16)" in text
    assert {r["dtype"] for r in report.to_dict()["relocations"]} == {"bfloat16"}
    pipe.unet.to(torch.bfloat16)
    pipe.unet.conv_in.weight.data = pipe.unet.conv_in.weight.data.float()  # a stray in a bf16 component
    real, moves = torchdoctor.scan(pipe, "cuda:0", torch.bfloat16).relocations()
    assert "unet.conv_in.weight" in {p.path for p in real}
    assert next(m for m in moves if m.component == "unet").fix() == "model.unet.to('cuda:0')"


def test_dtype_problems_of_a_moved_component_fold_into_its_cast() -> None:
    from torchdoctor._report.order import split_relocations

    ps = [{"kind": k, "path": f"unet.l{i}.w", "role": "parameter", "found": f, "expected": e}
          for i in range(3) for k, f, e in (("device", "cpu", "cuda:0"), ("dtype", "float32", "bfloat16"))]
    tensors = [{"path": f"unet.l{i}.w", "dtype": "float32", "device": "cpu", "nbytes": 16} for i in range(3)]
    exp = {"unet": {"device": "cuda:0", "device_rule": "explicit", "dtype": "bfloat16", "dtype_rule": "explicit"}}
    real, moves = split_relocations(ps, exp, tensors)
    assert real == [] and len(moves) == 1 and len(moves[0].members) == 6
    assert moves[0].fix() == "model.unet.to('cuda:0', torch.bfloat16)"


def test_a_tensor_kept_in_float32_on_purpose_folds_into_its_components_move() -> None:
    """A real T5 in float16 with its `wo` layers kept in float32 (transformers' _keep_in_fp32_modules), all on cpu,
    scanned for cuda:0 in float16: one move (`model.to('cuda:0')` moves wo too and keeps its float32), never "first
    the 2 to fix: wo.weight on cpu" beside it (hunt T24). Asked for bfloat16, the move casts: wo stays a problem."""
    from transformers import T5Config, T5EncoderModel

    m = T5EncoderModel(T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4)).half()
    for name, mod in m.named_modules():
        if name.endswith("DenseReluDense.wo"):
            mod.float()
    report = torchdoctor.scan(m, "cuda:0", torch.float16)
    real, moves = report.relocations()
    assert real == [] and [(mv.component, len(mv.members)) for mv in moves] == [("", 19)]
    assert str(report).splitlines()[0].endswith("every one a tensor not yet on the device asked for:")
    real, _ = torchdoctor.scan(m, "cuda:0", torch.bfloat16).relocations()
    assert {p.path for p in real} == {f"encoder.block.{i}.layer.1.DenseReluDense.wo.weight" for i in range(2)}


def test_float8_storage_is_moved_never_cast_by_its_components_move() -> None:
    """float8 weights (fp8-scaled checkpoints: musubi-tuner, ComfyUI) beside a bfloat16 bias, all on cpu, scanned for
    cuda:0 in bfloat16: the move keeps the storage dtype (`model.to('cuda:0')`); `model.to('cuda:0', torch.bfloat16)`
    would turn the float8 weights into bfloat16 and lose the quantization (hunt U28)."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.fc1(x))

    m = Block().to(torch.bfloat16)
    for lin in (m.fc1, m.fc2):
        lin.weight.data = lin.weight.data.to(torch.float8_e4m3fn)
        lin.register_buffer("scale_weight", torch.ones(1))
    report = torchdoctor.scan(m, "cuda:0", torch.bfloat16)
    real, moves = report.relocations()
    assert [mv.fix() for mv in moves] == ["model.to('cuda:0')"], str(report)
    assert "torch.bfloat16)" not in str(report)
    _, moves = torchdoctor.scan(Block(), "cuda:0", torch.bfloat16).relocations()  # the control: float32 is cast
    assert [mv.fix() for mv in moves] == ["model.to('cuda:0', torch.bfloat16)"]

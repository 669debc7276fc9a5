"""``torchdoctor run``'s advice comes from the run's own evidence (hunt U15): a program that reads a quantized layer's
int8 storage directly (unsloth#3337: a GRPO helper computing logits as ``torch.matmul(hidden, lm_head.weight.t())``
with a bitsandbytes ``Linear8bitLt`` head) is told about ``lm_head.weight`` -- the int8 storage of that layer, read
at its line -- and the fix is aimed there (call the layer), never explain's catalogue recipe for loading a quantized
checkpoint. Explain's catalogue fix is used only when the run has no evidence, and then labelled as such.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from run.test_run_cli import run, write
from torchdoctor._run.evidence import aimed_fix, stored_operand
from torchdoctor._run.watch import Finding


class Packed(nn.Module):  # a layer that keeps int8 storage and dequantizes it in its own forward
    def __init__(self, bias: bool = False) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randint(-8, 8, (4, 3), dtype=torch.int8))
        self.register_buffer("scale", torch.full((4, 1), 0.1))
        self.bias = nn.Parameter(torch.zeros(4)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x @ (self.weight.to(x.dtype) * self.scale.to(x.dtype)).t()
        return out + self.bias.to(x.dtype) if self.bias is not None else out


def logits(hidden: torch.Tensor, head: nn.Module) -> torch.Tensor:
    return torch.matmul(hidden, head.weight.t())


def _raised(head: nn.Module) -> RuntimeError:
    with pytest.raises(RuntimeError) as info:
        logits(torch.randn(2, 3, dtype=torch.bfloat16), head)
    return info.value


def test_int8_storage_read_by_the_users_line_is_named_with_its_layer_and_the_call_of_the_layer() -> None:
    culprit, fix = stored_operand(_raised(Packed())) or ("", "")
    assert culprit.startswith("culprit `head.weight` i8[4,3]@cpu: the int8 storage of `head` (Packed), read directly "
                              "at test_run_storage_read.py:")
    assert "line: return torch.matmul(hidden, head.weight.t())" in culprit
    lines = fix.splitlines()
    assert lines[1] == "return head(hidden)"  # the layer computes hidden @ dequantized weight.t(), no bias to add
    assert "never cast the activations to int8" in lines[0]
    assert lines[-1] == "# ^ fix unproven: named from the objects the failing line held, not re-run"


def test_a_layer_with_a_bias_is_not_rewritten_as_its_call() -> None:
    _, fix = stored_operand(_raised(Packed(bias=True))) or ("", "")
    assert "return head(hidden)" not in fix  # its call would add the bias the line does not
    assert "# call `head(...)` where this line multiplies by `head.weight`" in fix


def test_a_float_weight_is_no_storage_and_the_catalogue_fix_is_labelled() -> None:
    head = nn.Linear(3, 4, bias=False)  # float32 weight with bfloat16 activations: a plain dtype mismatch
    exc = _raised(head)
    assert stored_operand(exc) is None
    culprit, fix, source = aimed_fix(None, exc, "t = t.to(torch.float32)")
    assert (culprit, fix, source) == (None, "t = t.to(torch.float32)", "explain")
    finding = Finding("raised", "RuntimeError: x", "dtype_mismatch", "title", fix, "app.py:3 in f")
    finding.fix_from = source
    assert "  fix (explain's advice for this message: this run named no culprit or maker to aim one at):" in \
        finding.text().splitlines()
    assert finding.to_dict()["fix_from"] == "explain"
    # guard's fix aimed at its culprit comes first, whatever the line held
    said = "dtype problem\nFix:\n    model.w.data = model.w.data.to(torch.bfloat16)\n"
    assert aimed_fix(said, _raised(Packed()), "t.to(x)")[1:] == ("model.w.data = model.w.data.to(torch.bfloat16)",
                                                                  "guard")


GRPO_HEAD = """
    import torch, torch.nn as nn
    import bitsandbytes as bnb

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(64, 64)
            self.lm_head = bnb.nn.Linear8bitLt(64, 128, bias=False, has_fp16_weights=False)
        def forward(self, x): return self.body(x)

    def selective_log_softmax_logits(hidden, lm_head):
        return torch.matmul(hidden, lm_head.weight.t())

    m = Tiny().to("cuda:0")  # Linear8bitLt quantizes on the move
    m.body.to(torch.bfloat16)
    h = m(torch.randn(2, 64, device="cuda:0", dtype=torch.bfloat16))
    selective_log_softmax_logits(h, m.lm_head)
"""


def test_run_names_the_bitsandbytes_int8_head_read_directly_and_aims_its_fix_there(tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes")
    script = write(tmp_path / "grpo.py", GRPO_HEAD)
    out = tmp_path / "out.json"
    proc = run("--device", "cuda:0", "--dtype", "bfloat16", "--file", str(out), str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (f,) = json.loads(out.read_text(encoding="utf-8"))["findings"]
    assert f["where"] == "grpo.py:13 in selective_log_softmax_logits"
    # guard's diagnosis of the line names it (and proves the call on copies); the run's own reading of the line's
    # objects when guard has none: either way the culprit is the int8 head, the fix its call
    assert "lm_head.weight" in f["culprit"] and "i8[128,64]@cuda:0" in f["culprit"]
    assert "Linear8bitLt" in f["culprit"] and "storage" in f["culprit"]
    assert f["fix_from"] in ("guard", "run") and f["fix"].splitlines()[-2 if f["fix_from"] == "run" else 0] \
        .startswith("return lm_head(hidden)")
    assert "from_pretrained" not in f["fix"]  # explain's recipe for a quantized checkpoint is not this program's fix
    assert "last change: lm_head.weight: int8 on cuda:0 since `to()` at grpo.py:15" in proc.stderr  # the maker

"""One cast rule: what ``move(dtype=...)`` casts to is ``Policy.decide`` for that dtype, and float32 kept beside
bitsandbytes layers needs the marks of ``peft.prepare_model_for_kbit_training``. Real bitsandbytes, transformers
and peft throughout.

bitsandbytes 0.50 on CPU: on a CPU with AVX512-BF16 the first eval no_grad forward of a ``Linear4bit`` repacks its
weight into a CPU layout (``quant_state.packing_format_for_cpu``, which needs out_features % 32 == 0); elsewhere it
keeps the portable layout. The tests that run a 4-bit forward take both branches on every machine
(``bnb_cpu_branch``, tests/support/hardware.py), with shapes valid on both; the layout test also builds the CPU
layout with bitsandbytes' own converter.
"""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict

import pytest
import torch
from torch import nn

import torchdoctor
from support import hardware, zoo
from torchdoctor._move.plan import build
from torchdoctor._scan.policy import Policy
from torchdoctor._walk import walk

BF16 = torch.bfloat16


def _bnb_next_to_linear() -> nn.Sequential:
    """A 4-bit layer (compute bf16, fp32 bias, as bitsandbytes makes it) feeding a plain fp32 nn.Linear."""
    q = zoo.bnb_linear4bit(64, 64).proj  # sizes bitsandbytes' CPU layout accepts (rows a multiple of 32)
    with zoo._seeded(1):
        return nn.Sequential(OrderedDict(q=q, head=nn.Linear(64, 8))).eval()


def test_move_to_bf16_casts_the_plain_linear_beside_a_4bit_layer(bnb_cpu_branch) -> None:
    model = _bnb_next_to_linear()
    report = torchdoctor.move(model, dtype=BF16)
    assert model.head.weight.dtype == BF16 and model.head.bias.dtype == BF16
    assert "head.weight" not in dict(report.kept)
    assert report.ok and torchdoctor.scan(model).ok
    with torch.no_grad():
        out = model(torch.randn(2, 64, dtype=BF16))  # before the one cast rule: "mat1 and mat2 must have the same dtype"
    assert out.dtype == BF16 and out.shape == (2, 8)
    assert model.q.weight.quant_state.__dict__.get("packing_format_for_cpu", False) == bnb_cpu_branch.avx512bf16


def test_unprepared_kbit_model_fp32_linear_between_bf16_layers_is_a_problem(bnb_cpu_branch) -> None:
    # sizes both branches accept: the AVX512-BF16 repack asserts out_features % 32 == 0 and reshapes absmax per
    # block of 64 inputs (a 16-wide layer fails there on such CPUs; "shape '[32, 0]' is invalid" below 64 inputs)
    q = zoo.bnb_linear4bit(64, 64).proj
    model = nn.Sequential(OrderedDict(a=nn.Linear(64, 64).to(BF16), q=q, mid=nn.Linear(64, 64),
                                      b=nn.Linear(64, 64).to(BF16), c=nn.Linear(64, 8).to(BF16))).eval()
    x = torch.randn(2, 64, dtype=BF16)
    with torch.no_grad():
        repacks = bnb_cpu_branch.repacks(q, x)
        with pytest.raises(RuntimeError, match="same dtype"):
            model(x)
    assert bool(getattr(q.weight.quant_state, "packing_format_for_cpu", False)) == repacks == bnb_cpu_branch.avx512bf16
    report = torchdoctor.scan(model)
    assert sorted(p.path for p in report.problems) == ["mid.bias", "mid.weight"]
    assert [p.path for p in torchdoctor.scan(model, dtype=BF16).problems if not p.path.startswith("q.")] == [
        "mid.weight", "mid.bias"]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama4")
    zoo.tiny_llama().save_pretrained(path)
    return path


def _load_4bit(path, **kw):
    import transformers

    cfg = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=BF16, bnb_4bit_quant_type="nf4")
    # transformers 5 loads weights in worker threads; one thread keeps a loaded 2-core machine from stalling
    with zoo._quiet(), pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DEACTIVATE_ASYNC_LOAD", "1")
        return transformers.LlamaForCausalLM.from_pretrained(path, quantization_config=cfg, device_map="cpu",
                                                             dtype=torch.float32, **kw)


def test_4bit_llama_move_to_bf16_casts_embeddings_and_head(llama_dir, bnb_cpu_branch) -> None:
    model = _load_4bit(llama_dir)
    assert model.model.embed_tokens.weight.dtype == torch.float32 and getattr(model, "is_loaded_in_4bit", False)
    assert any(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)  # never prepared
    report = torchdoctor.move(model, dtype=BF16)
    assert model.model.embed_tokens.weight.dtype == BF16 and model.lm_head.weight.dtype == BF16
    assert model.model.norm.weight.dtype == BF16
    assert not [p for p, why in report.kept if "kbit" in why]
    assert report.ok and torchdoctor.scan(model).ok
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 7, 9]])).logits
    assert logits.dtype == BF16 and torch.isfinite(logits.float()).all()
    layer = model.model.layers[0].self_attn.k_proj  # 32 rows: both branches accept it
    assert getattr(layer.weight.quant_state, "packing_format_for_cpu", False) == bnb_cpu_branch.avx512bf16
    assert torchdoctor.scan(model).ok  # the layout the forward left is storage too


def test_unprepared_4bit_llama_fp32_head_among_bf16_is_a_problem(llama_dir, bnb_cpu_branch) -> None:
    model = _load_4bit(llama_dir)
    torchdoctor.move(model, dtype=BF16)
    model.lm_head.to(torch.float32)  # a leftover: nothing prepared this model for kbit training
    with pytest.raises(RuntimeError, match="same dtype"):
        with torch.no_grad():
            model(torch.tensor([[1, 5, 7, 9]]))
    assert [p.path for p in torchdoctor.scan(model).problems] == ["lm_head.weight"]
    assert [p.path for p in torchdoctor.scan(model, dtype=BF16).problems] == ["lm_head.weight"]


@pytest.mark.parametrize("checkpointing", [True, False], ids=["gradient-checkpointing", "cast-only"])
def test_prepared_kbit_model_keeps_fp32_and_scan_is_quiet(llama_dir, checkpointing: bool) -> None:
    import peft

    model = _load_4bit(llama_dir)
    with zoo._quiet():
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing)
    assert model.model.norm.weight.dtype == torch.float32 and model.lm_head.weight.dtype == torch.float32
    if checkpointing:  # the marks peft leaves: the input-require-grads hook and gradient checkpointing
        assert model.__dict__.get("_require_grads_hook") is not None and model.is_gradient_checkpointing
    assert Policy(walk(model), None, BF16, False).kbit_prepared
    assert torchdoctor.scan(model).ok and torchdoctor.scan(model, dtype=BF16).ok
    built = build(model, None, BF16, True)
    assert dict(built.kept).get("lm_head.weight") == "prepare_model_for_kbit_training keeps it float32"
    report = torchdoctor.move(model, dtype=BF16)
    assert report.ok and model.lm_head.weight.dtype == torch.float32
    model.train()
    out = model(torch.tensor([[1, 5, 7, 9]]), labels=torch.tensor([[1, 5, 7, 9]]))
    assert torch.isfinite(out.loss)
    # keep_fp32=False casts what Module.to casts, prepared or not
    torchdoctor.move(model, dtype=BF16, keep_fp32=False)
    assert model.lm_head.weight.dtype == BF16


def test_both_4bit_cpu_layouts_are_storage_for_scan_and_move(bnb_cpu_branch) -> None:
    """The portable layout and bitsandbytes' AVX512-BF16 CPU layout (made with its own converter): never cast, never
    voted, and the quant_state (absmax bf16 in the CPU layout) is metadata."""
    import bitsandbytes.functional as F

    portable = _bnb_next_to_linear()
    packed = _bnb_next_to_linear()
    w = packed.q.weight
    w.data, qs = F._convert_weight_packed_for_cpu(w.data, w.quant_state)
    assert qs.packing_format_for_cpu and qs.absmax.dtype == BF16 and w.dtype == torch.uint8
    for model in (portable, packed):
        assert [p.path for p in torchdoctor.scan(model).problems] == []
        data = model.q.weight.data.clone()
        report = torchdoctor.move(model, dtype=BF16)
        assert report.ok and torch.equal(model.q.weight.data, data) and model.head.weight.dtype == BF16
    assert packed.q.weight.quant_state.absmax.dtype == BF16  # metadata: left as bitsandbytes made it
    with torch.no_grad():  # the packed layout's forward works on what move left (the numbers are the kernel's)
        assert packed(torch.randn(2, 64, dtype=BF16)).dtype == BF16
    with torch.no_grad():  # the layout the first eval forward leaves: repacked on the AVX512-BF16 branch only
        assert portable(torch.randn(2, 64, dtype=BF16)).dtype == BF16
    repacked = bool(getattr(portable.q.weight.quant_state, "packing_format_for_cpu", False))
    assert repacked == portable.q.support_avx512bf16_for_cpu == bnb_cpu_branch.avx512bf16
    assert torchdoctor.scan(portable).ok and torchdoctor.move(portable, dtype=BF16).ok


def test_both_branches_compute_the_same_numbers(bnb_cpu_branch) -> None:
    """The eval forward (repacked on the AVX512-BF16 branch) against the training-mode forward (never repacked)."""
    model, twin = zoo.bnb_linear4bit(64, 128), zoo.bnb_linear4bit(64, 128)
    x = torch.randn(3, 64, dtype=BF16)
    with torch.no_grad():
        ref = twin.train()(x).float()
        out = model(x).float()
    assert getattr(model.proj.weight.quant_state, "packing_format_for_cpu", False) == bnb_cpu_branch.avx512bf16
    assert torch.allclose(out, ref, atol=0.05), (out - ref).abs().max()


_CHILD = """
import torch
from support import zoo
from support.hardware import avx512bf16_kernel_registered
model, twin = zoo.bnb_linear4bit(64, 128), zoo.bnb_linear4bit(64, 128)
x = torch.randn(3, 64, dtype=torch.bfloat16)
with torch.no_grad():
    out, ref = model(x).float(), twin.train()(x).float()
print(avx512bf16_kernel_registered(), getattr(model.proj.weight.quant_state, "packing_format_for_cpu", False),
      bool(torch.allclose(out, ref, atol=0.05)))
"""


@pytest.mark.parametrize("branch", hardware.BRANCHES)
def test_the_import_branch_forced_either_way_runs_a_4bit_forward(branch: str) -> None:
    """A fresh process on each import branch (what ``TD_TEST_BNB_AVX512BF16`` does to a whole suite run): the fused
    kernel is registered only on the AVX512-BF16 one, and the repacked forward gives the portable numbers (on a CPU
    without the instructions, through the stand-in; bitsandbytes' own kernel would end the process with SIGILL)."""
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120,
                          env=hardware.child_env(branch))
    assert done.returncode == 0, done.stderr[-3000:]
    on = branch == "avx512bf16"
    assert done.stdout.split() == [str(on), str(on), "True"], done.stdout

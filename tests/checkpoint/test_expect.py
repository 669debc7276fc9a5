"""config.json beside a checkpoint decides its expected dtype and the modules kept in float32, both directions.

A real tiny T5 saved in fp16 by ``from_pretrained(dtype=float16)`` + ``save_pretrained`` keeps its ``wo``
layers in float32 (``T5ForConditionalGeneration._keep_in_fp32_modules``): quiet. The same file with one weight
left in float32 is reported by its exact key, once.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

import torchdoctor
from checkpoint.capped import assert_bounded, run_scans
from support import zoo

LEFTOVER = "decoder.block.0.layer.0.SelfAttention.q.weight"


@pytest.fixture(scope="module")
def t5_fp16(tmp_path_factory) -> Path:
    from transformers import T5ForConditionalGeneration

    model = zoo.build("t5").obj
    src, out = tmp_path_factory.mktemp("t5-src"), tmp_path_factory.mktemp("t5") / "t5-fp16"
    model.save_pretrained(src)
    half = T5ForConditionalGeneration.from_pretrained(src, dtype=torch.float16)
    kept = {n for n, p in half.named_parameters() if p.dtype == torch.float32}
    assert kept and all(".wo." in n for n in kept)  # transformers itself kept them
    half.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    return out


@pytest.fixture(scope="module")
def t5_leftover(t5_fp16, tmp_path_factory) -> Path:
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("t5-left") / "t5-fp16-leftover"
    shutil.copytree(t5_fp16, out)
    state = load_file(str(out / "model.safetensors"))
    state[LEFTOVER] = state[LEFTOVER].float()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_t5_fp16_with_kept_fp32_wo_is_quiet_and_a_leftover_is_named(t5_fp16, t5_leftover):
    clean, clean_declared, dirty, dirty_declared = run_scans([
        ["scan", str(t5_fp16), "--dtype", "float16"], ["scan", str(t5_fp16), "--json"],
        ["scan", str(t5_leftover), "--dtype", "float16", "--json"], ["scan", str(t5_leftover), "--json"],
    ])
    for run in (clean, clean_declared, dirty, dirty_declared):
        assert_bounded(run)
    assert clean.rc == 0 and "ok: no problems found" in clean.out, clean.out
    doc = json.loads(clean_declared.out)
    assert clean_declared.rc == 0 and doc["expected"]["."]["rule"] == "declared-dtype"
    for run, why in ((dirty, "you asked for float16"), (dirty_declared, "config.json declares dtype float16")):
        doc = json.loads(run.out)
        assert run.rc == 1
        (p,) = doc["problems"]  # one leftover: one problem, by its exact key
        assert (p["kind"], p["path"], p["tensors"], p["found"], p["expected"]) == (
            "dtype", LEFTOVER, [LEFTOVER], "float32", "float16")
        assert f"expected float16 because {why}" in p["message"]
        assert "T5ForConditionalGeneration._keep_in_fp32_modules keeps wo in float32" in p["message"]
        assert "2 such tensor(s) are float32 as expected" in p["message"]


def test_kept_modules_follow_the_loaded_dtype(t5_fp16):
    """transformers keeps ``_keep_in_fp32_modules`` only when loading in float16: asked for bfloat16, the fp16
    weights and the fp32 ``wo`` are both off, each said once."""
    report = torchdoctor.scan(str(t5_fp16), dtype="bfloat16")
    by_found = {p.found: p for p in report.problems}
    assert set(by_found) == {"float16", "float32"}
    wo = by_found["float32"]
    assert sorted(wo.tensors) == sorted(t.path for t in report.tensors if t.dtype == torch.float32)
    assert all(".wo." in k for k in wo.tensors) and len(wo.tensors) == 2
    assert "T5ForConditionalGeneration keeps no module in float32 for bfloat16" in wo.message


def test_without_transformers_the_kept_set_is_unknown_and_said_so(t5_fp16, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # "import transformers" now raises ImportError
    report = torchdoctor.scan(str(t5_fp16))
    (p,) = report.problems
    assert p.found == "float32" and all(".wo." in k for k in p.tensors)
    assert "transformers is not importable, so which modules T5ForConditionalGeneration keeps in float32 is " \
           "unknown" in p.message


def test_no_config_no_dtype_judgement_but_the_majority_is_named(t5_fp16, tmp_path):
    shutil.copy(t5_fp16 / "model.safetensors", tmp_path / "model.safetensors")
    report = torchdoctor.scan(str(tmp_path / "model.safetensors"))
    assert report.ok and report.expected == {}
    (group,) = report.extra["groups"]
    assert group["majority_dtype"]["dtype"] == "float16"


def test_a_model_folder_is_judged_by_the_files_from_pretrained_loads(tmp_path: Path) -> None:
    """A Hub snapshot often holds a .bin beside model.safetensors, or fp16 variants beside the full weights:
    from_pretrained loads one of them, so the others are listed as not loaded, never judged as the model."""
    from safetensors.torch import save_file

    folder = tmp_path / "llm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "bfloat16"}))
    save_file({"w": torch.ones(4, 4, dtype=torch.bfloat16)}, str(folder / "model.safetensors"))
    torch.save({"w": torch.ones(4, 4)}, folder / "pytorch_model.bin")
    report = torchdoctor.scan(str(folder), dtype=torch.bfloat16)
    assert report.ok, report.problems
    assert [s["path"] for s in report.extra["skipped"]] == ["pytorch_model.bin"]
    assert "from_pretrained loads instead" in report.extra["skipped"][0]["reason"]
    unet = tmp_path / "pipe" / "unet"
    unet.mkdir(parents=True)
    (unet / "config.json").write_text(json.dumps({"_class_name": "UNet2DConditionModel"}))
    save_file({"w": torch.ones(4, 4)}, str(unet / "diffusion_pytorch_model.safetensors"))
    save_file({"w": torch.ones(4, 4, dtype=torch.float16)}, str(unet / "diffusion_pytorch_model.fp16.safetensors"))
    report = torchdoctor.scan(str(tmp_path / "pipe"), dtype=torch.float32)
    assert report.ok, report.problems
    assert "variant='fp16'" in report.extra["skipped"][0]["reason"]
    assert not torchdoctor.scan(str(unet / "diffusion_pytorch_model.fp16.safetensors"), dtype=torch.float32).ok
    only = tmp_path / "only_variant"
    only.mkdir()
    (only / "config.json").write_text("{}")
    save_file({"w": torch.ones(2, dtype=torch.float16)}, str(only / "model.fp16.safetensors"))
    assert not torchdoctor.scan(str(only), dtype=torch.float32).ok  # only variants: they are what is there


def test_training_state_keeps_float32_by_design(tmp_path: Path) -> None:
    """A training checkpoint: a bf16 model beside AdamW's state (``step`` is float32 in torch) and a loss scale."""
    model = torch.nn.Linear(4, 4).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4, dtype=torch.bfloat16)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": {"scale": torch.tensor(65536.0)}}
    torch.save(state, tmp_path / "train.pt")
    assert torchdoctor.scan(str(tmp_path / "train.pt"), dtype=torch.bfloat16).ok
    state["model"]["bias"] = state["model"]["bias"].float()  # a real leftover in the model's own weights
    torch.save(state, tmp_path / "train.pt")
    report = torchdoctor.scan(str(tmp_path / "train.pt"), dtype=torch.bfloat16)
    assert [p.path for p in report.problems] == ["model.bias"]

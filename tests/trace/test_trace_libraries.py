"""trace on the real libraries: diffusers LoRA on a bf16 UNet pipeline, peft adapters on a tiny Llama, accelerate
offload hooks, bitsandbytes quantization, and the seed pattern (an unload that leaves one bias behind)."""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo
from torchdoctor._trace import note_for
from torchdoctor._trace.patches import patched
from torchdoctor._trace.record import short_file

HERE = __file__
ADAPTER = re.compile(r"^unet\..*\.(to_q|to_k|to_v|to_out\.0)\.lora_[AB]\.a\.weight$")
BIAS = "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_out.0.bias"


def _next_line() -> int:
    return sys._getframe(1).f_lineno + 1


def _by_line(records: Any) -> dict[int | None, list[Any]]:
    out: dict[int | None, list[Any]] = defaultdict(list)
    for r in records:
        out[r.line].append(r)
    return dict(out)


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A diffusers LoRA file for the tiny UNet, written offline: adapters added with peft, saved by diffusers."""
    from diffusers import StableDiffusionPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    unet = zoo.tiny_unet(torch.bfloat16, seed=5)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                                init_lora_weights=False))
    out = tmp_path_factory.mktemp("lora")
    StableDiffusionPipeline.save_lora_weights(str(out), unet_lora_layers=get_peft_model_state_dict(unet))
    return str(out)


def test_unet_bf16_lora_load_fuse_unfuse_unload_each_change_has_its_call_and_line(lora_dir: str) -> None:
    pipe = zoo.tiny_sd_pipeline(torch.bfloat16)
    with torchdoctor.trace(pipe, lora=True) as t:
        load = _next_line()
        pipe.load_lora_weights(lora_dir, adapter_name="a")
        fuse = _next_line()
        pipe.fuse_lora()
        unfuse = _next_line()
        pipe.unfuse_lora()
        device = _next_line()
        pipe.set_lora_device(["a"], "meta")
        unload = _next_line()
        pipe.unload_lora_weights()
    lines = _by_line(t.records)
    assert set(lines) == {load, device, unload}, "fuse/unfuse change values in place, never a placement"
    assert fuse not in lines and unfuse not in lines
    assert {r.file for r in t.records} == {HERE}
    added = {r.path for r in lines[load]}
    assert len(added) == 64 and all(ADAPTER.match(p) for p in added), sorted(added)[:4]
    assert {(r.kind, r.call, r.qualname, r.to_device, r.to_dtype, r.lora) for r in lines[load]} == {
        ("add", "load_lora_weights()", "StableDiffusionPipeline.load_lora_weights", "cpu", "bfloat16", True)}
    assert {r.path for r in lines[device]} == added
    assert {(r.kind, r.call, r.from_device, r.to_device, r.to_dtype) for r in lines[device]} == {
        ("move", "set_lora_device()", "cpu", "meta", "bfloat16")}
    assert {r.path for r in lines[unload]} == added
    assert {(r.kind, r.call, r.from_device) for r in lines[unload]} == {("remove", "unload_lora_weights()", "meta")}
    path = sorted(added)[0]
    assert [r.kind for r in t.history(path)] == ["add", "move", "remove"]
    assert t.who_moved(path).call == "set_lora_device()"
    # wrapping a layer in a LoRA layer renames its weight (to_q.weight -> to_q.base_layer.weight): not a change
    assert not any("base_layer" in r.path for r in t.records)
    assert patched() == []


def test_peft_llama_add_set_delete_adapter(caplog: pytest.LogCaptureFixture) -> None:
    from peft import LoraConfig

    model = zoo.lora_llama(torch.bfloat16)
    with torchdoctor.trace(model, lora=True) as t:
        add = _next_line()
        model.add_adapter("b", LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
        set_ = _next_line()
        model.set_adapter("b")
        delete = _next_line()
        model.delete_adapter("default")
        cast = _next_line()
        model.base_model.model.model.layers[1].self_attn.q_proj.lora_B["b"].to(torch.bfloat16)
    lines = _by_line(t.records)
    assert set(lines) == {add, delete, cast}, "set_adapter changes which adapter runs, not where tensors are"
    assert set_ not in lines
    prefix = "base_model.model.model.layers"
    assert {(r.path, r.kind, r.call, r.qualname, r.to_dtype) for r in lines[add]} == {
        (f"{prefix}.{i}.self_attn.q_proj.lora_{ab}.b.weight", "add", "add_adapter()", "PeftModel.add_adapter",
         "float32") for i in (0, 1) for ab in "AB"}  # peft's autocast_adapter_dtype: fp32 over a bf16 base
    assert {(r.path, r.kind, r.call) for r in lines[delete]} == {
        (f"{prefix}.{i}.self_attn.{proj}.lora_{ab}.default.weight", "remove", "delete_adapter()")
        for i in (0, 1) for proj in ("q_proj", "v_proj") for ab in "AB"}
    [cast_rec] = lines[cast]
    assert (cast_rec.path, cast_rec.from_dtype, cast_rec.to_dtype, cast_rec.call) == (
        f"{prefix}.1.self_attn.q_proj.lora_B.b.weight", "float32", "bfloat16", "to()")
    assert note_for(cast_rec.path) is None  # no trace active any more


def test_accelerate_offload_hooks_moves_in_and_out_of_meta() -> None:
    from accelerate import cpu_offload

    model = zoo.tiny_llama(torch.float32)
    n = len(list(model.parameters()))
    ids = torch.tensor([[1, 2, 3]])
    with torchdoctor.trace(model) as t:
        offload = _next_line()
        cpu_offload(model, execution_device="cpu")
        with torch.no_grad():
            fwd = _next_line()
            model(ids)
    lines = _by_line(t.records)
    assert {(r.call, r.from_device, r.to_device, r.via) for r in lines[offload]} == {
        ("cpu_offload()", "cpu", "meta", "AlignDevicesHook.init_hook")}
    assert len(lines[offload]) == n
    onload = [r for r in lines[fwd] if r.to_device == "cpu"]
    back = [r for r in lines[fwd] if r.to_device == "meta"]
    assert len(onload) == len(back) == n
    assert {(r.call, r.via) for r in onload} == {("LlamaForCausalLM.forward()", "AlignDevicesHook.pre_forward")}
    assert {r.via for r in back} == {"AlignDevicesHook.post_forward"}


def test_bitsandbytes_params4bit_to_and_its_quant_state() -> None:
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    layer = bnb.nn.Linear4bit(64, 128, compute_dtype=torch.bfloat16, quant_type="nf4")
    layer.load_state_dict(nn.Linear(64, 128).state_dict())
    model = nn.Sequential(layer)
    with torchdoctor.trace(model) as t:
        quantize = _next_line()
        model.to("cpu")  # Params4bit.to(a real device) quantizes
        with pytest.raises(RuntimeError, match="requires that detach"):
            meta = _next_line()
            model.to("meta")
    q = {r.path: r for r in t.records if r.line == quantize}
    assert (q["0.weight"].from_dtype, q["0.weight"].to_dtype, q["0.weight"].call) == ("float32", "uint8", "to()")
    assert {"0.weight.quant_state.absmax", "0.weight.quant_state.code"} <= {p for p, r in q.items() if r.kind == "add"}
    # the failed .to("meta") had already moved the shared quant_state in place: the trace says so
    moved = {r.path for r in t.records if r.line == meta and r.to_device == "meta"}
    assert "0.weight.quant_state.absmax" in moved and "0.weight" not in moved
    assert patched() == []


@pytest.fixture()
def leaky_unload(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The seed bug: an unload that restores one bias from its float32 CPU copy and forgets to cast it back."""
    import diffusers.utils

    original = diffusers.utils.recurse_remove_peft_layers

    def recurse_remove_peft_layers(model: nn.Module) -> Any:
        out = original(model)
        if type(model).__name__ == "UNet2DConditionModel":
            bias = model.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_out[0].bias
            bias.data = bias.data.float()
        return out

    monkeypatch.setattr(diffusers.utils, "recurse_remove_peft_layers", recurse_remove_peft_layers)
    yield


def test_seed_an_unload_that_leaves_one_bias_behind_is_named_with_its_call_and_line(
        lora_dir: str, leaky_unload: None) -> None:
    pipe = zoo.tiny_sd_pipeline(torch.bfloat16)
    pipe.load_lora_weights(lora_dir, adapter_name="a")
    with torchdoctor.trace(pipe) as t:
        unload = _next_line()
        pipe.unload_lora_weights()
        bias = pipe.unet.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_out[0].bias
        note = note_for(bias)
    [rec] = [r for r in t.records if r.kind == "move"]  # the adapters it removed are records of kind "remove"
    assert {r.call for r in t.records} == {"unload_lora_weights()"}
    assert (rec.path, rec.from_dtype, rec.to_dtype, rec.call, rec.file, rec.line) == (
        BIAS, "bfloat16", "float32", "unload_lora_weights()", HERE, unload)
    assert t.who_moved(BIAS) == rec
    assert note == f"float32 since `unload_lora_weights()` at {short_file(HERE)}:{unload}"


def test_seed_guard_error_names_the_bias_the_unload_call_and_its_line(lora_dir: str, leaky_unload: None) -> None:
    pipe = zoo.tiny_sd_pipeline(torch.bfloat16)
    pipe.load_lora_weights(lora_dir, adapter_name="a")
    inputs = zoo.build("unet", torch.bfloat16).inputs
    with torchdoctor.trace(pipe):
        unload = _next_line()
        pipe.unload_lora_weights()
        with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad():
            with torchdoctor.guard(pipe.unet):
                pipe.unet(**inputs)
    message = str(info.value)
    assert "to_out.0.bias" in message  # guard alone names the bias
    # needs the lead's wiring of torchdoctor._trace.note_for into guard's PlacementError:
    assert f"`unload_lora_weights()` at {short_file(HERE)}:{unload}" in message, message

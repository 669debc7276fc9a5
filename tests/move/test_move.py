"""``move``: deep, verified, quantization-aware, never half-moved (issue 3). Real libraries on CPU; meta and
virtual ``cuda:1`` (``simulate``) stand in for a second device."""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from typing import Any

import pytest
import torch
from support import zoo
from support.helpers import assert_unchanged, fingerprint
from torch import nn

import torchdoctor
from torchdoctor import PlacementError
from torchdoctor._cli.main import main
from torchdoctor._move.apply import move
from torchdoctor._move.plan import MoveReport, PlanStep, plan
from torchdoctor._walk import walk

BF16 = torch.bfloat16


def _entries(obj: Any) -> dict[str, torch.Tensor]:
    return {e.path: e.tensor for e in walk(obj).entries}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_same_tensors(a: Any, b: Any) -> None:
    """Every path the walker finds: same dtype, device, shape and bytes (bit for bit)."""
    ta, tb = _entries(a), _entries(b)
    assert ta.keys() == tb.keys()
    for path, x in ta.items():
        y = tb[path]
        assert (x.dtype, x.device, x.shape) == (y.dtype, y.device, y.shape), path
        if x.device.type != "meta" and x.numel():
            assert torch.equal(_bits(x), _bits(y)), path


def _output(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    images = getattr(out, "images", None)
    return images if isinstance(images, torch.Tensor) else out[0]


def _module_to(obj: Any, *args: Any) -> None:
    obj.to(*args)  # pipelines and modules alike: what a user writes today


def _fp(obj: Any) -> Any:
    return fingerprint(obj, torch_state=False)


# --- what Module.to leaves behind ---------------------------------------------------------------------------


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.full((4,), 2.0)  # a plain tensor attribute
        self.blocks = [nn.Linear(4, 4), nn.Linear(4, 4)]  # list-held: not submodules
        self.table = {"bias": torch.zeros(4), "ids": torch.arange(4)}
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.lin(x) * self.scale + self.table["bias"]


def test_plain_attributes_list_held_modules_and_containers_move() -> None:
    control = Holder()
    control.to(BF16)
    assert control.scale.dtype == torch.float32 and control.blocks[0].weight.dtype == torch.float32

    model = Holder()
    x = torch.randn(2, 4)
    expected = model(x).to(BF16)
    weights = [model.lin.weight, model.blocks[0].weight]
    report = move(model, dtype=BF16)
    assert {r.path for r in report.moved} >= {"lin.weight", "scale", "blocks.0.weight", "blocks.1.bias", "table.bias"}
    assert model.scale.dtype == model.blocks[1].bias.dtype == model.table["bias"].dtype == BF16
    assert model.table["ids"].dtype == model.steps.dtype == torch.int64  # integers are never cast
    assert model.lin.weight is weights[0] and model.blocks[0].weight is weights[1]
    torch.testing.assert_close(model(x.to(BF16)), expected, atol=0.1, rtol=0.05)
    assert torchdoctor.scan(model, dtype=BF16, strict=True).ok

    move(model, "meta")
    assert {t.device.type for t in _entries(model).values()} == {"meta"}


def test_optimizer_built_before_a_cast_keeps_training_the_moved_parameters() -> None:
    model = Holder()
    opt = torch.optim.SGD([p for m in (model, *model.blocks) for p in m.parameters()], lr=0.5)
    move(model, dtype=BF16)
    before = model.blocks[0].weight.detach().clone()
    model(torch.randn(3, 4, dtype=BF16)).sum().backward()
    opt.step()
    assert model.blocks[0].weight.dtype == BF16
    assert not torch.equal(model.blocks[0].weight.detach(), before)
    assert opt.param_groups[0]["params"][2] is model.blocks[0].weight


def test_optimizer_over_a_transformers_model_updates_every_moved_parameter() -> None:
    model = zoo.tiny_llama()
    model.train()
    params = dict(model.named_parameters())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    move(model, dtype=BF16, keep_fp32=False)
    assert all(p is params[n] and p.dtype == BF16 for n, p in model.named_parameters())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(input_ids=torch.randint(3, 100, (1, 8)), labels=torch.randint(3, 100, (1, 8))).loss.backward()
    opt.step()
    stale = [n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert stale == [], stale  # Adam moves every parameter that got a gradient: all of them here


def test_gradients_follow_their_parameters_as_with_module_to() -> None:
    model = nn.Linear(3, 3)
    model(torch.randn(2, 3)).sum().backward()
    move(model, dtype=BF16)
    assert model.weight.grad is not None and model.weight.grad.dtype == BF16


def test_tied_weights_stay_tied() -> None:
    model = zoo.build("gpt2").obj
    assert model.lm_head.weight is model.transformer.wte.weight
    move(model, dtype=BF16)
    assert model.lm_head.weight is model.transformer.wte.weight and model.lm_head.weight.dtype == BF16
    move(model, "meta")  # new Parameter objects here (as Module.to makes), still one object for both paths
    assert model.lm_head.weight is model.transformer.wte.weight and model.lm_head.weight.is_meta


def test_shared_storage_moves_once_and_stays_shared() -> None:
    m = nn.Module()
    base = torch.arange(12.0)
    m.register_buffer("a", base[:6])
    m.register_buffer("b", base[6:].view(2, 3))
    m.c = base  # the whole storage, as a plain attribute
    report = move(m, dtype=BF16)
    assert report.bytes == 12 * 2  # one storage of 12 bf16 values, not three copies
    st = m.a.untyped_storage()._cdata
    assert m.b.untyped_storage()._cdata == st == m.c.untyped_storage()._cdata
    assert m.b.tolist() == [[6, 7, 8], [9, 10, 11]] and m.b.dtype == BF16
    move(m, "meta")
    assert m.a.untyped_storage()._cdata == m.b.untyped_storage()._cdata


# --- the zoo: dtype casts equal Module.to bit for bit ---------------------------------------------------------


@pytest.mark.parametrize("name", zoo.NAMES)
def test_zoo_bf16_cast_equals_module_to_bit_for_bit(name: str) -> None:
    ref, ours = zoo.build(name), zoo.build(name)
    _module_to(ref.obj, BF16)
    report = move(ours.obj, dtype=BF16, keep_fp32=False)
    assert report.ok and report.moved
    assert_same_tensors(ref.obj, ours.obj)
    inputs = zoo.build(name, BF16).inputs
    with torch.no_grad():
        a, b = _output(ref.call(ref.obj, inputs)), _output(ours.call(ours.obj, inputs))
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
@pytest.mark.parametrize("name", zoo.NAMES)
def test_zoo_cast_keeps_what_from_pretrained_keeps_fp32(name: str, dtype: torch.dtype) -> None:
    built, ref = zoo.build(name), zoo.build(name, dtype)
    report = move(built.obj, dtype=dtype)
    got, want = _entries(built.obj), _entries(ref.obj)
    computed = {f"{mp}.{n}" if mp else n for mp, m in walk(ref.obj).modules for n in m._non_persistent_buffers_set}
    for path, t in want.items():
        if path in computed:  # from_pretrained computes rotary inv_freq at init, in fp32 (move keeps the one its
            # forward upcasts so); Module.to casts it: either, but float32 where the zoo's build kept it float32
            allowed = (torch.float32,) if t.dtype == torch.float32 else (t.dtype, dtype, torch.float32)
            assert got[path].dtype in allowed, path
            continue
        if name == "unet_lora" and ".lora_" in path:
            # diffusers' add_adapter makes adapters in the base dtype; fp32 adapters stay fp32 (peft's default)
            assert got[path].dtype == torch.float32, path
            continue
        assert got[path].dtype == t.dtype, path
    assert torchdoctor.scan(built.obj).ok
    with torch.no_grad():
        assert _output(built.call(built.obj, ref.inputs)).isfinite().all()
    # transformers keeps _keep_in_fp32_modules for fp16 only (t5's wo), the strict list (dots1) for both
    if name in ("wan", "dots1") or (name == "t5" and dtype == torch.float16):
        assert any(r == "_keep_in_fp32_modules" for _, r in report.kept)
    elif name == "t5":
        assert built.obj.encoder.block[0].layer[1].DenseReluDense.wo.weight.dtype == dtype


# --- peft ------------------------------------------------------------------------------------------------------


def _adapter_dtypes(model: nn.Module) -> set[torch.dtype]:
    return {p.dtype for n, p in model.named_parameters() if ".lora_" in n}


@pytest.mark.parametrize("make", [zoo.lora_llama, lambda dtype: zoo.lora_unet(dtype, via="peft")])
def test_peft_adapters_follow_the_design_policy(make: Any) -> None:
    model = make(BF16)  # fp32 adapters over a bf16 base (peft's autocast_adapter_dtype=True)
    assert _adapter_dtypes(model) == {torch.float32}
    move(model, dtype=torch.float16)
    assert _adapter_dtypes(model) == {torch.float32}
    assert {p.dtype for n, p in model.named_parameters() if ".lora_" not in n} == {torch.float16}
    assert torchdoctor.scan(model).ok

    mixed = make(BF16)
    layer = next(m for n, m in mixed.named_modules() if hasattr(m, "lora_A") and len(m.lora_A))
    layer.lora_A["default"].weight.data = layer.lora_A["default"].weight.data.to(BF16)  # mixed within one adapter
    assert not torchdoctor.scan(mixed).ok
    move(mixed, dtype=BF16)
    assert {layer.lora_A["default"].weight.dtype, layer.lora_B["default"].weight.dtype} == {BF16}
    assert torchdoctor.scan(mixed).ok

    flat = make(BF16)
    move(flat, dtype=torch.float16, keep_fp32=False)
    assert _adapter_dtypes(flat) == {torch.float16}


def test_peft_llama_runs_after_the_move() -> None:
    b = zoo.build("llama_lora")
    move(b.obj, dtype=torch.float32)
    with torch.no_grad():
        assert b.run().logits.dtype == torch.float32


# --- the tiny StableDiffusionPipeline --------------------------------------------------------------------------


def test_pipeline_components_cast_scheduler_moved_never_cast() -> None:
    b = zoo.build("sd_pipeline")
    pipe = b.obj
    report = move(pipe, dtype=BF16)
    assert pipe.unet.conv_in.weight.dtype == pipe.vae.decoder.conv_out.weight.dtype == BF16
    assert pipe.text_encoder.final_layer_norm.weight.dtype == BF16
    assert pipe.scheduler.alphas_cumprod.dtype == torch.float32  # pipe.to keeps it too; schedulers need fp32
    assert ("scheduler.alphas_cumprod", "tensor of a non-module object") in report.kept
    with torch.no_grad():
        assert _output(b.call(pipe, zoo.build("sd_pipeline", BF16).inputs)).shape == (1, 3, 16, 16)
    move(pipe, "meta")
    assert torchdoctor.scan(pipe, device="meta", strict=True).ok
    assert pipe.scheduler.alphas_cumprod.is_meta  # what pipe.to("meta") leaves on cpu


# --- bitsandbytes --------------------------------------------------------------------------------------------


def test_bnb_linear4bit_to_meta_fails_half_way_but_move_works() -> None:
    control = zoo.bnb_linear4bit()
    with pytest.raises(RuntimeError):
        control.to("meta")
    qs = control.proj.weight.quant_state
    assert control.proj.weight.device.type == "cpu" and qs.absmax.is_meta  # the half-moved layer that Linear4bit.to('meta') leaves

    model = zoo.bnb_linear4bit()
    qs = model.proj.weight.quant_state
    report = move(model, "meta")
    paths = {r.path for r in report.moved}
    assert {"proj.weight", "proj.bias", "proj.weight.quant_state.code", "proj.weight.quant_state.state2.code"} <= paths
    w = model.proj.weight
    assert type(w).__name__ == "Params4bit" and w.is_meta and w.bnb_quantized
    assert w.quant_state is qs is model.proj.quant_state  # one QuantState, shared as bitsandbytes shares it
    assert torchdoctor.scan(model, device="meta", strict=True).ok
    assert model(torch.randn(2, 64, device="meta")).shape == (2, 128)


def test_bnb_linear4bit_cast_equals_module_to_and_keeps_packed_data() -> None:
    ref, model = zoo.bnb_linear4bit(), zoo.bnb_linear4bit()
    w = model.proj.weight
    ref.to(BF16)
    report = move(model, dtype=BF16)
    assert [r.path for r in report.moved] == ["proj.bias"]
    assert model.proj.weight is w and w.dtype == torch.uint8
    qs = w.quant_state
    assert (qs.absmax.dtype, qs.code.dtype, qs.state2.absmax.dtype) == (torch.uint8, torch.float32, torch.float32)
    assert_same_tensors(ref, model)
    x = torch.randn(2, 64)
    ref.train(), model.train()  # training mode: no CPU repack, both run the same path
    assert torch.equal(ref(x.to(BF16)), model(x.to(BF16)))


def test_bnb_linear8bit_state_after_first_forward_moves_with_the_weight() -> None:
    model = zoo.bnb_linear8bit(forward=True)
    assert model.proj.weight.CB is None and model.proj.state.CB is not None
    report = move(model, "meta")
    assert {"proj.state.CB", "proj.state.SCB"} <= {r.path for r in report.moved}
    st = model.proj.state
    assert st.CB.is_meta and st.SCB.is_meta and model.proj.weight.is_meta
    # CB is the weight's storage: moved once, still shared
    assert st.CB.untyped_storage()._cdata == model.proj.weight.untyped_storage()._cdata
    assert report.bytes == 128 * 64 + 128 * 4 + 128 * 4

    model = zoo.bnb_linear8bit(forward=True)
    x = torch.randn(2, 64)
    with torch.no_grad():
        y = model(x)
    move(model, dtype=BF16)
    assert model.proj.state.SCB.dtype == torch.float32 and model.proj.weight.dtype == torch.int8
    assert model.proj.bias.dtype == BF16
    with torch.no_grad():
        torch.testing.assert_close(model(x.to(BF16)).float(), y, atol=0.05, rtol=0.05)


def test_bnb_linear8bit_before_forward_moves_weight_cb_scb() -> None:
    model = zoo.bnb_linear8bit()
    move(model, "meta")
    w = model.proj.weight
    assert type(w).__name__ == "Int8Params" and w.CB.is_meta and w.SCB.is_meta
    assert w.CB.untyped_storage()._cdata == w.untyped_storage()._cdata


def test_bnb_before_0_45_3_quant_state_to_without_code_is_fixed_by_move(monkeypatch: pytest.MonkeyPatch) -> None:
    from bitsandbytes.functional import QuantState

    def old_to(self: Any, device: Any) -> None:  # bitsandbytes < 0.45.3: `code` is not moved
        self.absmax = self.absmax.to(device)
        if self.nested:
            self.offset = self.offset.to(device)
            self.state2.absmax = self.state2.absmax.to(device)
            self.state2.code = self.state2.code.to(device)

    monkeypatch.setattr(QuantState, "to", old_to)
    model = zoo.bnb_linear4bit()
    model.proj.weight.to("meta")  # Params4bit.to moves the shared quant_state through QuantState.to
    left = {p.path for p in torchdoctor.scan(model, device="meta").problems}
    assert "proj.weight.quant_state.code" in left and "proj.weight.quant_state.absmax" not in left
    move(model, "meta")
    assert torchdoctor.scan(model, device="meta", strict=True).ok

    fresh = zoo.bnb_linear4bit()
    move(fresh, "meta")  # move never relies on QuantState.to
    assert fresh.proj.weight.quant_state.code.is_meta


def test_bnb_half_moved_layer_cannot_go_back_and_says_why() -> None:
    model = zoo.bnb_linear4bit()
    with pytest.raises(RuntimeError):
        model.to("meta")  # leaves quant_state on meta, weight on cpu
    with pytest.raises(PlacementError) as info:
        assert_unchanged(model, move, model, "cpu")
    text = str(info.value)
    assert "proj.weight.quant_state.absmax" in text and "no data" in text and "to_empty" in text


def test_bnb_cpu_repacked_4bit_is_refused_for_another_device(bnb_cpu_branch) -> None:
    """On the AVX512-BF16 branch the first eval forward repacks in place; on the portable one the same layout is
    made with bitsandbytes' own converter (plain torch ops): the refusal is tested both ways on every CPU."""
    from bitsandbytes.functional import _convert_weight_packed_for_cpu

    model = zoo.bnb_linear4bit()
    with torch.no_grad():
        model(torch.randn(2, 64))  # eval + no_grad: repacks in place on the AVX512-BF16 branch
    w = model.proj.weight
    assert _cpu_repacked(model.proj) == bnb_cpu_branch.avx512bf16
    if not _cpu_repacked(model.proj):  # the portable branch
        w.data, w.quant_state = _convert_weight_packed_for_cpu(w.data, w.quant_state)
    # on virtual cuda:1: the refusal is the layout's, not "this machine has no cuda:1"
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False), pytest.raises(PlacementError) as info:
        assert_unchanged(model, move, model, "cuda:1")
    assert "packing_format_for_cpu" in str(info.value) and "model.cuda()" in str(info.value)
    move(model, "meta")  # meta keeps any layout


def test_bnb_unquantized_weight_is_refused_for_a_real_device() -> None:
    import bitsandbytes as bnb

    layer = nn.Sequential(OrderedDict(proj=bnb.nn.Linear4bit(8, 8)))  # never .to(device): not quantized
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False), pytest.raises(PlacementError,
                                                                                 match="not quantized yet"):
        move(layer, "cuda:1")  # on virtual cuda:1: the refusal is the layer's, not the machine's


# --- virtual cuda:1 (simulate) ---------------------------------------------------------------------------------


def _on_virtual_cuda1(model: Any, how: Any) -> list[str]:
    left: list[str] = []

    def run(copy_: Any) -> None:
        how(copy_)
        left.extend(p.path for p in torchdoctor.scan(copy_, device="cuda:1", strict=True).problems)

    report = torchdoctor.simulate(model, device="cuda:1", call=run)
    assert report.ok, report.problems
    return left


def test_virtual_cuda1_module_to_leaves_8bit_state_move_does_not() -> None:
    model = zoo.bnb_linear8bit(forward=True)
    before = _fp(model)
    assert _on_virtual_cuda1(model, lambda m: m.to("cuda:1")) == ["proj.state.CB", "proj.state.SCB"]
    assert _on_virtual_cuda1(model, lambda m: move(m, "cuda:1")) == []
    assert _fp(model) == before  # the simulation moved a copy


def test_virtual_cuda1_old_bnb_quant_state_code_left_behind_move_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    from bitsandbytes.functional import QuantState

    real_to = QuantState.to

    def old_to(self: Any, device: Any) -> None:
        code = self.code
        real_to(self, device)
        self.code = code  # < 0.45.3: code stays where it was

    monkeypatch.setattr(QuantState, "to", old_to)
    model = zoo.bnb_linear4bit()
    assert _on_virtual_cuda1(model, lambda m: m.to("cuda:1")) == ["proj.weight.quant_state.code"]
    assert _on_virtual_cuda1(model, lambda m: move(m, "cuda:1")) == []


def test_virtual_cuda1_llama_with_attributes() -> None:
    model = zoo.tiny_llama()
    model.extra = [nn.Linear(4, 4)]
    model.model.norm.cache = torch.zeros(3)
    assert set(_on_virtual_cuda1(model, lambda m: m.to("cuda:1"))) >= {"extra.0.weight", "model.norm.cache"}
    assert _on_virtual_cuda1(model, lambda m: move(m, "cuda:1", BF16)) == []


# --- refusals: nothing moved ---------------------------------------------------------------------------------


def test_accelerate_offload_hooks_are_refused_naming_the_hook() -> None:
    import accelerate

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    accelerate.cpu_offload(model, execution_device="cpu")
    with pytest.raises(PlacementError) as info:
        assert_unchanged(model, move, model, "cpu", BF16)
    text = str(info.value)
    assert "0._hf_hook" in text and "offload=True" in text and "remove_hook_from_module" in text


def test_dispatch_hook_on_another_execution_device_is_refused() -> None:
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    model = nn.Linear(4, 4)
    add_hook_to_module(model, AlignDevicesHook(execution_device="cpu"))
    with pytest.raises(PlacementError, match="execution_device=cpu"):
        assert_unchanged(model, move, model, "meta")
    move(model, dtype=BF16)  # a cast does not fight the hook
    assert model.weight.dtype == BF16


def test_meta_tensors_to_a_real_device_are_refused_with_to_empty() -> None:
    with torch.device("meta"):
        model = zoo.tiny_llama()
    assert model.model.embed_tokens.weight.is_meta
    with pytest.raises(PlacementError) as info:
        assert_unchanged(model, move, model, "cpu")
    text = str(info.value)
    assert "model.embed_tokens.weight" in text and "no data" in text and "to_empty(device='cpu')" in text
    move(model, dtype=BF16)  # a cast on meta is fine
    assert model.model.embed_tokens.weight.dtype == BF16


def test_bare_tensors_and_tuples_are_refused_with_what_to_do() -> None:
    with pytest.raises(TypeError, match=r"t = t.to\(device, dtype\)"):
        move(torch.zeros(2), dtype=BF16)
    pair = (torch.zeros(2), torch.ones(2))
    with pytest.raises(TypeError, match="immutable tuple"):
        move(pair, dtype=BF16)
    model = nn.Linear(2, 2)
    model.scales = (torch.zeros(2),)
    with pytest.raises(TypeError, match=r"scales\.0"):
        assert_unchanged(model, move, model, dtype=BF16)
    model = nn.Linear(2, 2)
    model.params = (model.weight,)  # the same Parameter in a tuple: changed in place, nothing to replace
    move(model, dtype=BF16)
    assert model.params[0] is model.weight and model.weight.dtype == BF16
    with pytest.raises(ValueError, match="device= and/or dtype="):
        move(model)
    with pytest.raises(TypeError, match="floating"):
        move(model, dtype=torch.int64)
    with pytest.raises(ValueError, match="rollback"):
        move(model, dtype=BF16, rollback="sometimes")


def test_a_device_this_build_lacks_is_refused_before_any_tensor_moves() -> None:
    model = Holder()
    before = _fp(model)
    with pytest.raises(PlacementError, match="nothing was moved: cuda:0 is not available here"):
        move(model, "cuda:0")  # CPU build: refused up front, never "Torch not compiled with CUDA enabled" half-way
    assert _fp(model) == before


def test_dicts_move() -> None:
    state = {"w": torch.randn(2, 2), "nested": [torch.ones(3), {"n": torch.arange(3)}]}
    move(state, "meta", BF16)
    assert state["w"].is_meta and state["w"].dtype == BF16 and state["nested"][0].dtype == BF16
    assert state["nested"][1]["n"].dtype == torch.int64 and state["nested"][1]["n"].is_meta


def test_wrapper_subclass_parameters_move_through_their_own_to() -> None:
    from torch.testing._internal.two_tensor import TwoTensor

    model = nn.Linear(2, 2)
    model.weight = nn.Parameter(TwoTensor(torch.randn(2, 2), torch.randn(2, 2)))
    w = model.weight
    move(model, dtype=BF16)
    assert model.weight is w and isinstance(w, TwoTensor)
    assert w.a.dtype == w.b.dtype == w.dtype == BF16
    move(model, "meta")
    assert model.weight.a.is_meta and model.weight.b.is_meta and model.weight.device.type == "meta"


# --- plan and the report ------------------------------------------------------------------------------------------


def test_plan_is_read_only_and_readable() -> None:
    pipe = zoo.tiny_sd_pipeline()
    steps = assert_unchanged(pipe, plan, pipe, dtype="bf16")
    assert all(isinstance(s, PlanStep) for s in steps)
    assert "unet.conv_in.weight  f32[4,4,3,3]@cpu -> bf16[4,4,3,3]@cpu  (parameter)" in [str(s) for s in steps]
    assert steps[0].to_dict().keys() == {"path", "role", "found", "expected", "via"}
    assert not any(s.path.startswith("scheduler.") for s in steps)
    meta = assert_unchanged(pipe, plan, pipe, device="meta")
    assert any(s.path == "scheduler.alphas_cumprod" for s in meta)
    assert any(s.via == "new parameter" for s in meta)
    move(pipe, dtype=BF16)
    assert plan(pipe, dtype=BF16) == []


def test_plan_shows_refusals() -> None:
    with torch.device("meta"):
        model = nn.Linear(2, 2)
    steps = plan(model, device="cpu")
    assert [s.via for s in steps] == ["refused: on meta: no data to move"] * 2


def test_report_fields_text_and_json() -> None:
    model = Holder()
    report = move(model, "meta", BF16)
    assert isinstance(report, MoveReport) and report.ok and report.device == torch.device("meta") and report.dtype == torch.bfloat16
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["schema"] == "torchdoctor/move/1"
    assert doc["moved"][0] == {"path": "lin.weight", "from": "f32[4,4]@cpu", "to": "bf16[4,4]@meta", "nbytes": 32}
    assert report.bytes == sum(r.nbytes for r in report.moved)
    assert report.text().startswith(f"moved {len(report.moved)} tensor(s)")
    row = report.moved[0]
    assert tuple(row) == (row.path, row.src, row.dst, row.nbytes)
    assert torchdoctor.move is move and torchdoctor.MoveReport is MoveReport


def test_cli_scan_plan_exit_codes(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "target.py"
    target.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\nhalf = torch.nn.Linear(2, 2).to(torch.bfloat16)\n"
                      "model.extra = [torch.nn.Linear(2, 2)]\n")
    assert main(["scan", f"{target}:model", "--device", "cuda:1", "--plan"]) == 1  # no GPU needed: a plan reads only
    out = capsys.readouterr().out
    assert "4 tensor(s) would move" in out and "extra.0.bias  f32[2]@cpu -> f32[2]@cuda:1  (parameter)" in out
    assert main(["scan", f"{target}:model", "--device", "cpu", "--plan"]) == 0
    assert "nothing to move" in capsys.readouterr().out
    assert main(["scan", f"{target}:model", "--dtype", "bf16", "--plan"]) == 1
    out = capsys.readouterr().out
    assert "4 tensor(s) would move" in out and "weight  f32[2,2]@cpu -> bf16[2,2]@cpu  (parameter)" in out
    assert main(["scan", f"{target}:half", "--dtype", "bf16", "--plan"]) == 0
    assert "nothing to move" in capsys.readouterr().out
    assert main(["scan", f"{target}:model", "--device", "meta", "--plan", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"][0]["via"] == "new parameter" and doc["plan"][0]["expected"] == "f32[2,2]@meta"


def test_move_touches_nothing_but_its_object() -> None:
    model = Holder()
    twin = copy.deepcopy(model)
    before = _fp(twin)
    move(model, "meta", BF16)
    assert _fp(twin) == before


def _cpu_repacked(layer: nn.Module) -> bool:
    """Whether bitsandbytes repacked this 4-bit layer into its CPU layout (on CPUs with AVX512-BF16 the first eval
    forward without grad does; elsewhere the portable layout stays)."""
    return bool(getattr(layer.weight.quant_state, "packing_format_for_cpu", False))


def test_packed_4bit_stored_in_bf16_is_never_cast(bnb_cpu_branch) -> None:
    """QLoRA with FSDP builds Linear4bit with ``quant_storage=torch.bfloat16``: the packed 4-bit bytes live in a
    bf16 tensor. Casting them scrambles the weights (Module.to does); move keeps them, scan does not ask for it.
    The forward below takes both branches on every CPU: on the AVX512-BF16 one bitsandbytes repacks the weight
    into its uint8 CPU layout; on the portable one the bf16 storage stays. Either way nothing packed is cast."""
    import bitsandbytes as bnb

    torch.manual_seed(0)
    dense = nn.Linear(64, 128)
    layer = bnb.nn.Linear4bit(64, 128, compute_dtype=torch.bfloat16, quant_type="nf4", quant_storage=torch.bfloat16)
    layer.load_state_dict(dense.state_dict())
    m = nn.Sequential(OrderedDict(proj=layer.to("cpu"))).eval()
    assert m.proj.weight.dtype == torch.bfloat16  # before any forward: the stored form, on every CPU
    x = torch.randn(2, 64)
    with torch.no_grad():
        ref = m(x).float()
    packed = m.proj.weight
    repacked = _cpu_repacked(m.proj)
    assert repacked == bnb_cpu_branch.avx512bf16
    assert type(packed).__name__ == "Params4bit" and packed.dtype == (torch.uint8 if repacked else torch.bfloat16)
    stored = packed.dtype
    assert torchdoctor.scan(m, "cpu", torch.float16).ok
    for dt in (torch.float16, torch.float32):
        report = torchdoctor.move(m, "cpu", dt)
        assert "proj.weight" not in [r.path for r in report.moved]
        assert m.proj.weight.dtype == stored and m.proj.bias.dtype == dt
        with torch.no_grad():
            assert torch.allclose(m(x).float(), ref, atol=2e-2)


@pytest.mark.parametrize("storage", [torch.uint8, torch.bfloat16])
def test_cpu_packed_4bit_layout_is_never_cast(storage: torch.dtype) -> None:
    """The CPU layout bitsandbytes makes on AVX512-BF16 CPUs, made here on any CPU with bitsandbytes' own converter
    (plain torch ops): weight uint8 [out, in/2], absmax dequantized to bf16 and transposed, ``state2`` gone. scan
    calls it intended, move casts only the bias and the plain layers, and the numbers are unchanged where this CPU
    computes with (bitsandbytes' fused kernel where it took the AVX512-BF16 branch at import, else its default
    ``gemv_4bit``, which reads the packed bytes with plain torch ops: other numbers, the same before and after)."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import _convert_weight_packed_for_cpu

    torch.manual_seed(0)
    layer = bnb.nn.Linear4bit(64, 128, compute_dtype=torch.bfloat16, quant_type="nf4", quant_storage=storage)
    layer.load_state_dict(nn.Linear(64, 128).state_dict())
    m = nn.Sequential(OrderedDict(proj=layer.to("cpu"), head=nn.Linear(128, 8))).eval()
    w = m.proj.weight
    w.data, w.quant_state = _convert_weight_packed_for_cpu(w.data, w.quant_state)
    assert _cpu_repacked(m.proj) and w.dtype == torch.uint8 and tuple(w.shape) == (128, 32)
    data, absmax = w.data.clone(), w.quant_state.absmax.clone()
    x = torch.randn(2, 64)
    with torch.no_grad():
        ref = m(x).float()
    assert torchdoctor.scan(m).ok
    report = torchdoctor.move(m, "cpu", torch.float16)
    moved = {r.path for r in report.moved}
    assert {"proj.bias", "head.weight", "head.bias"} <= moved and "proj.weight" not in moved
    assert not [p for p in moved if "quant_state" in p]
    assert torch.equal(m.proj.weight.data, data) and torch.equal(m.proj.weight.quant_state.absmax, absmax)
    assert torchdoctor.scan(m, "cpu", torch.float16).ok
    with torch.no_grad():
        assert torch.allclose(m(x.half()).float(), ref, atol=5e-2)



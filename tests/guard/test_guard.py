"""guard on the real libraries (CPU): errors that name the module and the tensor, strict / fix / warn, backward,
nesting, threads, torch.compile, and a guard that leaves nothing behind."""

from __future__ import annotations

import functools
import threading
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from support import zoo
from support.helpers import assert_unchanged
from torch import nn
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import torchdoctor
from torchdoctor import PlacementError, PlacementWarning
from torchdoctor._guard.api import Fix

bf = torch.bfloat16
MODES = ("explain", "strict", "fix", "warn")


def tensors_of(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in tensors_of(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in tensors_of(v)]
    return tensors_of(vars(out)) if hasattr(out, "__dict__") else []


def same_bits(a: Any, b: Any) -> bool:
    ta, tb = tensors_of(a), tensors_of(b)
    return len(ta) == len(tb) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(ta, tb))


def nothing_left_behind() -> None:
    mm = torch.nn.modules.module
    assert not mm._global_forward_pre_hooks and not mm._global_forward_hooks
    assert not mm._global_forward_hooks_always_called and not mm._global_backward_hooks
    assert _get_current_dispatch_mode_stack() == [] and _get_current_function_mode_stack() == []


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    nothing_left_behind()


# --- peft LoRA on the tiny UNet, one adapter's lora_B in float32 over a bf16 lora_A -----------------------


LORA = "base_model.model.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"
CODE = "model.base_model.model.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q.lora_B.default.weight"


def broken_lora_unet() -> Any:
    """peft adapters cast to bf16 (as ``autocast_adapter_dtype=False`` leaves them), then one lora_B in float32:
    the odd one among all adapters."""
    model = zoo.lora_unet(bf, via="peft")
    for name, p in model.named_parameters():
        if ".lora_" in name:
            p.data = p.data.to(bf)
    layer = model.get_submodule(LORA)
    layer.lora_B["default"].weight.data = layer.lora_B["default"].weight.data.float()
    return model


def test_lora_a_cast_alone_among_fp32_adapters_is_named_first() -> None:
    """peft's default fp32 adapters, one lora_A cast to bf16: a 1-1 tie inside the adapter that the other layers'
    adapters break; the culprit is the lora_A weight, the lora_B input where it surfaced comes second."""
    model = zoo.lora_unet(bf, via="peft")
    layer = model.get_submodule(LORA)
    layer.lora_A["default"].weight.data = layer.lora_A["default"].weight.data.to(bf)
    with pytest.raises(PlacementError) as info, torch.no_grad(), torchdoctor.guard(model):
        model(**unet_inputs())
    assert [(p.path, p.found, p.expected) for p in info.value.problems][0] == (
        f"{LORA}.lora_A.default.weight", "bfloat16", "float32")
    code = "model.base_model.model.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q.lora_A.default.weight"
    assert f"{code}.data = {code}.data.to(torch.float32)" in (info.value.fix or "")


@functools.cache
def _unet_inputs() -> dict[str, Any]:
    return dict(zoo.build("unet", bf).inputs)  # type: ignore[arg-type]


def unet_inputs() -> dict[str, Any]:
    return dict(_unet_inputs())


def test_lora_explain_names_module_dtypes_and_fix() -> None:
    model = broken_lora_unet()
    with pytest.raises(PlacementError) as info, torch.no_grad(), torchdoctor.guard(model):
        model(**unet_inputs())
    e = info.value
    assert isinstance(e.__cause__, RuntimeError) and not isinstance(e.__cause__, PlacementError)
    assert e.module_path == f"{LORA}.lora_B.default" and e.module_type == "Linear"
    assert [(p.path, p.found, p.expected) for p in e.problems] == [
        (f"{LORA}.lora_B.default.weight", "float32", "bfloat16")]
    text = str(e)
    assert text.startswith(f"dtype mismatch in `{LORA}.lora_B.default` (Linear): float32 where bfloat16 was expected")
    assert f"  culprit {LORA}.lora_B.default.weight: f32[4,4]@cpu  (expected bfloat16)" in text
    assert "original error: RuntimeError: expected m1 and m2 to have the same dtype" in text
    code = ("model.base_model.model.down_blocks[0].attentions[0].transformer_blocks[0].attn1.to_q.lora_B.default"
            ".weight")
    assert e.fix == f"{code}.data = {code}.data.to(torch.bfloat16)"
    assert text.endswith(f"Fix:\n    {e.fix}")


def test_lora_fix_mode_matches_the_manually_fixed_model_bit_for_bit() -> None:
    model = broken_lora_unet()
    lora_b = model.get_submodule(f"{LORA}.lora_B.default").weight
    with torch.no_grad(), torchdoctor.guard(model, mode="fix") as g:
        fixed_on_the_fly = model(**unet_inputs()).sample
        again = model(**unet_inputs()).sample
    assert g.fixes == [Fix(f"{LORA}.lora_B.default.weight", "float32", "bfloat16", "dtype", "aten.mm.default",
                           f"{LORA}.lora_B.default")]
    assert model.get_submodule(f"{LORA}.lora_B.default").weight is lora_b and lora_b.dtype == torch.float32
    lora_b.data = lora_b.data.to(bf)  # the manual fix
    with torch.no_grad():
        manual = model(**unet_inputs()).sample
    assert torch.equal(fixed_on_the_fly, manual) and torch.equal(again, manual)


def test_lora_warn_mode_warns_once_across_three_forwards() -> None:
    model = broken_lora_unet()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad(), torchdoctor.guard(model, mode="warn") as g:
        warnings.simplefilter("always")
        for _ in range(3):
            model(**unet_inputs())
    ours = [w for w in caught if issubclass(w.category, PlacementWarning)]
    assert len(ours) == 1
    assert str(ours[0].message) == (
        f"torchdoctor.guard: dtype problem in `{LORA}.lora_B.default` at aten.mm.default: "
        f"{LORA}.lora_B.default.weight is float32, expected bfloat16; aligned for this call; fix (proven): "
        f"{CODE}.data = {CODE}.data.to(torch.bfloat16)")
    assert len(g.problems) == 1 and len(g.fixes) == 1
    assert g.fixes[0].proven and g.fixes[0].code == f"{CODE}.data = {CODE}.data.to(torch.bfloat16)"


def test_warn_mode_warns_once_per_distinct_problem() -> None:
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    net[0].bias.data = net[0].bias.data.double()
    net[2].weight.data = net[2].weight.data.double()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad(), torchdoctor.guard(net, mode="warn") as g:
        warnings.simplefilter("always")
        outs = [net(torch.ones(1, 4)) for _ in range(3)]
    ours = sorted(str(w.message) for w in caught if issubclass(w.category, PlacementWarning))
    assert ours == [
        "torchdoctor.guard: dtype problem in `0` at aten.addmm.default: 0.bias is float64, expected float32; "
        "aligned for this call; fix (proven): model[0].bias.data = model[0].bias.data.to(torch.float32)",
        "torchdoctor.guard: dtype problem in `2` at aten.addmm.default: 2.weight is float64, expected float32; "
        "aligned for this call; fix (proven): model[2].weight.data = model[2].weight.data.to(torch.float32)"]
    assert [f.path for f in g.fixes] == ["0.bias", "2.weight"] and all(o.dtype == torch.float32 for o in outs)


# --- conv bias, meta weights -------------------------------------------------------------------------------


def test_fp32_conv_bias_in_bf16_unet_names_conv_in() -> None:
    unet = zoo.tiny_unet(bf)
    unet.conv_in.bias.data = unet.conv_in.bias.data.float()
    with pytest.raises(PlacementError) as info, torch.no_grad(), torchdoctor.guard(unet):
        unet(**unet_inputs())
    e = info.value
    assert "Input type (c10::BFloat16) and bias type (float) should be the same" in str(e.__cause__)
    assert e.module_path == "conv_in" and e.module_type == "Conv2d"
    assert [p.path for p in e.problems] == ["conv_in.bias"]
    assert str(e).startswith("dtype mismatch in `conv_in` (Conv2d): float32 where bfloat16 was expected")
    assert e.fix == "model.conv_in.bias.data = model.conv_in.bias.data.to(torch.bfloat16)"


def test_fp32_conv_bias_strict_fix_and_warn() -> None:
    unet = zoo.tiny_unet(bf)
    bias = unet.conv_in.bias
    bias.data = bias.data.float()
    with pytest.raises(PlacementError) as info, torch.no_grad(), torchdoctor.guard(unet, mode="strict"):
        unet(**unet_inputs())
    assert str(info.value).startswith("dtype problem in `conv_in` (Conv2d) at aten.convolution.default: arg 2 (bias) "
                                      "is float32, expected bfloat16 like arg 0 (input)")
    with torch.no_grad(), torchdoctor.guard(unet, mode="fix") as g:
        on_the_fly = unet(**unet_inputs()).sample
    assert g.fixes == [Fix("conv_in.bias", "float32", "bfloat16", "dtype", "aten.convolution.default", "conv_in")]
    with pytest.warns(PlacementWarning, match="conv_in.bias is float32, expected bfloat16") as rec, torch.no_grad(), \
            torchdoctor.guard(unet, mode="warn"):
        unet(**unet_inputs())
        unet(**unet_inputs())
    assert len([w for w in rec if issubclass(w.category, PlacementWarning)]) == 1
    assert unet.conv_in.bias is bias and bias.dtype == torch.float32
    bias.data = bias.data.to(bf)
    with torch.no_grad():
        assert torch.equal(unet(**unet_inputs()).sample, on_the_fly)


def test_paths_are_relative_to_a_pipeline() -> None:
    b = zoo.build("sd_pipeline", bf)
    pipe = b.obj
    pipe.unet.conv_in.bias.data = pipe.unet.conv_in.bias.data.float()
    with pytest.raises(PlacementError) as info, torchdoctor.guard(pipe):
        b.run()
    assert info.value.module_path == "unet.conv_in"
    assert info.value.fix == "model.unet.conv_in.bias.data = model.unet.conv_in.bias.data.to(torch.bfloat16)"


def test_meta_weight_is_silent_garbage_but_strict_names_it() -> None:
    b = zoo.build("llama")
    model = b.obj
    with torch.no_grad():
        good = model(**b.inputs).logits
    mlp = model.model.layers[0].mlp
    mlp.down_proj.weight = nn.Parameter(torch.empty_like(mlp.down_proj.weight, device="meta"))
    with torch.no_grad():
        silent = model(**b.inputs).logits  # no error at all on CPU
    assert not torch.equal(good, silent)
    with pytest.raises(PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode="strict"):
        model(**b.inputs)
    e = info.value
    assert e.module_path == "model.layers.0.mlp.down_proj" and e.op == "aten.mm.default"
    assert [(p.kind, p.path, p.found, p.expected) for p in e.problems] == [
        ("meta", "model.layers.0.mlp.down_proj.weight", "meta", "cpu")]
    assert str(e).startswith("meta problem in `model.layers.0.mlp.down_proj` (Linear) at aten.mm.default: "
                             "arg 1 (mat2) is on meta (no data) and meets real tensors on cpu")
    assert "culprit model.layers.0.mlp.down_proj.weight (a view) = arg 1 (mat2): f32[128,64]@meta" in str(e)
    with pytest.raises(PlacementError, match="meta problem"), torch.no_grad(), torchdoctor.guard(model, mode="fix"):
        model(**b.inputs)  # no data to align: fix mode refuses
    with pytest.warns(PlacementWarning, match="meta problem"), torch.no_grad(), torchdoctor.guard(model, mode="warn"):
        model(**b.inputs)


# --- backward, nesting, in-place, threads -----------------------------------------------------------------


class _SavedWeight(torch.autograd.Function):
    """Forward casts the weight, backward forgets to: the mismatch surfaces only in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(w)
        return x @ w.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (w,) = ctx.saved_tensors
        return grad @ w.T, None


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SavedWeight.apply(x, self.w)


def backward_net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 64), nn.Linear(64, 4), Mixer(), nn.ReLU())


def test_mismatch_only_in_backward() -> None:
    net = backward_net()
    x = torch.randn(2, 4, requires_grad=True)
    with torchdoctor.guard(net):
        out = net(x)  # the forward is fine
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        net(x).sum().backward()
    e = info.value
    assert e.module_path == "2" and e.module_type == "Mixer"
    assert str(e).startswith("dtype mismatch in `2` (Mixer) during backward: float64 where float32 was expected")
    assert e.fix == "model[2].w.data = model[2].w.data.to(torch.float32)"
    with pytest.raises(PlacementError, match=r"dtype problem in `2` \(Mixer\) at aten.mm.default"), \
            torchdoctor.guard(net, mode="strict"):
        net(x).sum().backward()
    assert not out._backward_hooks  # the guard's grad hooks were removed on exit
    with pytest.raises(PlacementError) as info, torchdoctor.guard():  # relative to the outermost module entered
        net(x).sum().backward()
    assert info.value.module_path == "2" and info.value.fix == "model[2].w.data = model[2].w.data.to(torch.float32)"


class Trainer(nn.Module):
    """Calls backward from inside a module method, as a LightningModule does."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def step(self, x: torch.Tensor) -> None:
        self.net(x).sum().backward()


def test_backward_called_from_a_module_method_blames_the_backward_module() -> None:
    trainer = Trainer(backward_net())
    with pytest.raises(PlacementError) as info, torchdoctor.guard(trainer):
        trainer.step(torch.randn(2, 4, requires_grad=True))
    assert info.value.module_path == "net.2" and "during backward" in str(info.value)


def test_nested_guards_explain_once() -> None:
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    net[1].bias.data = net[1].bias.data.double()
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net), torchdoctor.guard(net[1]):
        net(torch.ones(1, 4))
    assert info.value.module_path == "" and [p.path for p in info.value.problems] == ["bias"]  # the inner guard's
    assert type(info.value.__cause__) is RuntimeError
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net), torchdoctor.guard(net, mode="strict"):
        net(torch.ones(1, 4))
    assert info.value.op == "aten.addmm.default" and info.value.__cause__ is None
    with torchdoctor.guard(net, mode="fix") as outer, torchdoctor.guard(net, mode="explain"):
        net(torch.ones(1, 4))
    assert [f.path for f in outer.fixes] == ["1.bias"]


class InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        y += 1  # in place on a module output: global full backward hooks would break this
        return self.act(y)


@pytest.mark.parametrize("mode", MODES)
def test_inplace_op_on_module_output(mode: str) -> None:
    net = InPlace()
    x = torch.randn(2, 4, requires_grad=True)
    net(x).sum().backward()
    plain = (x.grad.clone(), net.lin.weight.grad.clone())  # type: ignore[union-attr]
    x.grad, net.lin.weight.grad = None, None
    with torchdoctor.guard(net, mode=mode):
        net(x).sum().backward()
    assert torch.equal(x.grad, plain[0]) and torch.equal(net.lin.weight.grad, plain[1])  # type: ignore[arg-type]


def test_a_long_loop_inside_one_guard_keeps_no_graph_alive() -> None:
    import gc
    import weakref

    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    refs = []
    with torchdoctor.guard(net):
        for i in range(10):
            x = torch.randn(2, 8, requires_grad=True)
            y = torch.relu(net(x))
            if i % 2:
                y.sum().backward()
            refs.append(weakref.ref(x))
            del x, y
        gc.collect()
        assert sum(r() is not None for r in refs) == 0


def test_guards_in_two_threads() -> None:
    results: dict[int, Any] = {}
    shared = torchdoctor.guard(mode="fix")
    barrier = threading.Barrier(2)

    errors: list[str] = []

    def work(i: int) -> None:
        net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
        getattr(net, str(i)).bias.data = getattr(net, str(i)).bias.data.double()
        barrier.wait()
        try:
            try:
                for _ in range(20):
                    with torch.no_grad(), torchdoctor.guard(net):
                        net(torch.ones(1, 4))
            except PlacementError as e:
                results[i] = (e.module_path, [p.path for p in e.problems])
            for _ in range(20):
                with torch.no_grad(), shared:
                    net(torch.ones(1, 4))
        except BaseException:  # a thread's error is the test's failure, with its traceback (not a missing entry)
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=work, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, "\n".join(errors)
    assert results == {1: ("1", ["1.bias"]), 2: ("2", ["2.bias"])}
    assert sorted(f.path for f in shared.fixes) == ["1.bias", "2.bias"]


# --- strict on the zoo, and a guard that changes nothing ------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, bf], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", zoo.NAMES)
def test_strict_is_clean_on_the_zoo(name: str, dtype: torch.dtype) -> None:
    b = zoo.build(name, dtype)
    with torch.no_grad():
        plain = b.run()
    with torch.no_grad(), torchdoctor.guard(b.obj, mode="strict") as g:
        checked = b.run()
    assert g.problems == [] and same_bits(plain, checked)


@pytest.mark.parametrize("mode", MODES)
def test_guard_changes_nothing_on_a_model_that_runs(mode: str) -> None:
    b = zoo.build("llama", bf)
    with torch.no_grad():
        plain = b.run()
    with torch.no_grad():
        guarded = assert_unchanged(b.obj, lambda: _run_guarded(b, mode))
    assert same_bits(plain, guarded)
    out = b.obj(**b.inputs).logits.sum()  # with grad: backward through a guarded forward is unchanged too
    out.backward()
    grads = [p.grad.clone() for p in b.obj.parameters()]  # type: ignore[union-attr]
    b.obj.zero_grad(set_to_none=True)
    with torchdoctor.guard(b.obj, mode=mode):
        b.obj(**b.inputs).logits.sum().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, b.obj.parameters()))


def _run_guarded(b: zoo.Built, mode: str) -> Any:
    with torchdoctor.guard(b.obj, mode=mode):
        return b.run()


@pytest.mark.parametrize("mode", MODES)
def test_nothing_left_behind_after_an_exception(mode: str) -> None:
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    class Boom(Exception):
        pass

    with pytest.raises(Boom), torchdoctor.guard(net, mode=mode):
        net(torch.ones(1, 4))
        assert torch.nn.modules.module._global_forward_pre_hooks  # live inside
        raise Boom
    nothing_left_behind()


# --- errors that are not RuntimeErrors, errors that are not placement errors --------------------------------


class ToCuda(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.cuda()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a build without CUDA")
def test_other_exception_classes_keep_their_class_and_get_a_note() -> None:
    net = nn.Sequential(nn.Linear(4, 4), ToCuda())
    with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled") as info, torchdoctor.guard(net):
        net(torch.ones(1, 4))
    notes = "\n".join(getattr(info.value, "__notes__", [])) or str(info.value.args)
    assert "device problem in `1` (ToCuda)" in notes


def test_unrelated_errors_pass_through_untouched() -> None:
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("not about placement")

    with pytest.raises(ValueError, match="not about placement") as info, torchdoctor.guard(Bad()) as g:
        g.model(torch.ones(1))
    assert info.value.__cause__ is None and not getattr(info.value, "__notes__", None)


def test_a_device_mismatch_message_names_the_cpu_bias() -> None:
    class FakeCudaConv(nn.Conv2d):
        """Raises what a real GPU raises when the bias stayed on the CPU (devices are virtual here)."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("Input type (CUDABFloat16Type) and bias type (CPUBFloat16Type) should be the same")

    net = nn.Sequential(nn.Conv2d(2, 2, 1), FakeCudaConv(2, 2, 1)).to(bf)
    for p in [*net[0].parameters(), net[1].weight]:
        p._td_device = torch.device("cuda:0")  # type: ignore[attr-defined]
    x = torch.ones(1, 2, 2, 2, dtype=bf)
    x._td_device = torch.device("cuda:0")  # type: ignore[attr-defined]
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        net[1](x)
    e = info.value
    assert [(p.path, p.found, p.expected) for p in e.problems] == [("1.bias", "cpu", "cuda:0")]
    assert str(e).startswith("device mismatch in `1` (FakeCudaConv): cpu where cuda:0 was expected")
    assert e.fix == "model[1].bias.data = model[1].bias.data.to('cuda:0')"


class KwargBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 4))

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight, bias)


def test_module_inputs_are_named_input_i_and_kwarg_name() -> None:
    net = nn.Sequential(nn.Linear(4, 64), nn.Linear(64, 4))
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        net(torch.ones(1, 4, dtype=torch.float64))
    e = info.value
    # the module's input 0 is the caller's argument: named as the caller passed it (Sequential.forward(input))
    assert e.module_path == "0" and [(p.path, p.role) for p in e.problems] == [("input", "input")]
    assert e.fix == "# pass input as tensor.to(torch.float32)"
    holder = nn.ModuleDict({"proj": KwargBias(), "big": nn.Linear(64, 64)})
    with pytest.raises(PlacementError) as info, torchdoctor.guard(holder):
        holder["proj"](torch.ones(2, 4), bias=torch.zeros(3, dtype=torch.float64))
    assert info.value.module_path == "proj" and [p.path for p in info.value.problems] == ["kwarg bias"]
    assert "  kwarg bias: f64[3]@cpu  (expected float32)" in str(info.value)


def test_errors_outside_any_module_are_explained_at_the_users_line() -> None:
    net = nn.Linear(4, 4)
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        net(torch.ones(1, 4)) @ torch.ones(4, 4, dtype=torch.float64)
    e = info.value
    assert type(e.__cause__) is RuntimeError and "same dtype" in str(e.__cause__)
    assert str(e).startswith("dtype mismatch outside the guarded model, at test_guard.py:")
    assert "line: net(torch.ones(1, 4)) @ torch.ones(4, 4, dtype=torch.float64)" in str(e)
    with pytest.raises(RuntimeError) as plain, torchdoctor.guard(net):  # not a placement error: left alone
        net(torch.ones(1, 4)) @ torch.ones(3, 3)
    assert type(plain.value) is RuntimeError


# --- decorator forms, compile, arguments ---------------------------------------------------------------------


def broken_net() -> nn.Sequential:
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    net[1].bias.data = net[1].bias.data.double()
    return net


def test_decorator_forms() -> None:
    net = broken_net()

    @torchdoctor.guard
    def bare(x: torch.Tensor) -> torch.Tensor:
        return net(x)

    with pytest.raises(PlacementError) as info:
        bare(torch.ones(1, 4))
    assert info.value.module_path == "1"  # relative to the outermost module entered
    assert bare.__name__ == "bare"

    @torchdoctor.guard(mode="fix")
    def fixed(x: torch.Tensor) -> torch.Tensor:
        return net(x)

    fixed(torch.ones(1, 4))
    assert [f.path for f in fixed.guard.fixes] == ["1.bias"]  # type: ignore[attr-defined]

    @torchdoctor.guard(net[1], mode="strict")
    def inner(x: torch.Tensor) -> torch.Tensor:
        return net(x)

    with pytest.raises(PlacementError) as info:
        inner(torch.ones(1, 4))
    assert info.value.module_path == "" and info.value.problems[0].path == "bias"


def test_bad_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="guard mode must be one of explain, strict, fix, warn, not 'fast'"):
        torchdoctor.guard(mode="fast")


def test_torch_compile_warns_once_that_compiled_code_is_not_checked() -> None:
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    compiled = torch.compile(net, backend="eager")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        with torchdoctor.guard(compiled, mode="strict"):
            compiled(torch.ones(1, 4))
            compiled(torch.ones(1, 4))
    ours = [str(w.message) for w in caught if issubclass(w.category, PlacementWarning)]
    assert ours == ["torchdoctor.guard(mode='strict') does not check inside torch.compile'd regions; only code "
                    "that runs eagerly is checked"]


# --- real-world error texts: the explanation path on the messages real GPUs print ---------------------------
# On a CPU build a CUDA error cannot happen, so a module raises the real text from its forward and the tensors
# carry the simulator's virtual device (``_td_device``): this tests the message parsing and the culprit search
# only. The errors a CPU does raise are tested on real ops further down.


def on(device: str, *tensors: torch.Tensor) -> None:
    for t in tensors:
        t._td_device = torch.device(device)  # type: ignore[attr-defined]


class Raises(nn.Linear):
    """A Linear whose forward raises the message a real GPU would print for its placement."""

    message = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(self.message)


def mostly_on(device: str, dtype: torch.dtype = torch.float32) -> tuple[nn.Sequential, torch.Tensor]:
    """A model whose tensors are all on ``device`` (virtually), ``0`` raising, and an input there too."""
    net = nn.Sequential(Raises(16, 16), nn.Linear(16, 64), nn.Linear(64, 16)).to(dtype)
    on(device, *net.parameters())
    x = torch.ones(1, 16, dtype=dtype)
    on(device, x)
    return net, x


DEVICE_TEXTS = [
    "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
    "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! (when checking "
    "argument for argument mat1 in method wrapper_CUDA_addmm)",
    "Expected all tensors to be on the same device, but got mat1 is on cpu, different from other tensors on cuda:0 "
    "(when checking argument in method wrapper_CUDA_addmm)",
    "Input type (CUDABFloat16Type) and bias type (CPUBFloat16Type) should be the same",
    "Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same",
    "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same or input should be "
    "a MKLDNN tensor and weight is a dense tensor",
    "Tensor for argument #2 'mat1' is on CPU, but expected it to be on GPU (while checking arguments for addmm)",
    "Expected object of device type cuda but got device type cpu for argument #1 'self' in call to _th_addmm",
    "expected device cuda:0 but got device cpu",
]


@pytest.mark.parametrize("text", DEVICE_TEXTS)
def test_gpu_device_texts_name_the_one_tensor_on_the_odd_device(text: str) -> None:
    net, x = mostly_on("cuda:0")
    net[0].message = text
    on("cpu", net[0].bias)  # the one tensor left behind
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        net(x)
    e = info.value
    assert type(e.__cause__) is RuntimeError and str(e.__cause__) == text
    assert e.module_path == "0" and e.module_type == "Raises"
    assert [(p.kind, p.path, p.role, p.found, p.expected) for p in e.problems] == [
        ("device", "0.bias", "parameter", "cpu", "cuda:0")]
    assert str(e).startswith("device mismatch in `0` (Raises): cpu where cuda:0 was expected")
    assert "  culprit 0.bias: f32[16]@cpu  (expected cuda:0)" in str(e)
    assert e.fix == "model[0].bias.data = model[0].bias.data.to('cuda:0')"


def test_a_bias_on_the_wrong_device_and_dtype_gets_one_fix_for_both() -> None:
    net, x = mostly_on("cuda:0", bf)
    net[0].message = "Input type (CUDABFloat16Type) and bias type (CPUFloatType) should be the same"
    net[0].bias.data = net[0].bias.data.float()
    on("cpu", net[0].bias)
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        net(x)
    assert [(p.path, p.found, p.expected) for p in info.value.problems] == [("0.bias", "cpu", "cuda:0")]
    assert info.value.fix == "model[0].bias.data = model[0].bias.data.to('cuda:0', torch.bfloat16)"


def test_an_input_left_on_the_cpu_is_the_culprit_when_the_model_is_on_the_gpu() -> None:
    net, x = mostly_on("cuda:0")
    net[0].message = DEVICE_TEXTS[0]
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        net(torch.ones(1, 16))
    assert [(p.path, p.role, p.found, p.expected) for p in info.value.problems] == [
        ("input", "input", "cpu", "cuda:0")]
    assert info.value.fix == "# pass input as tensor.to('cuda:0')"
    assert "culprit input (an argument of the Sequential call): f32[1,16]@cpu" in str(info.value)


@pytest.mark.parametrize(("device", "odd", "text"), [
    ("cuda:0", "cuda:1", "Expected all tensors to be on the same device, but found at least two devices, cuda:1 and "
                         "cuda:0!"),
    ("xpu:0", "cpu", "Expected all tensors to be on the same device, but found at least two devices, xpu:0 and cpu!"),
    ("mps:0", "cpu", "Input type (MPSFloatType) and weight type (torch.FloatTensor) should be the same"),
])
def test_other_accelerators_and_a_second_gpu(device: str, odd: str, text: str) -> None:
    net, x = mostly_on(device)
    net[0].message = text
    on(odd, net[0].weight)
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        net(x)
    assert [(p.path, p.found, p.expected) for p in info.value.problems] == [("0.weight", odd, device)]


def test_old_style_dtype_text_names_the_weight() -> None:
    net, x = mostly_on("cuda:0", torch.float16)
    net[0].message = "Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same"
    net[0].weight.data = net[0].weight.data.float()
    on("cuda:0", net[0].weight)
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        net(x)
    assert [(p.kind, p.path, p.found, p.expected) for p in info.value.problems] == [
        ("dtype", "0.weight", "float32", "float16")]


class Lookup(nn.Module):
    """Indexes a plain tensor attribute, which ``Module.to`` never moves (a common real-world leftover)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.table = torch.arange(32.0)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("indices should be either on cpu or on the same device as the indexed tensor (cpu)")


def test_cpu_gpu_indexing_text_names_the_attribute_left_on_the_cpu() -> None:
    net = nn.Sequential(Lookup(), nn.Linear(16, 64))
    on("cuda:0", *net.parameters())
    idx = torch.arange(4)
    on("cuda:0", idx)
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        net(idx)
    assert [(p.path, p.role, p.found, p.expected) for p in info.value.problems] == [
        ("0.table", "attribute", "cpu", "cuda:0")]


# The placement errors a CPU build raises for real: meta tensors met by real ops.


def test_meta_norm_weight_raises_on_cpu_and_explain_names_it() -> None:
    b = zoo.build("llama")
    norm = b.obj.model.layers[0].input_layernorm
    norm.weight = nn.Parameter(torch.empty_like(norm.weight, device="meta"))
    with pytest.raises(PlacementError) as info, torch.no_grad(), torchdoctor.guard(b.obj):
        b.run()
    e = info.value
    assert str(e.__cause__) == "Tensor on device cpu is not on the expected device meta!"
    assert e.module_path == "model.layers.0.input_layernorm" and e.module_type == "LlamaRMSNorm"
    assert [(p.kind, p.path, p.found) for p in e.problems] == [
        ("meta", "model.layers.0.input_layernorm.weight", "meta")]
    assert str(e).startswith("meta mismatch in `model.layers.0.input_layernorm` (LlamaRMSNorm): meta where cpu was "
                             "expected")
    assert e.fix == ("# model.model.layers[0].input_layernorm.weight is on meta (no data): load its weights, e.g.\n"
                     "model.load_state_dict(state_dict, strict=False, assign=True)")


def test_cannot_copy_out_of_meta_is_a_placement_error_naming_the_buffer() -> None:
    b = zoo.build("llama")
    rotary = b.obj.model.rotary_emb
    rotary.inv_freq = rotary.inv_freq.to("meta")
    with pytest.raises(PlacementError) as info, torch.no_grad(), torchdoctor.guard(b.obj):
        b.run()
    e = info.value
    assert type(e.__cause__) is NotImplementedError and "Cannot copy out of meta tensor" in str(e.__cause__)
    assert e.module_path == "model.rotary_emb"
    assert [(p.kind, p.path, p.role) for p in e.problems] == [("meta", "model.rotary_emb.inv_freq", "buffer")]


def test_explain_does_no_per_op_work() -> None:
    net = nn.Sequential(nn.Linear(4, 4))
    seen: list[Any] = []
    net.register_forward_pre_hook(lambda m, a: seen.append(list(_get_current_dispatch_mode_stack())))
    with torchdoctor.guard(net):
        net(torch.ones(1, 4))
    assert seen == [[]]  # no dispatch mode (or anything else per op) on the happy path
    with torchdoctor.guard(net, mode="strict"):  # the module-boundary gate: a clean module runs with no mode
        net(torch.ones(1, 4))
    assert seen[1] == []
    with torchdoctor.guard(net, mode="strict", every_op=True):
        net(torch.ones(1, 4))
    assert len(seen[2]) == 1
    with torchdoctor.guard(net, mode="fix"):  # fix aligns per op: its mode is on every op
        net(torch.ones(1, 4))
    assert len(seen[3]) == 1


class ThreeLayers(nn.Module):
    """Six parameters used through ``F.linear`` in one forward: one module, many culprits."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.ParameterList([nn.Parameter(torch.randn(8, 8)) for _ in range(3)])
        self.b = nn.ParameterList([nn.Parameter(torch.zeros(8)) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w, b in zip(self.w, self.b):
            x = torch.nn.functional.linear(x, w, b)
        return x


def test_many_culprits_in_one_module_get_one_move_call() -> None:
    net = nn.Sequential(nn.Linear(8, 64), nn.Linear(64, 8), ThreeLayers())
    net[2].double()
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        net(torch.ones(1, 8))
    e = info.value
    assert e.module_path == "2" and len(e.problems) == 6
    assert {(p.found, p.expected) for p in e.problems} == {("float64", "float32")}
    # the component odd as a whole is the one call (issue 41 point 5), proven by the whole forward again
    assert e.fix == "model[2].to(torch.float32)" and e.proof.startswith("fix proven"), str(e)

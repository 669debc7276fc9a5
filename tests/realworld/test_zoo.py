"""The test zoo builds and runs every entry, and the read-only fingerprint notices every kind of change."""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict

import pytest
import torch
from torch import nn

from support import helpers
from support import zoo
from support.helpers import assert_unchanged, fingerprint, fingerprint_path

DTYPES = [torch.float32, torch.bfloat16]
HANG_GUARD_S = 120.0


def _floating(obj: object) -> list[tuple[str, torch.Tensor]]:
    """Parameters and buffers of a model, or of each module component of a pipeline (prefixed by its name)."""
    components = getattr(obj, "components", None)
    roots = [(f"{n}.", m) for n, m in components.items() if isinstance(m, nn.Module)] if components else [("", obj)]
    out = []
    for prefix, module in roots:
        for name, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
            if t.is_floating_point():
                out.append((prefix + name, t))
    return out


def _modules(obj: object) -> list[nn.Module]:
    components = getattr(obj, "components", None)
    return [m for m in components.values() if isinstance(m, nn.Module)] if components else [obj]  # type: ignore[list-item]


# --- the zoo ------------------------------------------------------------------------------------------------------

REQUIRED = {"llama", "mistral", "qwen2", "gemma", "phi", "gpt_neox", "opt", "falcon", "mixtral", "t5", "bart",
            "whisper", "clip_text", "vit", "bert", "gpt2", "unet", "flux", "vae", "sd_pipeline", "llama_lora",
            "unet_lora"}


def test_names_cover_the_required_families():
    assert len(zoo.NAMES) >= 18
    assert REQUIRED <= set(zoo.NAMES)
    assert len(set(zoo.NAMES)) == len(zoo.NAMES)


# Tensors that are fp32 on purpose in a bf16 build, as the real loaders leave them.
INTENTIONAL_FP32 = {
    "dots1": {"model.layers.1.mlp.gate.e_score_correction_bias"},  # _keep_in_fp32_modules_strict
    "llama_pretrained": {"model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"},  # not in the checkpoint
    "wan": {"scale_shift_table", "blocks.0.scale_shift_table", "blocks.0.norm2.weight", "blocks.0.norm2.bias",
            "condition_embedder.time_embedder.linear_1.weight", "condition_embedder.time_embedder.linear_1.bias",
            "condition_embedder.time_embedder.linear_2.weight", "condition_embedder.time_embedder.linear_2.bias",
            "rope.freqs_cos", "rope.freqs_sin"},  # diffusers _keep_in_fp32_modules
}


def _kept_strict(obj: object, tensors: list[tuple[str, torch.Tensor]]) -> set[str]:
    """Names a transformers class keeps fp32 at load (``_keep_in_fp32_modules_strict``): the list grows between
    releases (transformers 5.24 added dots1's router ``gate.weight``)."""
    keep = getattr(type(obj), "_keep_in_fp32_modules_strict", None) or ()
    return {n for n, _ in tensors for k in keep if n.endswith("." + k) or f".{k}." in f".{n}."}


ADAPTERS_FP32 = {"llama_lora", "unet_lora_peft"}  # peft autocast_adapter_dtype=True


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", zoo.NAMES)
def test_entry_builds_and_forwards(name, dtype):
    start = time.perf_counter()
    built = zoo.build(name, dtype=dtype)
    assert built.name == name and built.dtype == dtype and built.kind in zoo.KINDS
    assert all(not m.training for m in _modules(built.obj))

    tensors = _floating(built.obj)
    assert tensors and all(t.device.type == "cpu" for _, t in tensors)
    off = {n for n, t in tensors if t.dtype != dtype}
    if dtype == torch.float32:
        assert off == set()
    else:
        expected = set(INTENTIONAL_FP32.get(name, ())) | _kept_strict(built.obj, tensors)
        if name in ADAPTERS_FP32:
            expected |= {n for n, _ in tensors if ".lora_" in n}
        assert off == expected
        assert all(t.dtype == torch.float32 for n, t in tensors if n in off)
    inputs = built.inputs.values() if isinstance(built.inputs, dict) else built.inputs
    for value in inputs:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            assert value.dtype == dtype and value.device.type == "cpu"

    with torch.no_grad():
        out = built.run()
    first = out[0] if isinstance(out, tuple) else next(iter(out.values()))
    assert isinstance(first, torch.Tensor) and first.dtype == dtype
    assert torch.isfinite(first.float()).all()
    assert time.perf_counter() - start < HANG_GUARD_S


def test_builds_are_fresh_deterministic_and_leave_the_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a, b, c = zoo.build("llama"), zoo.build("llama"), zoo.build("llama", seed=1)
    assert torch.equal(torch.rand(3), expected_next)
    assert a.obj is not b.obj and a.inputs["input_ids"] is not b.inputs["input_ids"]
    sa, sb, sc = a.obj.state_dict(), b.obj.state_dict(), c.obj.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert torch.equal(a.inputs["input_ids"], b.inputs["input_ids"])
    with torch.no_grad():
        assert torch.equal(a.run().logits, b.run().logits)


def test_builds_restore_logging():
    before = logging.root.manager.disable
    zoo.build("unet")
    assert logging.root.manager.disable == before


def test_unknown_entry_and_duplicate_registration_are_refused():
    with pytest.raises(KeyError, match="no zoo entry 'nope'; known: llama"):
        zoo.build("nope")
    with pytest.raises(ValueError, match="registered twice"):
        zoo._entry("llama", "transformers")(lambda dtype, seed: (None, {}))


def test_built_target_and_call_with_other_inputs():
    built = zoo.build("bert")
    target = built.target()
    assert target.obj is built.obj and target.args == () and set(target.kwargs) == {"input_ids", "attention_mask"}
    other = {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3, dtype=torch.long)}
    with torch.no_grad():
        assert built.call(built.obj, other).last_hidden_state.shape == (1, 3, 32)


def test_tiny_llama_takes_config_overrides():
    model = zoo.tiny_llama(torch.bfloat16, num_hidden_layers=1, hidden_size=32, num_attention_heads=2)
    assert len(model.model.layers) == 1 and model.lm_head.weight.shape == (128, 32)
    assert model.lm_head.weight.dtype == torch.bfloat16


@pytest.mark.parametrize(("name", "dtype"), [("t5", torch.float16), ("dots1", torch.bfloat16),
                                             ("wan", torch.bfloat16), ("llama_pretrained", torch.bfloat16)])
def test_low_precision_builds_match_from_pretrained(name, dtype):
    """The zoo's keep-in-fp32 handling gives exactly the tensors ``from_pretrained(dir, dtype)`` gives."""
    model = zoo.build(name, dtype).obj
    with zoo._quiet():
        loaded = zoo._round_trip(model, dtype)
    ours, theirs = dict(zoo._named_tensors(model)), dict(zoo._named_tensors(loaded))
    assert ours.keys() == theirs.keys()
    # Loading leaves non-persistent transformers buffers (rotary inv_freq) as built, where .to() casts them:
    # compare what the checkpoint holds (llama_pretrained was loaded, so there everything is compared).
    compared = ours.keys() if name == "llama_pretrained" else loaded.state_dict().keys()
    for k in compared:
        assert ours[k].dtype == theirs[k].dtype, k
        assert torch.equal(ours[k], theirs[k]), k
    if name == "t5":
        assert model.encoder.block[0].layer[1].DenseReluDense.wo.weight.dtype == torch.float32
        assert model.shared.weight.dtype == torch.float16


def test_t5_keeps_wo_fp32_only_for_fp16():
    assert type(zoo.build("t5").obj)._keep_in_fp32_modules == ["wo"]
    bf16 = zoo.build("t5", torch.bfloat16).obj
    assert bf16.encoder.block[0].layer[1].DenseReluDense.wo.weight.dtype == torch.bfloat16


def test_clip_tokenizer_in_memory_and_from_files(tmp_path):
    memory = zoo.tiny_clip_tokenizer()
    disk = zoo.tiny_clip_tokenizer(tmp_path)
    assert {"vocab.json", "merges.txt"} <= set(os.listdir(tmp_path))
    for tok in (memory, disk):
        assert tok("a cat").input_ids == [0, tok.convert_tokens_to_ids("a</w>"), tok.convert_tokens_to_ids("cat</w>"), 1]
        assert tok.model_max_length == 16
        assert len(tok("a dog", padding="max_length").input_ids) == 16


def test_sd_pipeline_parts_and_output():
    built = zoo.build("sd_pipeline", torch.bfloat16)
    pipe = built.obj
    assert pipe.unet.dtype == pipe.vae.dtype == pipe.text_encoder.dtype == torch.bfloat16
    assert pipe.scheduler.alphas_cumprod.dtype == torch.float32  # schedulers keep fp32 tensors, as in real use
    assert pipe.safety_checker is None and pipe.feature_extractor is None
    with torch.no_grad():
        images = built.run().images
    assert images.shape == (1, 3, 16, 16) and images.dtype == torch.bfloat16


def test_lora_adapter_dtypes():
    def adapter_dtypes(model):
        return {p.dtype for n, p in model.named_parameters() if ".lora_" in n}

    assert adapter_dtypes(zoo.lora_llama()) == {torch.float32}
    assert adapter_dtypes(zoo.lora_llama(autocast_adapter_dtype=False)) == {torch.bfloat16}
    assert adapter_dtypes(zoo.lora_unet(via="diffusers")) == {torch.bfloat16}
    assert adapter_dtypes(zoo.lora_unet(via="peft")) == {torch.float32}
    with pytest.raises(ValueError, match="via must be"):
        zoo.lora_unet(via="kohya")


def test_lora_adapters_change_the_output():
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        base = zoo.tiny_llama()(input_ids=ids).logits
        lora = zoo.lora_llama(torch.float32)(input_ids=ids).logits
    assert not torch.allclose(base, lora)


def test_bnb_linear4bit_is_quantized_and_not_yet_repacked():
    model = zoo.bnb_linear4bit()
    layer = model.proj
    assert type(layer).__name__ == "Linear4bit" and model[0] is layer
    assert layer.weight.dtype == torch.uint8 and tuple(layer.weight.shape) == (64 * 128 // 2, 1)
    qs = layer.weight.quant_state
    assert qs is layer.quant_state and qs.nested and qs.absmax.dtype == torch.uint8
    assert qs.state2.absmax.dtype == torch.float32 and qs.code.dtype == torch.float32
    plain = zoo.bnb_linear4bit(compress_statistics=False).proj.weight.quant_state
    assert not plain.nested and plain.absmax.dtype == torch.float32


def test_bnb_linear8bit_before_and_after_forward():
    before = zoo.bnb_linear8bit().proj
    assert before.weight.dtype == torch.int8 and before.weight.SCB.shape == (128,)
    assert before.state.CB is None
    after = zoo.bnb_linear8bit(forward=True).proj
    assert after.weight.CB is None and after.state.CB.dtype == torch.int8 and after.state.SCB.shape == (128,)


# --- the fingerprint ----------------------------------------------------------------------------------------------


@pytest.fixture
def llama():
    return zoo.tiny_llama(num_hidden_layers=1)


def _changed(obj, fn, *fragments):
    """Assert that ``fn()`` changes ``obj`` and that the message names each fragment."""
    with pytest.raises(AssertionError, match="the call changed the") as info:
        assert_unchanged(obj, fn)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return str(info.value)


@pytest.mark.parametrize("name", ["llama", "gpt2", "t5", "wan", "sd_pipeline", "unet_lora_peft"])
def test_fingerprint_is_stable_on_an_untouched_object(name):
    built = zoo.build(name, torch.bfloat16)
    assert fingerprint(built.obj) == fingerprint(built.obj)
    assert hash(fingerprint(built.obj)) == hash(fingerprint(built.obj))
    assert assert_unchanged(built.obj, lambda: 42) == 42


def test_a_model_forward_leaves_the_fingerprint_unchanged(llama):
    with torch.no_grad():
        assert_unchanged(llama, llama, torch.tensor([[4, 5, 6]]))


def test_a_pipeline_call_is_not_read_only():
    built = zoo.build("sd_pipeline")
    with torch.no_grad():
        _changed(built.obj, built.run, "scheduler.num_inference_steps", "+_guidance_scale")


def test_bytes_changed_behind_the_version_counter(llama):
    w = llama.model.layers[0].mlp.up_proj.weight
    version = w._version
    msg = _changed(llama, lambda: w.data.add_(1), "model.layers.0.mlp.up_proj.weight:", "data (")
    assert w._version == version and "version" not in msg.split("up_proj.weight:")[1].splitlines()[0]


def test_in_place_write_of_equal_values(llama):
    w = llama.model.norm.weight
    with torch.no_grad():
        _changed(llama, lambda: w.mul_(1), f"model.norm.weight: version {w._version} -> {w._version + 1}")


def test_meta_tensors_hash_metadata_only():
    with torch.device("meta"):
        model = nn.Linear(4, 8)
    assert fingerprint(model) == fingerprint(model)
    assert ("meta", 128) in [rec[12] for _, rec in fingerprint(model) if type(rec) is tuple and rec[:1] == ("tensor",)]
    _changed(model, lambda: setattr(model.weight, "data", torch.empty(8, 2, device="meta")), "shape (8, 4) -> (8, 2)")


def test_device_change():
    model = nn.BatchNorm1d(3)
    _changed(model, lambda: model._buffers.__setitem__("running_mean", model.running_mean.to("meta")),
             "running_mean: ", "device cpu -> meta")


@pytest.mark.parametrize(("change", "fragment"), [
    (lambda w: setattr(w, "data", w.data.bfloat16()), "dtype torch.float32 -> torch.bfloat16"),
    (lambda w: setattr(w, "data", w.data[:2]), "shape (128, 64) -> (2, 64)"),
    (lambda w: setattr(w, "data", w.data.t().contiguous().t()), "stride (64, 1) -> (1, 128)"),
    (lambda w: w.requires_grad_(False), "requires_grad True -> False"),
], ids=["dtype", "shape", "stride", "requires_grad"])
def test_dtype_shape_stride_requires_grad_changes(llama, change, fragment):
    w = llama.lm_head.weight
    _changed(llama, lambda: change(w), f"lm_head.weight: {fragment}")


def test_parameter_replaced_by_an_equal_object(llama):
    def replace():
        proj = llama.model.layers[0].self_attn.q_proj
        proj.weight = nn.Parameter(proj.weight.detach().clone())

    msg = _changed(llama, replace, "model.layers.0.self_attn.q_proj.weight: ", "id ")
    assert "data" not in msg.split("q_proj.weight: ")[1].splitlines()[0]


def test_modules_added_removed_replaced(llama):
    layer = llama.model.layers[0]
    _changed(llama, lambda: layer.add_module("extra", nn.Identity()), "model.layers.0.<_modules>",
             "added    model.layers.0.extra")
    _changed(llama, lambda: delattr(layer.mlp, "act_fn"), "removed  model.layers.0.mlp.act_fn")
    _changed(llama, lambda: setattr(layer, "mlp", type(layer.mlp)(llama.config)), "model.layers.0.mlp: ")


def test_dict_keys_of_modules_and_reachable_objects(llama):
    _changed(llama, lambda: setattr(llama.model, "note", 1), "model: obj ", "+note")
    _changed(llama, lambda: delattr(llama.model, "note"), "-note")
    _changed(llama, lambda: setattr(llama.config, "extra_flag", True), "config: obj ", "+extra_flag")


def test_plain_attribute_values_and_training_flag(llama):
    _changed(llama, llama.train, "model.training: ('bool', False) -> ('bool', True)")


def test_module_hooks():
    model = nn.Sequential(nn.Linear(2, 2))
    hook = lambda *a: None  # noqa: E731
    _changed(model, lambda: model[0].register_forward_hook(hook), "0._forward_hooks")
    _changed(model, lambda: model[0].register_forward_pre_hook(hook), "0._forward_pre_hooks")
    _changed(model, lambda: model[0].register_full_backward_hook(hook), "0._backward_hooks")
    _changed(model, lambda: model[0].register_full_backward_pre_hook(hook), "0._backward_pre_hooks")
    _changed(model, lambda: model[0].weight.register_hook(hook), "0.weight: backward_hooks None")


def test_global_hooks_modes_and_patched_runtime_functions():
    from torch.nn.modules import module as mm
    from torch.utils._python_dispatch import TorchDispatchMode

    model = nn.Linear(2, 2)
    handles = []
    try:
        _changed(model, lambda: handles.append(mm.register_module_forward_hook(lambda *a: None)),
                 "changed  <torch>._global_forward_hooks: () -> (")
    finally:
        for h in handles:
            h.remove()
    mode = TorchDispatchMode()
    try:
        _changed(model, mode.__enter__, "changed  <torch>.dispatch_mode_stack: 0 -> 1")
    finally:
        mode.__exit__(None, None, None)
    original = torch.cuda.is_available
    try:
        _changed(model, lambda: setattr(torch.cuda, "is_available", lambda: True),
                 "changed  <torch>.torch.cuda.is_available: ")
    finally:
        torch.cuda.is_available = original
    assert fingerprint(model) == fingerprint(model)
    assert fingerprint(model, torch_state=False) != fingerprint(model)


def test_grad_set():
    model = nn.Linear(2, 2)
    _changed(model, lambda: setattr(model.weight, "grad", torch.zeros(2, 2)), "added    weight.<grad>")


def test_tied_weights_untied():
    model = zoo.build("gpt2").obj
    assert ("alias", "transformer.wte.weight") in [rec for path, rec in fingerprint(model) if path == "lm_head.weight"]

    def untie():
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())

    _changed(model, untie, "lm_head.weight: ('alias', 'transformer.wte.weight') -> ('tensor'")


def test_bnb_quant_state_tensors():
    model = zoo.bnb_linear4bit()
    qs = model.proj.weight.quant_state
    _changed(model, lambda: qs.absmax.add_(1), "proj.weight.quant_state.absmax: ")
    _changed(model, lambda: qs.state2.absmax.mul_(2), "proj.weight.quant_state.state2.absmax: ")
    _changed(model, lambda: setattr(qs, "code", qs.code.to("meta")), "proj.weight.quant_state.code: ")
    assert any(path == "proj.quant_state" and rec == ("alias", "proj.weight.quant_state")
               for path, rec in fingerprint(model))
    eight = zoo.bnb_linear8bit()
    _changed(eight, lambda: eight.proj.weight.SCB.add_(1), "proj.weight.SCB: ")
    after = zoo.bnb_linear8bit(forward=True)
    _changed(after, lambda: after.proj.state.SCB.add_(1), "proj.state.SCB: ")


def test_generator_and_numpy_state():
    np = pytest.importorskip("numpy")
    holder = type("Holder", (), {})()
    holder.gen = torch.Generator().manual_seed(0)
    holder.arr = np.zeros(4)
    _changed(holder, lambda: torch.rand(1, generator=holder.gen), "gen: ")
    _changed(holder, lambda: holder.arr.__setitem__(0, 1.0), "arr: ")


def test_exceptions_propagate_or_join_the_report():
    model = nn.Linear(2, 2)
    with pytest.raises(ZeroDivisionError):
        assert_unchanged(model, lambda: 1 / 0)

    def mutate_then_fail():
        model.extra = 1
        raise KeyError("boom")

    with pytest.raises(AssertionError, match=r"(?s)\+extra.*and it raised KeyError: 'boom'"):
        assert_unchanged(model, mutate_then_fail)


class _Booby:
    """Every hook a careless walker could trigger raises."""

    __slots__ = ("payload", "missing", "__dict__")

    def __init__(self):
        self.payload = torch.ones(2)
        self.plain = [1, 2]

    def __getattr__(self, name):
        raise RuntimeError("__getattr__ ran")

    def __getattribute__(self, name):
        if name in ("payload", "plain", "__class__", "__dict__") and not _Booby.armed:
            return object.__getattribute__(self, name)
        raise RuntimeError(f"__getattribute__ ran for {name}")

    def __eq__(self, other):
        if _Booby.armed:
            raise RuntimeError("__eq__ ran")
        return self is other

    def __hash__(self):
        if _Booby.armed:
            raise RuntimeError("__hash__ ran")
        return id(self)

    def __iter__(self):
        raise RuntimeError("__iter__ ran")

    def __repr__(self):
        raise RuntimeError("__repr__ ran")

    @property
    def prop(self):
        raise RuntimeError("property ran")

    armed = False


class _LyingDict(dict):
    def items(self):
        raise RuntimeError("items ran")

    def __iter__(self):
        raise RuntimeError("__iter__ ran")

    def keys(self):
        raise RuntimeError("keys ran")


class _LoudTensor(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("__torch_function__ ran")


def test_never_runs_user_code():
    booby = _Booby()
    lying = _LyingDict(a=torch.zeros(1))
    loud = torch.ones(3).as_subclass(_LoudTensor)
    everything = [booby, lying, loud, {booby: 1}]
    _Booby.armed = True
    try:
        fp = fingerprint(everything)
        assert fingerprint(everything) == fp
    finally:
        _Booby.armed = False
    paths = {path for path, _ in fp}
    assert {"[0].payload", "[0].plain", "[0].missing", "[1]['a']", "[2]"} <= paths
    assert [rec for path, rec in fp if path == "[0].missing"] == [("<unset>",)]


def test_cycles_and_bounds(monkeypatch):
    a: list = []
    a.append(a)
    assert fingerprint(a)[1] == ("[0]", ("alias", ""))
    deep: list = []
    node = deep
    for _ in range(helpers.MAX_DEPTH + 50):
        node.append([])
        node = node[0]
    assert any(rec == ("<truncated>",) for _, rec in fingerprint(deep))
    monkeypatch.setattr(helpers, "MAX_NODES", 50)
    with pytest.raises(AssertionError, match="larger than the fingerprint bounds"):
        assert_unchanged(zoo.tiny_llama(num_hidden_layers=1), lambda: None)


def test_fingerprint_path_files_and_directories(tmp_path):
    (tmp_path / "sub").mkdir()
    f = tmp_path / "sub" / "w.bin"
    f.write_bytes(b"\x00" * 64)
    assert fingerprint_path(tmp_path) == fingerprint_path(tmp_path)
    assert assert_unchanged(str(tmp_path), f.read_bytes) == b"\x00" * 64  # reading is fine
    st = os.stat(f)
    _changed(tmp_path, lambda: f.write_bytes(b"\x01" + b"\x00" * 63), "sub/w.bin")
    _changed(tmp_path, lambda: os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9)), "sub/w.bin")
    _changed(tmp_path, lambda: (tmp_path / "new.txt").write_text("x"), "added    new.txt")
    _changed(f, lambda: f.write_bytes(b"\x02"), "changed  <root>")


def test_fingerprint_does_not_touch_the_object(llama):
    w = llama.lm_head.weight
    version, grad, keys = w._version, w.grad, set(vars(w))
    fingerprint(llama)
    assert w._version == version and w.grad is grad and set(vars(w)) == keys


def test_diff_reads_well():
    a = OrderedDict(x=torch.zeros(2))
    before = fingerprint(a)
    a["y"] = 1
    lines = helpers.diff(before, fingerprint(a))
    assert lines[0].startswith("  changed  <root>: dict collections.OrderedDict keys +'y'")
    assert lines[1] == "  added    ['y']: ('int', 1)"

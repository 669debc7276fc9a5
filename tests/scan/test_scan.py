"""scan on the real libraries: the zoo is clean, planted bugs are reported by exact path, nothing is changed."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo
from support.helpers import assert_unchanged


def _module_paths(obj: object) -> set[str]:
    """named_parameters ∪ named_buffers (remove_duplicate=False), per component for pipelines."""
    comps = [("", obj)] if isinstance(obj, nn.Module) else [
        (k, v) for k, v in vars(obj).items() if isinstance(v, nn.Module)
    ]
    out = set()
    for prefix, mod in comps:
        for name, _ in [*mod.named_parameters(remove_duplicate=False), *mod.named_buffers(remove_duplicate=False)]:
            out.add(f"{prefix}.{name}" if prefix else name)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", zoo.NAMES)
def test_zoo_is_clean_and_paths_match_torch(name: str, dtype: torch.dtype) -> None:
    built = zoo.build(name, dtype=dtype)
    report = assert_unchanged(built.obj, torchdoctor.scan, built.obj)
    assert report.ok, report.text()
    assert torchdoctor.scan(built.obj, dtype=dtype, device="cpu").ok
    paths = {t.path for t in report.tensors}
    expected = _module_paths(built.obj)
    assert expected <= paths
    walker_only = {t.path for t in report.tensors if t.role not in ("parameter", "buffer")}
    assert paths == expected | walker_only
    assert {t.path for t in report.tensors if t.role in ("parameter", "buffer")} == expected
    assert len(paths) == len(report.tensors), "one row per path"


def test_tied_weights_are_aliases_counted_once() -> None:
    built = zoo.build("gpt2")
    report = torchdoctor.scan(built.obj)
    rows = {t.path: t for t in report.tensors}
    assert rows["lm_head.weight"].alias_of == "transformer.wte.weight"
    total = sum(g["tensors"] for g in report.summary)
    assert total == sum(1 for t in report.tensors if t.alias_of is None)


def test_default_peft_model_is_ok() -> None:
    model = zoo.lora_llama(torch.bfloat16)  # fp32 adapters over a bf16 base: peft's default
    dtypes = {p.dtype for n, p in model.named_parameters() if "lora_" in n}
    assert dtypes == {torch.float32}
    assert torchdoctor.scan(model).ok


def _first_lora(model: nn.Module) -> tuple[str, nn.Module]:
    return next((n, m) for n, m in model.named_modules() if hasattr(m, "lora_A") and len(m.lora_A))


@pytest.mark.parametrize("make", [lambda: zoo.lora_llama(torch.bfloat16, autocast_adapter_dtype=False),
                                  lambda: zoo.lora_unet(torch.bfloat16)], ids=["llama", "unet"])
def test_lora_b_in_fp32_is_reported_by_exact_path(make) -> None:
    model = make()
    path, layer = _first_lora(model)
    name = next(iter(layer.lora_A))
    layer.lora_A[name].weight.data = layer.lora_A[name].weight.data.to(torch.bfloat16)
    layer.lora_B[name].weight.data = layer.lora_B[name].weight.data.to(torch.float32)
    report = torchdoctor.scan(model)
    assert [(p.kind, p.path) for p in report.problems] == [("dtype", f"{path}.lora_B.{name}.weight")]
    p = report.problems[0]
    assert (p.found, p.expected) == ("float32", "bfloat16")
    assert f"adapter '{name}'" in p.message and "mixes dtypes" in p.message


def test_lora_a_cast_alone_is_the_culprit_not_its_partner() -> None:
    """A 1-1 tie inside one adapter is broken by what the same adapter is in the other layers."""
    model = zoo.lora_llama(torch.bfloat16, autocast_adapter_dtype=False)
    path, layer = _first_lora(model)
    name = next(iter(layer.lora_A))
    layer.lora_A[name].weight.data = layer.lora_A[name].weight.data.to(torch.float16)
    report = torchdoctor.scan(model)
    assert [(p.path, p.found, p.expected) for p in report.problems] == [
        (f"{path}.lora_A.{name}.weight", "float16", "bfloat16")]


def test_adapter_on_other_device_than_base_layer() -> None:
    model = zoo.lora_llama(torch.float32)
    path, layer = _first_lora(model)
    name = next(iter(layer.lora_A))
    layer.lora_A[name].weight = nn.Parameter(layer.lora_A[name].weight.to("meta"))
    report = torchdoctor.scan(model)
    assert [p.path for p in report.problems] == [f"{path}.lora_A.{name}.weight"]
    assert report.problems[0].kind == "meta"


def test_buffer_on_meta_is_reported() -> None:
    model = zoo.tiny_llama(torch.bfloat16)
    rot = model.model.rotary_emb
    rot.inv_freq = rot.inv_freq.to("meta")
    report = torchdoctor.scan(model)
    assert [(p.kind, p.path) for p in report.problems] == [("meta", "model.rotary_emb.inv_freq")]


def test_meta_down_proj_silently_wrong_and_reported() -> None:
    model = zoo.tiny_llama(torch.float32).eval()
    ids = torch.randint(3, 100, (1, 8))
    with torch.no_grad():
        before = model(ids).logits
        mlp = model.model.layers[0].mlp
        mlp.down_proj.weight = nn.Parameter(mlp.down_proj.weight.to("meta"))
        after = model(ids).logits  # no error on CPU: the reason scan must say so
    assert not torch.equal(before, after)
    report = torchdoctor.scan(model)
    assert [(p.kind, p.path) for p in report.problems] == [("meta", "model.layers.0.mlp.down_proj.weight")]
    assert "holds no data (meta)" in report.problems[0].message


def test_bnb_4bit_quant_state_found_with_paths_and_roles() -> None:
    model = zoo.bnb_linear4bit()
    report = torchdoctor.scan(model)
    assert report.ok, report.text()
    rows = {t.path: t for t in report.tensors}
    qs = [p for p, t in rows.items() if t.role == "quant_state" and t.alias_of is None]
    assert {"proj.weight.quant_state.absmax", "proj.weight.quant_state.code", "proj.weight.quant_state.offset",
            "proj.weight.quant_state.state2.absmax", "proj.weight.quant_state.state2.code"} <= set(qs)
    assert rows["proj.quant_state.code"].alias_of == "proj.weight.quant_state.code"
    assert rows["proj.weight"].dtype == torch.uint8


def test_bnb_4bit_quant_state_tensor_on_other_device_reported() -> None:
    model = zoo.bnb_linear4bit()
    qs = model.proj.weight.quant_state
    qs.state2.code = qs.state2.code.to("meta")
    report = torchdoctor.scan(model)
    assert [(p.kind, p.path, p.role) for p in report.problems] == [
        ("meta", "proj.weight.quant_state.state2.code", "quant_state")]
    report = torchdoctor.scan(model, device="meta")
    assert "proj.weight.quant_state.state2.code" not in {p.path for p in report.problems}
    assert "proj.weight.quant_state.code" in {p.path for p in report.problems}


def test_bnb_8bit_scb_before_and_after_first_forward() -> None:
    before = torchdoctor.scan(zoo.bnb_linear8bit(forward=False))
    roles = {t.path: t.role for t in before.tensors}
    assert roles.get("proj.weight.SCB") == "quant_state"
    after = torchdoctor.scan(zoo.bnb_linear8bit(forward=True))
    roles = {t.path: t.role for t in after.tensors}
    assert roles.get("proj.state.SCB") == "quant_state"
    assert not after.problems
    row = next(t for t in after.tensors if t.path == "proj.state.SCB")
    assert row.moved_by_module_to is False


class _Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.extra = [nn.Linear(4, 4)]  # a plain list: Module.to never reaches it
        self.table = {"scale": torch.ones(4)}
        self.cache = torch.zeros(4)


def test_plain_attributes_and_list_held_modules() -> None:
    m = _Holder()
    rows = {t.path: t for t in torchdoctor.scan(m).tensors}
    assert rows["extra.0.weight"].role == "parameter" and rows["extra.0.weight"].moved_by_module_to is False
    assert rows["cache"].role == "attribute" and rows["table.scale"].role == "container"
    m = m.to(torch.bfloat16)
    report = torchdoctor.scan(m)  # attributes are judged against their module with or without dtype=
    assert {p.path for p in report.problems} == {"extra.0.weight", "extra.0.bias", "cache", "table.scale"}
    assert "Module.to never moves it" not in report.problems[0].message  # a dtype problem
    report = torchdoctor.scan(m, device="cpu", dtype=torch.bfloat16)
    assert {p.path for p in report.problems} == {"extra.0.weight", "extra.0.bias", "cache", "table.scale"}


def test_list_held_module_on_other_device_names_why() -> None:
    m = _Holder()
    m.extra[0].weight = nn.Parameter(m.extra[0].weight.to("meta"))
    report = torchdoctor.scan(m, device="meta")
    msgs = {p.path: p.message for p in report.problems}
    assert "Module.to never moves it" in msgs["extra.0.bias"]


def test_scheduler_tensors_have_no_expectation_unless_strict() -> None:
    pipe = zoo.tiny_sd_pipeline(torch.bfloat16)
    assert torchdoctor.scan(pipe, dtype=torch.bfloat16).ok
    strict = torchdoctor.scan(pipe, dtype=torch.bfloat16, strict=True)
    assert any(p.path.startswith("scheduler.") for p in strict.problems)
    rows = {t.path: t for t in strict.tensors}
    assert rows["scheduler.alphas_cumprod"].role == "attribute"
    assert rows["unet.conv_in.weight"].role == "parameter"


def test_device_expectation_from_majority_names_the_odd_one() -> None:
    m = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(2, 2))
    m[2].weight = nn.Parameter(m[2].weight.to("meta"))
    report = torchdoctor.scan(m)
    assert report.expected[""]["device"] == "cpu"
    assert [p.path for p in report.problems] == ["2.weight"]


def test_report_json_shape() -> None:
    m = nn.Sequential(nn.Linear(4, 4))
    m[0].bias.data = m[0].bias.data.double()
    doc = torchdoctor.scan(m).to_dict()
    assert doc["schema"] == "torchdoctor/scan/1" and doc["ok"] is False
    p = doc["problems"][0]
    assert {k: p[k] for k in ("kind", "path", "role", "found", "expected")} == {
        "kind": "dtype", "path": "0.bias", "role": "parameter", "found": "float64", "expected": "float32"}
    assert doc["tensors"][0] == {"path": "0.weight", "role": "parameter", "device": "cpu", "dtype": "float32",
                                 "shape": [4, 4], "nbytes": 64, "moved_by_module_to": True, "alias_of": None}


def test_text_form_problems_first_then_summary() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    m[1].weight.data = m[1].weight.data.half()
    text = torchdoctor.scan(m).text()
    assert text.splitlines()[0] == "1 problem(s) in Sequential:"
    assert "1.weight" in text.splitlines()[1] and "f16[4,4]@cpu" in text
    assert "by device and dtype, each storage once" in text


def test_bad_arguments_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="not a dtype: 'bf17'"):
        torchdoctor.scan(nn.Linear(2, 2), dtype="bf17")
    with pytest.raises(ValueError, match="not a device: 'gpu'"):
        torchdoctor.scan(nn.Linear(2, 2), device="gpu")


def test_assert_placement_lists_paths() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    m[1].bias.data = m[1].bias.data.double()
    with pytest.raises(AssertionError) as info:
        torchdoctor.assert_placement(m, device="cpu", dtype=torch.float32)
    assert "1.bias: found float64, expected float32" in str(info.value)


# -- read-only beyond the zoo ---------------------------------------------------------------------------------
def _offloaded_llama() -> nn.Module:
    from accelerate import cpu_offload

    model = zoo.tiny_llama(torch.float32)
    cpu_offload(model, execution_device=torch.device("cpu"))
    return model


@pytest.mark.parametrize("make", [
    zoo.bnb_linear4bit,
    lambda: zoo.bnb_linear8bit(forward=True),
    lambda: zoo.lora_llama(torch.bfloat16),
    _offloaded_llama,
    lambda: _Holder().to(torch.bfloat16),
], ids=["bnb4", "bnb8_after_forward", "peft_default", "cpu_offload", "list_held"])
def test_scan_is_read_only_on_quantized_adapted_offloaded_objects(make) -> None:
    obj = make()
    for kwargs in ({}, {"device": "cpu", "dtype": torch.bfloat16, "strict": True}):
        assert_unchanged(obj, torchdoctor.scan, obj, **kwargs)


def test_bnb_8bit_state_left_behind_by_module_to_is_reported() -> None:
    model = zoo.bnb_linear8bit(forward=True)
    report = torchdoctor.scan(model, device="meta")  # as if the model had been moved and layer.state had not
    p = next(p for p in report.problems if p.path == "proj.state.SCB")
    assert (p.kind, p.role, p.found, p.expected) == ("device", "quant_state", "cpu", "meta")
    assert "Module.to never moves it" in p.message


# -- CLI JSON fields (issue 2: schema, ok, problems with kind/path/role/found/expected/message, tensors) --------
def test_cli_scan_json_has_every_documented_field(tmp_path, capsys) -> None:
    import json

    from torchdoctor._cli.main import main

    (tmp_path / "m.py").write_text(
        "import torch\n"
        "def broken():\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))\n"
        "    m[1].weight = torch.nn.Parameter(m[1].weight.to('meta'))\n"
        "    m.extra = torch.zeros(2)\n"
        "    return m\n")
    assert main(["scan", f"{tmp_path / 'm.py'}:broken", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {"schema", "ok", "problems", "tensors", "summary"} <= set(doc)
    assert doc["schema"] == "torchdoctor/scan/1" and doc["ok"] is False
    (p,) = doc["problems"]
    assert {k: p[k] for k in ("kind", "path", "role", "found", "expected")} == {
        "kind": "meta", "path": "1.weight", "role": "parameter", "found": "meta", "expected": "cpu"}
    assert p["message"].startswith("f32[4,4]@meta holds no data (meta)")
    rows = {t["path"]: t for t in doc["tensors"]}
    assert rows["extra"] == {"path": "extra", "role": "attribute", "device": "cpu", "dtype": "float32", "shape": [2],
                             "nbytes": 8, "moved_by_module_to": False, "alias_of": None}
    assert main(["scan", f"{tmp_path / 'm.py'}:broken", "--json", "--device", "cpu", "--dtype", "bf16"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {p["path"] for p in doc["problems"]} == {"0.weight", "0.bias", "1.weight", "1.bias", "extra"}


# -- torch >= 2.4: a feature on a newer API says so ---------------------------------------------------------
def test_a_feature_needing_a_newer_torch_says_so() -> None:
    from torchdoctor._placement import require_torch

    require_torch("scan", "2.4")  # the package minimum: always fine
    with pytest.raises(RuntimeError, match=r"^frobnicate needs torch 99\.1 or newer; this is torch 2\.") as info:
        require_torch("frobnicate", "99.1")
    assert "works on torch >= 2.4" in str(info.value)
    with pytest.raises(RuntimeError, match="needs torch 2.9"):
        require_torch("x", "2.9", available=False)  # what the build has wins over its version number
    require_torch("x", "99.0", available=True)


# -- generality: architectures and wrappers beyond the zoo, built tiny from configs ----------------------------
_SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=64)


def _tf(config: str, model: str, **overrides):
    def build() -> nn.Module:
        import transformers

        return getattr(transformers, model)(getattr(transformers, config)(**{**_SMALL, **overrides}))
    return build


def _peft(**cfg):
    def build() -> nn.Module:
        import peft

        return peft.get_peft_model(zoo.tiny_llama(torch.bfloat16), peft.LoraConfig(r=4, **cfg))
    return build


def _sd3() -> nn.Module:
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
                                 num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
                                 pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16)


def _dispatched_to_disk(tmp: str) -> nn.Module:
    from accelerate import dispatch_model

    model = zoo.tiny_llama(torch.float32)
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "cpu",
                  "model.rotary_emb": "cpu", "lm_head": "cpu"}
    return dispatch_model(model, device_map=device_map, offload_dir=tmp)


_CASTABLE = {
    "qwen3": _tf("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen3_moe": _tf("Qwen3MoeConfig", "Qwen3MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                     moe_intermediate_size=32),
    "gemma2": _tf("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3": _tf("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "deepseek_v3": _tf("DeepseekV3Config", "DeepseekV3ForCausalLM", n_routed_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                       qk_nope_head_dim=8, v_head_dim=16, first_k_dense_replace=1, n_group=1, topk_group=1),
    "sd3_transformer": _sd3,
}
_WRAPPED = {
    "lora_dora": _peft(target_modules=["q_proj", "v_proj"], use_dora=True),
    "lora_modules_to_save": _peft(target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"]),
    "cpu_offload": _offloaded_llama,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("name", sorted(_CASTABLE))
def test_more_architectures_are_clean(name: str, dtype: torch.dtype) -> None:
    model = _CASTABLE[name]().to(dtype)
    report = torchdoctor.scan(model)
    assert report.ok, report.text()
    assert torchdoctor.scan(model, device="cpu", dtype=dtype).ok
    assert {t.path for t in report.tensors if t.role in ("parameter", "buffer")} == {
        n for n, _ in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]}


@pytest.mark.parametrize("name", sorted(_WRAPPED))
def test_adapters_and_offload_wrappers_are_clean(name: str) -> None:
    model = _WRAPPED[name]()
    assert torchdoctor.scan(model).ok, torchdoctor.scan(model).text()
    assert torchdoctor.scan(model, device="cpu").ok


def test_second_adapter_and_disk_dispatch_are_clean(tmp_path) -> None:
    import peft

    model = _peft(target_modules=["q_proj", "v_proj"])()
    model.add_adapter("b", peft.LoraConfig(r=2, target_modules=["q_proj", "k_proj"]))
    assert torchdoctor.scan(model).ok
    dispatched = _dispatched_to_disk(str(tmp_path))
    report = torchdoctor.scan(dispatched)
    assert report.ok, report.text()
    assert {t.role for t in report.tensors if t.path.startswith("model.layers.1.")} == {"offloaded"}


def test_plain_containers_are_judged_against_what_was_asked() -> None:
    """A batch dict, a state_dict, a list or an optimizer holds no module: with device=/dtype= its tensors are
    judged (assert_placement(batch, device="cuda:0") must not pass a cpu batch); scalars (AdamW's step) are not."""
    model = nn.Linear(4, 4)
    batch = {"pixel_values": torch.ones(2, 4), "input_ids": torch.ones(2, 3, dtype=torch.long)}
    for obj in (batch, model.state_dict(), [torch.ones(2), torch.ones(3)]):
        assert not torchdoctor.scan(obj, "cuda:0").ok
        with pytest.raises(AssertionError, match="placement is not device=cuda:0"):
            torchdoctor.assert_placement(obj, device="cuda:0")
        assert torchdoctor.scan(obj).ok  # nothing asked, nothing to compare with
        torchdoctor.assert_placement(obj, device="cpu")
    report = torchdoctor.scan(batch, dtype=torch.bfloat16)
    assert [(p.path, p.found) for p in report.problems] == [("pixel_values", "float32")]  # ids stay integers
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    for state in opt.state.values():
        state["exp_avg"] = state["exp_avg"].to(torch.bfloat16)
    report = torchdoctor.scan(opt, dtype=torch.float32)
    assert report.problems and all(p.path.endswith("exp_avg") for p in report.problems)  # not the fp32 step
    pipe = zoo.tiny_sd_pipeline()  # a pipeline's scheduler keeps its fp32 tables on the cpu by design
    assert not [p for p in torchdoctor.scan(pipe, "cpu", torch.bfloat16).problems if p.path.startswith("scheduler")]


def test_a_tensor_on_the_wrong_device_and_in_the_wrong_dtype_carries_both_problems() -> None:
    """Issue 27: one problem per path let a device problem mask the dtype one (a planted float32 bias in a bf16
    model, left on cpu, judged against cuda:0 bf16). The correct variant: only the device relocation."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).to(torch.bfloat16)
    model[1].bias.data = model[1].bias.data.float()
    report = torchdoctor.scan(model, "cuda:0", torch.bfloat16)
    mine = sorted((p.kind, p.found, p.expected) for p in report.problems if p.path == "1.bias")
    assert mine == [("device", "cpu", "cuda:0"), ("dtype", "float32", "bfloat16")]
    assert "dtype  1.bias" in str(report) and "dtype=bfloat16 was asked for" in str(report)
    model[1].bias.data = model[1].bias.data.to(torch.bfloat16)
    fine = torchdoctor.scan(model, "cuda:0", torch.bfloat16)
    assert {p.kind for p in fine.problems} == {"device"}  # every tensor still to move, none to cast
    assert torchdoctor.scan(model, "cpu", torch.bfloat16).ok


def test_a_problem_found_while_a_trace_records_names_the_call_that_cast_it() -> None:
    """scan reads the trace module only once something imported it (a scan never loads it): under a trace, each
    problem says which call last cast its tensor; after the trace, the plain message."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with torchdoctor.trace(model):
        line = sys._getframe().f_lineno + 1
        model[1].bias.data = model[1].bias.data.double()
        traced = [p.message for p in torchdoctor.scan(model).problems]
    from torchdoctor._trace.record import short_file  # how trace names a file (relative to the working directory)

    assert traced == [f"f64[4]@cpu is float64 but the model is float32 (float64 since `.data =` at "
                      f"{short_file(__file__)}:{line})"]
    plain = [p.message for p in torchdoctor.scan(model).problems]
    assert len(plain) == 1 and "since `.data =`" not in plain[0] and traced[0].startswith(plain[0])


def test_a_tensor_wrong_in_device_and_dtype_is_decided_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both of its problems come from one decision of the policy (the judge asked twice before)."""
    from torchdoctor._scan.policy import Policy

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).to(torch.bfloat16)
    model[1].bias.data = model[1].bias.data.float()
    asked: list[str] = []
    decide = Policy.decide
    monkeypatch.setattr(Policy, "decide", lambda self, e: asked.append(e.path) or decide(self, e))
    report = torchdoctor.scan(model, "cuda:0", torch.bfloat16)
    assert sorted((p.kind, p.path) for p in report.problems if p.path == "1.bias") == [("device", "1.bias"),
                                                                                       ("dtype", "1.bias")]
    assert asked.count("1.bias") == 1 and len(asked) == len(set(asked))

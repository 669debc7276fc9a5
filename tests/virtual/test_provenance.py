"""Blame the culprit in virtual runs: simulate(call=...), the virtual session behind ``@pytest.mark.simulate``, and
module-entry checks that catch a leftover whatever kernel path runs later."""

from __future__ import annotations

import inspect
import re

from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo
from torchdoctor._virtual.session import virtual_devices

BF = torch.bfloat16


def _paths(problems: Any) -> list[str]:
    return [p.path for p in problems]


def test_simulate_names_the_upcast_embedding_first() -> None:
    b = zoo.build("llama", BF)
    b.obj.get_input_embeddings().to(torch.float32)
    report = torchdoctor.simulate(b.obj, b.inputs, device="cuda:1")
    assert report.problems[0].path == "model.embed_tokens.weight" and report.culprits == 1
    later = report.problems[1]
    # the victim names its origin: the op and module that made it from the culprit
    assert "aten.embedding in `model.embed_tokens` from model.embed_tokens.weight" in later.message
    text = report.text()
    assert text.index("model.embed_tokens.weight") < text.index("where they surfaced")


def test_simulate_goes_past_attention_the_composite_would_refuse() -> None:
    """sdpa compares q/k/v dtypes before dispatch: the run aligns them like any op and goes on to the lm_head; the
    rotary chain (float32 by design, cast to the float32 activation) points at the culprit too."""
    b = zoo.build("llama", BF)
    b.obj.get_input_embeddings().to(torch.float32)
    report = torchdoctor.simulate(b.obj, b.inputs, device="cuda:1")
    assert "stopped early" not in report.text()
    attn = [p for p in report.problems if p.op == "aten.scaled_dot_product_attention.default"]
    assert [p.module_path for p in attn] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert all("(the float32 culprit: model.embed_tokens.weight)" in p.message for p in attn)
    assert "lm_head" in _paths(report.problems)


def _marker_run(body: Any) -> torchdoctor.PlacementError:
    """What ``@pytest.mark.simulate(device="cuda:1")`` does around a test body: the user's own code, no copy."""
    with pytest.raises(torchdoctor.PlacementError) as info:
        with virtual_devices("cuda:1"):
            body()
    return info.value


def test_lora_injected_after_to_is_named_by_path() -> None:
    import peft

    def body() -> None:
        model = zoo.tiny_llama().to("cuda:1")  # AstrAI#19 / diffusers#5897: adapters added after the move
        model = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
        for layer in model.base_model.model.model.layers:  # peft made them where the base is; the report
            for m in layer.self_attn.q_proj.lora_A.values():  # pattern: created before, left on the CPU
                m.to("cpu")
        model(input_ids=torch.ones(1, 4, dtype=torch.long, device="cuda:1"))

    err = _marker_run(body)
    paths = _paths(err.problems)
    assert paths[0] == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", paths
    assert "a tensor made in forward" not in str(err).splitlines()[1]


class _Cached(nn.Module):
    """darts#3052: a cache built on the first forward and reused after ``.to()``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cache is None:
            self.cache = torch.ones(4, device=x.device)
        return self.proj(x) * self.cache


def test_cache_built_before_to_is_named() -> None:
    def body() -> None:
        m = _Cached()
        m(torch.ones(2, 4))  # cache made on cpu
        m.to("cuda:1")
        m(torch.ones(2, 4, device="cuda:1"))

    err = _marker_run(body)
    assert _paths(err.problems)[0] == "cache"


class _ListOfBuffers(nn.Module):
    """pytorch#29807: a list holding registered buffers that ``.to()`` replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.ones(4))
        self.register_buffer("b", torch.ones(4))
        self.both = [self.a, self.b]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.both[0] + self.both[1]


def test_list_of_replaced_buffers_is_named() -> None:
    def body() -> None:
        m = _ListOfBuffers().to("cuda:1")
        m(torch.ones(4, device="cuda:1"))

    err = _marker_run(body)
    assert _paths(err.problems)[:2] == ["both.0", "both.1"]


def test_adalora_ranknum_left_on_cpu_is_named() -> None:
    import peft

    def body() -> None:
        model = zoo.tiny_llama().to("cuda:1")
        cfg = peft.AdaLoraConfig(init_r=2, target_r=1, target_modules=["q_proj"], total_step=10)
        model = peft.get_peft_model(model, cfg)
        layer = model.base_model.model.model.layers[0].self_attn.q_proj
        layer.ranknum["default"].data = torch.ones_like(layer.ranknum["default"], device="cpu")  # peft#581
        model(input_ids=torch.ones(1, 4, dtype=torch.long, device="cuda:1"))

    err = _marker_run(body)
    assert _paths(err.problems)[0] == "base_model.model.model.layers.0.self_attn.q_proj.ranknum.default"


def test_plain_attribute_and_list_held_module_are_named() -> None:
    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.scale = torch.ones(4)
            self.refiners = [nn.Linear(4, 4)]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.refiners[0](self.proj(x) * self.scale)

    def body() -> None:
        m = Holder().to("cuda:1")
        m(torch.ones(2, 4, device="cuda:1"))

    err = _marker_run(body)
    assert {"scale", "refiners.0.weight"} <= set(_paths(err.problems))


# --- the seed scenario: 4-bit layer moved to cuda:1 with quant_state.code left behind -----------------------------


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("nested", [True, False], ids=["nested", "plain"])
def test_seed_quant_state_code_left_behind_in_call(old_quant_state_to: None, rows: int, nested: bool) -> None:
    model = zoo.bnb_linear4bit(compress_statistics=nested)

    def run(m: nn.Module) -> None:
        m.to("cuda:1")  # the user's own code moves it
        m(torch.randn(rows, 64, device="cuda:1"))

    report = torchdoctor.simulate(model, device="cuda:1", call=run)
    assert report.problems and report.problems[0].path == "proj.weight.quant_state.code", report.text()
    assert report.problems[0].found == "cpu" and report.problems[0].expected == "cuda:1"


@pytest.mark.parametrize("rows", [1, 2])
def test_seed_quant_state_code_left_behind_under_the_marker_session(old_quant_state_to: None, rows: int) -> None:
    def body() -> None:
        model = zoo.bnb_linear4bit()
        model.to("cuda:1")
        model(torch.randn(rows, 64, device="cuda:1"))

    err = _marker_run(body)
    assert err.problems[0].path == "proj.weight.quant_state.code"


def test_entry_checks_add_nothing_on_correct_models() -> None:
    for name in ("llama", "unet", "llama_lora"):
        b = zoo.build(name, BF)
        assert torchdoctor.simulate(b.obj, b.inputs, device="cuda:1").ok, name

    def body() -> None:
        b = zoo.build("llama", BF)
        m = b.obj.to("cuda:1")
        m(input_ids=b.inputs["input_ids"].to("cuda:1"))

    with virtual_devices("cuda:1") as sim:
        body()
    assert sim.ok


class _Rotary(nn.Module):
    """llama-style complex ``freqs_cis`` buffer: ``Module.to(bf16)`` drops its imaginary part."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("freqs_cis", torch.polar(torch.ones(4), torch.randn(4)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.freqs_cis.real.repeat(2).to(x.dtype)


def test_lossy_cast_of_a_complex_buffer_is_a_problem() -> None:
    model = _Rotary()
    report = torchdoctor.simulate(model, (torch.randn(2, 8),), device="cuda:1", dtype=torch.bfloat16)
    assert any(p.path == "freqs_cis" and "loses data" in p.message for p in report.problems), report.text()
    assert torchdoctor.simulate(model, (torch.randn(2, 8),), device="cuda:1").ok  # no cast: nothing lost


# --- provenance of tensors made in the run: op, module, sources --------------------------------------------------


class _CatOfLeftovers(nn.Module):
    """pytorch#29807 with the list joined in forward: the cat's result carries the list's cpu device downstream."""

    def __init__(self) -> None:
        super().__init__()
        for i in range(4):
            self.register_buffer(f"b{i}", torch.ones(2))
        self.params = [getattr(self, f"b{i}") for i in range(4)]
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * torch.cat(self.params)


def test_made_tensor_names_op_module_and_sources() -> None:
    report = torchdoctor.simulate(_CatOfLeftovers(), (torch.randn(2, 8),), device="cuda:1")
    assert _paths(report.problems)[:4] == [f"params.{i}" for i in range(4)] and report.culprits == 4
    victim = report.problems[4]
    assert victim.path == "<root>" and victim.role == "activation"
    assert victim.message.startswith("a tensor made by aten.cat in `<root>` from params.0 … params.3 f32[8]@cpu is "
                                     "on cpu while aten.mul.Tensor runs on cuda:1"), victim.message
    text = report.text()
    assert text.index("params.*") < text.index("where they surfaced") < text.index("aten.cat in `<root>`")


def test_made_tensor_fix_targets_its_sources_under_the_marker() -> None:
    def body() -> None:
        m = _CatOfLeftovers().to("cuda:1")
        m(torch.randn(2, 8, device="cuda:1"))

    err = _marker_run(body)
    assert "model.params[3].data = model.params[3].data.to('cuda:1')" in err.fix
    assert "tensors made on" not in err.fix  # fixing the sources fixes what was made from them


class _Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * torch.ones(8)  # made on the default device, not x.device


def test_factory_made_tensor_names_the_factory_and_module() -> None:
    report = torchdoctor.simulate(nn.Sequential(_Masked()), (torch.randn(2, 8),), device="cuda:1")
    [p] = report.problems
    line = inspect.getsourcelines(_Masked)[1] + next(i for i, ln in enumerate(inspect.getsourcelines(_Masked)[0])
                                                     if "torch.ones" in ln)
    assert p.message.startswith(f"a tensor made by torch.ones in `0` at tests/virtual/test_provenance.py:{line} "
                                "f32[8]@cpu is on cpu while aten.mul"), p.message


class _Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.l1 = nn.Linear(8, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids) * 2
        return self.l1((h + 1).relu())


def test_chain_of_made_tensors_names_the_first_op_and_its_source() -> None:
    model = _Chain().to(BF)
    model.emb.float()  # the upcast embedding of LlamaFactory#5583
    report = torchdoctor.simulate(model, (torch.tensor([[1, 2]]),), device="cuda:1")
    assert report.problems[0].path == "emb.weight" and report.culprits == 1
    msg = report.problems[1].message
    assert msg.startswith("a tensor made by aten.view in `l1`, ") and \
        " ops after aten.embedding in `emb` from emb.weight f32[2,8]@cuda:1 is float32 while aten." in msg, msg


def test_provenance_survives_the_fix_the_run_goes_on_with() -> None:
    class Twice(_CatOfLeftovers):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(self.lin(x) * torch.cat(self.params))

    model = Twice().to(BF)  # the list keeps the float32 cpu originals
    report = torchdoctor.simulate(model, (torch.randn(2, 8, dtype=BF),), device="cuda:1")
    last = report.problems[-1]
    assert last.kind == "dtype" and last.path == "lin", report.text()
    assert last.message.startswith("a tensor made by aten.mul in `<root>` from a tensor made by aten.cat in `<root>` "
                                   "from params.0 … params.3 f32[2,8]@cuda:1 is float32"), last.message


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = torch.ones(8)  # a plain attribute: Module.to never moves it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def test_model_compiled_before_the_run_is_simulated_eagerly_by_its_paths(recwarn: Any) -> None:
    import torch._dynamo

    compiled = torch.compile(_Scaled(), backend="eager")
    x = torch.randn(2, 8)
    compiled(x)  # the first compile happened outside any simulation
    report = torchdoctor.simulate(compiled, (x,), device="cuda:1")
    assert [(p.kind, p.path) for p in report.problems] == [("device", "scale")], report.text()
    assert "plain tensor attribute" in report.problems[0].message
    assert not [w for w in recwarn if "global hooks" in str(w.message)]  # the hooks are the run's own
    assert torch._dynamo.eval_frame._stance.stance == "default"  # the compiler is left as it was
    assert torch.equal(compiled(x), compiled._orig_mod(x))

    def body() -> None:
        m = compiled.to("cuda:1")
        m(torch.randn(2, 8, device="cuda:1"))

    err = _marker_run(body)
    assert _paths(err.problems) == ["scale"]  # the op that meets it names the same tensor: one problem


class _PosEnc(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.pe = torch.zeros(4)  # a plain attribute: Module.to never moves it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.pe


def test_simulation_report_carries_the_fix_and_the_lasting_one() -> None:
    report = torchdoctor.simulate(_PosEnc(), (torch.ones(2, 4),), device="cuda:1")
    assert _paths(report.problems) == ["pe"]
    assert report.fix is not None and report.fix.splitlines()[0] == "model.pe.data = model.pe.data.to('cuda:1')"
    assert "register pe as a buffer" in report.fix and "register_buffer(name, tensor, persistent=False)" in report.fix
    assert "\n".join(f"    {line}" for line in report.fix.splitlines()) + "\n    # fix proven (at the failing op " \
        in report.text()
    assert report.to_dict()["fix"] == report.fix
    assert torchdoctor.simulate(nn.Linear(4, 4), (torch.ones(2, 4),), device="cuda:1").fix is None


def test_profiles_by_preset_name_in_the_python_api() -> None:
    """``profile="t4"`` as on the command line (``--profile t4``): a T4 has no bf16 convolution."""
    m = nn.Conv2d(3, 4, 3).to(BF)
    report = torchdoctor.simulate(m, (torch.ones(1, 3, 8, 8, dtype=BF),), device="cuda:0", profile="t4")
    assert report.profile.name.startswith("NVIDIA T4") and not report.ok
    assert report.problems[0].kind == "unsupported_dtype"
    with pytest.raises(ValueError, match="unknown device profile 'h900'; known profiles: "):
        torchdoctor.simulate(m, (torch.ones(1, 3, 8, 8, dtype=BF),), device="cuda:0", profile="h900")
    with pytest.raises(TypeError, match="profile must be a DeviceProfile or a preset name"):
        torchdoctor.guard(m, profile=3)  # type: ignore[arg-type]
    with virtual_devices("cuda:0", profile="a100") as sim:
        assert torch.cuda.get_device_capability(0) == (8, 0)
    assert sim.ok


class _Tagger(nn.Module):
    """An LSTM tagger whose input projection stayed float32 in a bf16 model: nn.LSTM compares dtypes in Python
    (a ValueError) before any op runs."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.rnn = nn.LSTM(8, 8, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(self.proj(x))[0]


def _tagger() -> _Tagger:
    m = _Tagger().to(BF)
    m.proj.to(torch.float32)
    return m


def test_python_level_dtype_check_is_a_problem_not_a_traceback() -> None:
    m = _tagger()
    with pytest.raises(ValueError, match="RNN input dtype|input must have the type"):
        m(torch.ones(1, 3, 4))
    report = torchdoctor.simulate(m, (torch.ones(1, 3, 4),), device="cuda:1")
    assert _paths(report.problems) == ["proj.bias", "proj.weight", "rnn"], report.text()
    assert report.culprits == 2
    rnn = report.problems[2]
    assert (rnn.kind, rnn.found, rnn.expected, rnn.module_type) == ("dtype", "float32", "bfloat16", "LSTM")
    assert "the run ended at a check torch makes before any op" in (report.stopped or "")
    assert report.fix is not None and "tensors made" not in report.fix
    assert "model.proj.to(torch.bfloat16)  # every floating tensor of proj is float32 while the rest of the model " \
        "is bfloat16" in report.fix  # the layer in another dtype than its neighbours: that layer cast (issue 41 #5)
    err = _marker_run(lambda: _tagger().to("cuda:1")(torch.ones(1, 3, 4, device="cuda:1")))
    assert [p.path for p in err.problems] == ["proj.bias", "proj.weight", "rnn"], str(err)


def test_guard_explains_the_culprit_on_a_python_level_dtype_check() -> None:
    # the error keeps its class (ValueError) and carries the explanation in its own text, after torch's message:
    # a note is dropped by some frontends
    m = _tagger()
    with pytest.raises(ValueError) as info, torchdoctor.guard(m):
        m(torch.ones(1, 3, 4))
    text = str(info.value)
    assert text.startswith("RNN input dtype (torch.float32) does not match weight dtype (torch.bfloat16)")
    assert "\n\ndtype mismatch caused by `proj.bias` (float32, expected bfloat16)" in text
    assert "it surfaced in `rnn` (LSTM)" in text
    assert "model.proj.bias.data = model.proj.bias.data.to(torch.bfloat16)" in text


class _Float64Positions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[-1], dtype=torch.float64, device=x.device)  # mps has no float64
        return self.lin(x) * pos.float()


def test_factory_of_a_dtype_the_device_cannot_hold_is_named_at_the_factory() -> None:
    report = torchdoctor.simulate(_Float64Positions(), (torch.ones(2, 8),), device="mps")
    first = report.problems[0]
    assert (first.kind, first.op, first.found) == ("unsupported_dtype", "torch.arange", "float64")
    assert re.search(r"torch\.arange\(dtype=float64, device='mps:0'\) at tests/virtual/test_provenance\.py:\d+: mps "
                     "cannot hold float64 tensors", first.message), first.message
    assert torchdoctor.simulate(_Float64Positions(), (torch.ones(2, 8),), device="cuda:0").ok


@pytest.mark.parametrize("name", ["gpt2", "opt", "falcon", "bart", "whisper"])
def test_upcast_embedding_is_the_culprit_first_across_architectures(name: str) -> None:
    """Tied heads read the culprit itself in an op and norms meet its float32 first: the culprit still leads,
    once, and guard agrees."""
    b = zoo.build(name, BF)
    emb = b.obj.get_input_embeddings()
    emb.to(torch.float32)
    path = next(n for n, m in b.obj.named_modules() if m is emb) + ".weight"
    report = torchdoctor.simulate(b.obj, b.inputs, device="cuda:1")
    assert report.problems[0].path == path and report.culprits >= 1, report.text()
    assert _paths(report.problems).count(path) == 1
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(b.obj):
        b.run()
    assert info.value.problems[0].path == path


def test_backward_is_simulated() -> None:
    m = nn.Linear(4, 4)

    def step(model: nn.Module) -> None:
        model.to("cuda:1")
        model(torch.ones(2, 4, device="cuda:1")).sum().backward()
        assert model.weight.grad is not None and model.weight.grad.device == torch.device("cuda:1")

    report = torchdoctor.simulate(m, call=step, device="cuda:1")
    assert report.ok, report.text()
    assert m.weight.grad is None  # the user's model was not touched
    with virtual_devices("cuda:1"):
        step(nn.Linear(4, 4))


class _CpuPositions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1]).float()  # no device=: on cpu, on any GPU this fails
        return self.lin(x) + pos[None, :, None]


def test_factory_without_device_is_traced_through_casts_and_fixed_at_the_call() -> None:
    report = torchdoctor.simulate(_CpuPositions(), (torch.randn(1, 4, 8),), device="cuda:0")
    assert "torch.arange in `<root>`" in report.problems[0].message, report.text()
    assert report.fix == ("# torch.arange in `<root>` made it on cpu: pass device= the input's device "
                          "(torch.arange(..., device=x.device))")


def test_no_forward_is_not_an_unqualified_ok() -> None:
    report = torchdoctor.simulate(_CpuPositions(), device="cuda:0")
    assert report.ok and not report.forward and not report.to_dict()["forward"]
    assert report.text().startswith("ok: the move left nothing behind (no forward ran: pass inputs, or from the "
                                    "command line return torchdoctor.Target(model, args), to check the forward)")
    assert torchdoctor.simulate(nn.Linear(8, 8), (torch.ones(1, 8),), device="cuda:0").text().startswith(
        "ok: no placement problems")

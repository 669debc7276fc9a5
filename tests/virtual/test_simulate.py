"""simulate: placement checked on virtual cuda:N / xpu / mps on this CPU-only machine (real libraries, no mocks)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from support import zoo
from support.helpers import assert_unchanged
from torch import nn

import torchdoctor
from torchdoctor import DeviceProfile, Target
from torchdoctor._cli.main import main

IDS = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))


def _found(report: Any, kind: str | None = None) -> list[tuple[str, str]]:
    return sorted((p.kind, p.path) for p in report.problems if kind is None or p.kind == kind)


class Net(nn.Module):
    """A small model whose forward can be given a planted bug."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.conv(x).mean((2, 3)))


# --- clean runs, and the user's objects untouched -----------------------------------------------------------------


@pytest.mark.parametrize("device", ["cuda:1", "xpu:0", "mps"])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_small_model_runs_clean_everywhere(device: str, dtype: torch.dtype | None) -> None:
    model = Net()
    report = assert_unchanged(model, torchdoctor.simulate, model, (torch.randn(1, 3, 8, 8),), device=device,
                              dtype=dtype)
    assert report.ok, report.problems
    assert report.ops > 0 and report.device == torchdoctor._placement.norm_device(torch.device(device))


def test_move_only_gives_a_placement_report() -> None:
    model = zoo.tiny_llama()
    report = assert_unchanged(model, torchdoctor.simulate, model, device="cuda:1", dtype="bf16")
    assert report.ok
    assert [(g["device"], g["dtype"]) for g in report.summary] == [("cuda:1", "bfloat16")]


def test_nothing_leaks_out_of_a_simulation() -> None:
    model = zoo.tiny_llama()
    rng = torch.get_rng_state()
    torchdoctor.simulate(model, {"input_ids": IDS}, device="mps", dtype="fp16")
    torchdoctor.simulate(model, device="cuda:1", call=lambda m: torch.randn(3, device="cuda"))  # cpu rng underneath
    assert torch.equal(torch.get_rng_state(), rng)
    assert not torch.cuda.is_available() and not torch.backends.mps.is_available()
    assert torch.Generator is torch._C.Generator and "_make_subclass" not in torch.Tensor.__dict__
    assert torch.Event.__module__ == torch.Stream.__module__ == "torch"
    assert not torch._C._is_torch_function_mode_enabled()
    assert torch.ones(2).device.type == "cpu"


def test_llama_lora_bf16_forward_leaves_the_model_alone() -> None:
    model = zoo.lora_llama(torch.bfloat16)
    report = assert_unchanged(model, torchdoctor.simulate, model, {"input_ids": IDS}, device="cuda:1")
    assert report.ok, report.problems


def test_virtual_tensors_wrap_plain_tensors_only() -> None:
    import copy

    inner: list[type] = []

    def run(m: nn.Module) -> None:
        m.to("cuda:1", torch.bfloat16)
        twin = copy.deepcopy(m)
        y = twin(torch.randn(1, 3, 8, 8, device="cuda:1", dtype=torch.bfloat16))
        inner.extend(type(t._td_elem) for t in (*m.parameters(), *twin.parameters(), y))  # type: ignore[attr-defined]
        inner.append(type(y))

    assert torchdoctor.simulate(Net(), device="cuda:1", call=run).ok
    assert set(inner[:-1]) == {torch.Tensor} and inner[-1].__name__ == "VirtualTensor"


def test_dict_of_modules_moves_each_component() -> None:
    parts = {"encoder": nn.Linear(4, 4), "decoder": nn.Linear(4, 4).to(torch.float64)}
    report = assert_unchanged(parts, torchdoctor.simulate, parts, device="xpu", dtype="bf16")
    assert report.ok and [(g["device"], g["dtype"], g["tensors"]) for g in report.summary] == [("xpu:0", "bfloat16", 4)]


def test_meta_model_is_simulated_as_loaded_and_says_so() -> None:
    """A model built on meta (weights not loaded) is checked as if loaded on the device, and the report says so;
    ``assume_device=False`` checks the weights as missing."""
    with torch.device("meta"):
        model = zoo.tiny_llama()
    report = torchdoctor.simulate(model, {"input_ids": IDS}, device="cuda:1")
    assert report.ok and report.assumed is not None and "weights not loaded" in report.assumed
    assert "simulated as if loaded on cuda:1" in str(report) and report.to_dict()["assumed"] == report.assumed
    missing = torchdoctor.simulate(model, {"input_ids": IDS}, device="cuda:1", assume_device=False)
    assert {p.kind for p in missing.problems} == {"meta"} and len(missing.problems) > 10
    assert ("meta", "model.embed_tokens.weight") in _found(missing) and missing.assumed is None
    assert torchdoctor.simulate(model, {"input_ids": IDS}, device="cuda:1", assume_device="cpu").ok


def test_target_carries_the_inputs() -> None:
    report = torchdoctor.simulate(Target(Net(), (torch.randn(1, 3, 8, 8),)), device="xpu")
    assert report.ok and report.ops >= 3  # convolution, mean, linear (one op: _virtual/whole.py)


# --- the virtual runtime ------------------------------------------------------------------------------------------


def test_runtime_answers_for_the_profile() -> None:
    seen: dict[str, Any] = {}

    def probe(model: nn.Module) -> None:
        seen["available"], seen["count"] = torch.cuda.is_available(), torch.cuda.device_count()
        seen["capability"], seen["free"] = torch.cuda.get_device_capability(), torch.cuda.mem_get_info()[0]
        seen["generator"] = torch.Generator("cuda:1").device
        seen["random"] = torch.randn(3, generator=torch.Generator("cuda"), device="cuda").device
        torch.cuda.set_device(1)
        seen["current"], seen["bare"] = torch.cuda.current_device(), torch.ones(2).cuda().device
        with torch.cuda.device(0):
            seen["inside"] = torch.zeros(1, device="cuda").device
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.cuda.synchronize()
        seen["stream"] = stream.device
        seen["accelerator"] = torch.accelerator.current_accelerator()
        seen["autocast"] = torch.autocast("cuda", dtype=torch.bfloat16)._enabled

    profile = DeviceProfile("cuda", count=2, capability=(8, 6), memory=24 * 1024**3)
    assert torchdoctor.simulate(Net(), device="cuda:0", profile=profile, call=probe).ok
    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    assert seen == {"available": True, "count": 2, "capability": (8, 6), "free": 24 * 1024**3, "generator": cuda1,
                    "random": cuda0, "current": 1, "bare": cuda1, "inside": cuda0, "stream": cuda1,
                    "accelerator": torch.device("cuda"), "autocast": True}


def test_mps_runtime_and_its_dtype_limits() -> None:
    seen: dict[str, Any] = {}

    def probe(model: nn.Module) -> None:
        seen["mps"], seen["where"] = torch.backends.mps.is_available(), torch.ones(2, device="mps").device

    assert torchdoctor.simulate(Net(), device="mps", call=probe).ok
    assert seen == {"mps": True, "where": torch.device("mps", 0)}


def test_old_gpu_cannot_run_bf16_matmul() -> None:
    report = torchdoctor.simulate(Net(), (torch.randn(1, 3, 8, 8),), device="cuda", dtype="bf16",
                                  profile=DeviceProfile("cuda", capability=(7, 5)))
    kinds = {p.kind for p in report.problems}
    assert kinds == {"unsupported_dtype"}
    assert any("capability 7.5" in p.message and "bfloat16" in p.message for p in report.problems)


def test_numpy_of_a_device_tensor() -> None:
    def run(m: nn.Module) -> None:  # call= runs as the program would: with autograd, so inference says no_grad
        m.to("cuda:1")
        with torch.no_grad():
            m(torch.randn(1, 3, 8, 8, device="cuda:1")).numpy()

    report = torchdoctor.simulate(Net(), device="cuda:1", call=run)
    assert [(p.kind, p.op, p.found, p.expected) for p in report.problems] == [
        ("device", "Tensor.numpy", "cuda:1", "cpu")]
    assert "call .cpu() first" in report.problems[0].message
    assert torchdoctor.simulate(Net(), device="cuda:1", call=lambda m: m.to("cuda:1")(
        torch.randn(1, 3, 8, 8, device="cuda:1")).detach().cpu().numpy()).ok


def test_device_beyond_the_profile_count() -> None:
    def run(m: nn.Module) -> None:
        m.to("cuda:1")
        m(torch.randn(1, 3, 8, 8, device="cuda:1"))
        torch.zeros(2, device="cuda:3")

    report = torchdoctor.simulate(Net(), device="cuda:0", call=run, profile=DeviceProfile("cuda", count=1))
    assert sorted({(p.kind, p.found) for p in report.problems}) == [("device", "cuda:1"), ("device", "cuda:3")]
    assert "cuda:1 does not exist (invalid device ordinal)" in report.problems[0].message


def test_generator_on_another_device_is_reported() -> None:
    report = torchdoctor.simulate(Net(), device="cuda:1", call=lambda m: torch.randn(
        2, generator=torch.Generator(), device="cuda:1"))
    assert [(p.kind, p.op) for p in report.problems] == [("device", "torch.randn")]
    assert "expects a 'cuda' generator" in report.problems[0].message


def test_autocast_region_over_fp32_weights_runs_clean() -> None:
    class CastsInput(nn.Module):  # a bf16 input into fp32 weights: legal only under autocast
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.norm = nn.Linear(4, 4), nn.LayerNorm(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(self.lin(x.to(torch.bfloat16)))

    def run(model: nn.Module) -> None:
        model.to("cuda:1")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(torch.randn(2, 4, device="cuda:1"))

    assert torchdoctor.simulate(CastsInput(), device="cuda:1", call=run).ok
    plain = torchdoctor.simulate(CastsInput(), (torch.randn(2, 4),), device="cuda:1")
    # the model is float32: the bf16 cast is the odd one, named by its line (the maker), the fix written there
    assert _found(plain) == [("dtype", "lin")]
    assert "a tensor made by `to(torch.bfloat16)` at " in plain.problems[0].message
    assert plain.problems[0].message.endswith("from input 0 bf16[2,4]@cuda:1 is bfloat16 while aten.addmm.default "
                                              "computes in float32 (in lin, Linear)")
    assert [(f.kind, f.proven) for f in plain.fixes] == [("line", True)]


# --- pipelines, generation, accelerate, bitsandbytes ----------------------------------------------------------------


def test_stable_diffusion_pipeline_call() -> None:
    pipe = zoo.tiny_sd_pipeline()
    latents: list[Any] = []

    def run(p: Any) -> None:
        p.to("cuda:1")
        latents.append(p("a cat", num_inference_steps=2, height=16, width=16, output_type="latent").images)

    report = assert_unchanged(pipe, torchdoctor.simulate, pipe, device="cuda:1", call=run)
    assert report.ok, report.problems
    assert report.ops > 100 and latents[0].device == torch.device("cuda:1") and latents[0].shape == (1, 4, 8, 8)


@pytest.mark.parametrize("device", ["cuda:1", "xpu:0", "mps"])
def test_llama_generate_with_cpu_data(device: str) -> None:
    model = zoo.tiny_llama()
    out: list[Any] = []

    def run(m: Any) -> None:  # on mps, generate records a torch.Event per step (DeferredStopCheck)
        m.to(device)
        ids = m.generate(IDS.to(device), max_new_tokens=3, do_sample=False)
        out.extend((ids.device.type, ids.cpu().tolist()))

    report = assert_unchanged(model, torchdoctor.simulate, model, device=device, data="cpu", call=run)
    assert report.ok, report.problems
    with torch.no_grad():  # real values underneath: the same tokens as on the CPU
        assert out == [device.split(":")[0], model.generate(IDS, max_new_tokens=3, do_sample=False).tolist()]


def test_data_dependent_code_needs_cpu_data() -> None:
    model = zoo.tiny_llama()
    run = lambda m: (m.to("cuda:1"), m.generate(IDS.to("cuda:1"), max_new_tokens=3, do_sample=False))  # noqa: E731
    report = torchdoctor.simulate(model, device="cuda:1", call=run, data="meta")  # asked for: no values at all
    assert [p.kind for p in report.problems] == ["unsupported_op"]
    assert "_local_scalar_dense" in report.problems[0].op and "data='cpu'" in report.problems[0].message
    assert report.exit_code() == 2 and report.stopped
    # by default a run that stops at a value read is run again with real values, when the model holds data
    report = assert_unchanged(model, torchdoctor.simulate, model, device="cuda:1", call=run)
    assert report.ok and report.data == "cpu", report.text()
    meta = zoo.tiny_llama().to("meta")  # weights not loaded: no values to read, so the value read stays a problem
    report = torchdoctor.simulate(meta, device="cuda:1", call=run)
    assert report.data == "meta" and [p.kind for p in report.problems][-1:] == ["unsupported_op"], report.text()


def test_a_training_step_that_reads_its_loss_is_quiet() -> None:
    # everyday code: `loss.item()` after a step (hunt U6: a correct program stopped with "simulate with data='cpu'")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def step(m: nn.Module) -> float:
        m.to("cuda:0")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        loss = m(torch.randn(4, 8, device="cuda:0")).square().mean()
        loss.backward()
        opt.step()
        return loss.item()

    report = torchdoctor.simulate(model, device="cuda:0", call=step)
    assert report.ok, report.text()
    model.extra = [nn.Linear(1, 1)]  # the control: a list-held layer Module.to never moves, met after the value read

    def bad(m: nn.Module) -> float:
        return m.extra[0](step(m) * torch.ones(1, 1, device="cuda:0")).item()

    report = torchdoctor.simulate(model, device="cuda:0", call=bad)
    assert {p.path for p in report.problems} >= {"extra.0.weight"}, report.text()


def test_accelerate_dispatch_over_two_virtual_gpus() -> None:
    from accelerate import dispatch_model

    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": 1,
                  "model.norm": 1, "lm_head": 1}
    seen: list[str] = []

    def run(m: Any) -> None:
        out = dispatch_model(m, device_map=device_map)(input_ids=IDS.to("cuda:0"))
        seen.extend(str(t.device) for t in (m.model.embed_tokens.weight, m.model.layers[1].mlp.up_proj.weight,
                                             m.lm_head.weight, out.logits))

    model = zoo.tiny_llama()
    report = assert_unchanged(model, torchdoctor.simulate, model, device="cuda:0", call=run,
                              profile=DeviceProfile.for_device("cuda:1"))
    assert report.ok, report.problems
    assert seen == ["cuda:0", "cuda:1", "cuda:1", "cuda:0"]  # io_same_device: outputs come back to cuda:0

    wrong = dict(device_map, **{"model.norm": 0})  # accelerate moves activations between the layers: still fine
    bad = lambda m: dispatch_model(m, device_map=wrong)(input_ids=IDS.to("cuda:0"))  # noqa: E731
    assert torchdoctor.simulate(zoo.tiny_llama(), device="cuda:0", call=bad,
                                profile=DeviceProfile.for_device("cuda:1")).ok

    def broken(m: Any) -> None:  # a weight moved by hand after dispatch: its hook no longer matches
        dispatch_model(m, device_map=device_map)
        m.model.layers[1].mlp.up_proj.weight.data = m.model.layers[1].mlp.up_proj.weight.data.to("cuda:0")
        m(input_ids=IDS.to("cuda:0"))

    report = torchdoctor.simulate(zoo.tiny_llama(), device="cuda:0", call=broken,
                                  profile=DeviceProfile.for_device("cuda:1"))
    assert _found(report) == [("device", "model.layers.1.mlp.up_proj.weight")]


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_bnb_linear4bit_on_cuda1(rows: int, dtype: torch.dtype | None) -> None:
    model = zoo.bnb_linear4bit()
    report = assert_unchanged(model, torchdoctor.simulate, model, (torch.randn(rows, 64),), device="cuda:1",
                              dtype=dtype)
    assert report.ok, report.problems


def test_bnb_old_quant_state_to_leaves_code_behind(old_quant_state_to: None) -> None:
    report = torchdoctor.simulate(zoo.bnb_linear4bit(), (torch.randn(1, 64),), device="cuda:1")
    assert _found(report) == [("device", "proj.weight.quant_state.code")]
    assert report.problems[0].found == "cpu" and report.problems[0].expected == "cuda:1"


def test_bnb_8bit_state_left_behind_after_first_forward() -> None:
    model = zoo.bnb_linear8bit(forward=True)
    report = assert_unchanged(model, torchdoctor.simulate, model, (torch.randn(2, 64),), device="cuda:1")
    assert ("device", "proj.state.SCB") in _found(report)
    scb = next(p for p in report.problems if p.path == "proj.state.SCB")
    # found when the layer starts, whatever kernel path runs later
    assert scb.op == "Linear8bitLt.forward" and scb.module_path == "proj"
    assert "proj.state.SCB f32[128]@cpu is on cpu when proj (Linear8bitLt) starts on cuda:1" in scb.message


# --- planted bugs, each reported by path ------------------------------------------------------------------------------


def test_lora_weight_left_on_cpu() -> None:
    def run(model: nn.Module) -> None:
        model.to("cuda:1")
        lora_b = model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"]
        lora_b.weight = nn.Parameter(torch.zeros_like(lora_b.weight, device="cpu"))  # loaded after the move
        model(input_ids=IDS.to("cuda:1"))

    report = torchdoctor.simulate(zoo.lora_llama(torch.bfloat16), device="cuda:1", call=run)
    path = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
    assert _found(report) == [("device", path)]
    assert report.problems[0].module_path == path.rsplit(".", 1)[0]


class ListHeld(Net):
    def __init__(self) -> None:
        super().__init__()
        self.extra = [nn.Conv2d(4, 4, 1)]  # list-held: Module.to never moves it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.extra[0](self.conv(x)).mean((2, 3)))


def test_conv_weight_and_bias_on_other_devices() -> None:
    model = ListHeld()
    report = assert_unchanged(model, torchdoctor.simulate, model, (torch.randn(1, 3, 8, 8),), device="cuda:1")
    assert _found(report) == [("device", "extra.0.bias"), ("device", "extra.0.weight")]
    assert all(p.op == "ListHeld.forward" for p in report.problems)  # found when the module starts

    def bias_elsewhere(m: nn.Module) -> None:
        m.to("cuda:1")
        m.conv.bias.data = m.conv.bias.data.to("cuda:0")
        m(torch.randn(1, 3, 8, 8, device="cuda:1"))

    report = torchdoctor.simulate(Net(), device="cuda:1", call=bias_elsewhere)
    assert _found(report) == [("device", "conv.bias")]
    assert (report.problems[0].found, report.problems[0].expected) == ("cuda:0", "cuda:1")


class Table(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.table = torch.randn(10, 4)  # a plain attribute: Module.to never moves it

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.lin(self.table[idx])


def test_conv_input_in_another_dtype_than_its_bias_is_reported_not_raised() -> None:
    # torch.conv2d's C++ composite compares input and bias dtypes before any aten op is dispatched
    for layer, x in ((nn.Conv2d(4, 4, 2), torch.randn(1, 4, 8, 8)), (nn.ConvTranspose1d(4, 4, 2), torch.randn(1, 4, 8))):
        model = nn.Sequential(layer).to(torch.bfloat16)
        report = assert_unchanged(model, torchdoctor.simulate, model, (x,), device="cuda:1")
        assert _found(report) == [("dtype", "input 0")], report.problems
        assert (report.problems[0].found, report.problems[0].expected) == ("float32", "bfloat16")
        # the model is already bf16: simulate converts nothing, so the inputs arrive as given, as in the real run
        assert _found(torchdoctor.simulate(model, (x,), device="cuda:1", dtype="bf16")) == [("dtype", "input 0")]
        assert torchdoctor.simulate(model.float(), (x,), device="cuda:1", dtype="bf16").ok  # converted: cast too


def test_cpu_tensor_indexed_with_device_indices() -> None:
    report = torchdoctor.simulate(Table(), (torch.tensor([1, 2]),), device="cuda:1")
    assert _found(report) == [("device", "table")]
    assert report.problems[0].op == "Table.forward"  # found when the module starts


def test_device_tensor_indexed_with_cpu_indices_is_legal() -> None:
    def run(m: Table) -> None:
        m.to("cuda:1")
        m.table = m.table.to("cuda:1")
        m(torch.tensor([1, 2]))

    assert torchdoctor.simulate(Table(), device="cuda:1", call=run).ok


def test_one_float32_weight_in_a_bf16_llama() -> None:
    model = zoo.tiny_llama(torch.bfloat16)
    down = model.model.layers[0].mlp.down_proj
    down.weight.data = down.weight.data.float()
    report = torchdoctor.simulate(model, {"input_ids": IDS}, device="cuda:1")
    assert _found(report) == [("dtype", "model.layers.0.mlp.down_proj.weight")]
    p = report.problems[0]
    assert (p.found, p.expected, p.module_type) == ("float32", "bfloat16", "Linear")


class Scaled(nn.Module):
    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale.float()


def test_buffer_on_meta() -> None:
    model = Scaled(torch.ones(4, device="meta"))
    report = torchdoctor.simulate(model, (torch.randn(2, 4),), device="cuda:1")
    assert _found(report) == [("meta", "scale")]
    assert "Cannot copy out of meta tensor" in report.problems[0].message
    assert torchdoctor.simulate(model, (torch.randn(2, 4),), device="cuda:1", assume_device="cpu").ok


def test_float64_buffer_on_mps() -> None:
    model = Scaled(torch.ones(4, dtype=torch.float64))
    report = torchdoctor.simulate(model, (torch.randn(2, 4),), device="mps")
    assert _found(report) == [("unsupported_dtype", "scale")]
    assert "scale f64[4]@cpu moved to mps:0 as float64: mps cannot hold float64" in report.problems[0].message
    assert torchdoctor.simulate(model, (torch.randn(2, 4),), device="cuda:1").ok


def test_bare_cuda_inside_forward_is_the_current_device() -> None:
    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + torch.ones(4).cuda()

    report = torchdoctor.simulate(Bare(), (torch.randn(2, 4),), device="cuda:1")
    assert [(p.kind, p.found, p.expected, p.module_type) for p in report.problems] == [
        ("device", "cuda:0", "cuda:1", "Bare")]
    assert torchdoctor.simulate(Bare(), (torch.randn(2, 4),), device="cuda:0").ok


class TwoBugs(Scaled):
    def __init__(self, n: int = 1) -> None:
        super().__init__(torch.ones(4, device="meta"))
        self.extra = [nn.Linear(4, 4) for _ in range(n)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin in self.extra:
            x = lin(x)
        return self.lin(x) * self.scale


def test_two_planted_bugs_are_both_reported() -> None:
    report = torchdoctor.simulate(TwoBugs(), (torch.randn(2, 4),), device="cuda:1")
    assert _found(report) == [("device", "extra.0.bias"), ("device", "extra.0.weight"), ("meta", "scale")]


def test_problem_limit_stores_the_first_and_counts_the_rest() -> None:
    report = torchdoctor.simulate(TwoBugs(6), (torch.randn(2, 4),), device="cuda:1", limit=3)
    assert len(report.problems) == 4 and report.stopped is None  # the run went on to its end
    assert (report.problems[-1].kind, report.problems[-1].found) == ("truncated", "10 more")
    assert "10 more problem(s) not stored: at most 3 are kept" in report.text()


# --- what cannot be simulated, bad usage, the report and the CLI ----------------------------------------------------


@torch.library.custom_op("tdsimtest::cpu_only", mutates_args=(), device_types="cpu")
def _cpu_only(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class CustomOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tdsimtest.cpu_only(self.lin(x))


@pytest.mark.parametrize("data", ["meta", "cpu"])
def test_custom_op_without_fake_kernel_is_unsupported(data: str) -> None:
    report = torchdoctor.simulate(CustomOp(), (torch.randn(2, 4),), device="cuda:1", data=data)
    assert [(p.kind, p.op) for p in report.problems] == [("unsupported_op", "tdsimtest.cpu_only.default")]
    assert "no fake/meta kernel" in report.problems[0].message and report.exit_code() == 2


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="inputs or call, not both"):
        torchdoctor.simulate(Net(), (torch.randn(1, 3, 8, 8),), device="cuda:1", call=print)
    with pytest.raises(ValueError, match="does not exist: the profile has 1 cuda"):
        torchdoctor.simulate(Net(), device="cuda:1", profile=DeviceProfile("cuda"))
    with pytest.raises(ValueError, match="not of the profile's type"):
        torchdoctor.simulate(Net(), device="xpu", profile=DeviceProfile("cuda"))
    with pytest.raises(ValueError, match="data must be"):
        torchdoctor.simulate(Net(), device="xpu", data="gpu")


def test_report_json_and_text() -> None:
    report = torchdoctor.simulate(Table(), (torch.tensor([1]),), device="cuda:1", dtype="bfloat16")
    # the table stays float32 on cpu: indexing it on cuda:1 fails, and its float32 rows meet bf16 weights
    assert _found(report) == [("device", "table"), ("dtype", "lin")]
    assert report.problems[1].message.startswith(
        "a tensor made by aten.index in `<root>` from table f32[1,4]@cuda:1 is float32 while")
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["schema"] == "torchdoctor/simulate/1" and doc["ok"] is False
    assert (doc["device"], doc["dtype"], doc["data"], doc["profile"]["type"]) == ("cuda:1", "bfloat16", "meta", "cuda")
    assert doc["problems"][0]["path"] == "table" and doc["problems"][0]["tensors"]  # in the order found
    text = report.text()
    assert re.match(r"2 problem\(s\) \(\d+ ops on virtual cuda:1 in bfloat16, [\d.]+ s\):$", text.splitlines()[0])
    assert "table f32[10,4]@cpu is on cpu when <root> (Table) starts on cuda:1" in text
    assert str(torchdoctor.simulate(Net(), device="xpu")).startswith("ok: the move left nothing behind (no forward ran")


MODELS = textwrap.dedent(
    """
    import torch
    from torch import nn

    def fine():
        return (nn.Linear(4, 4), (torch.ones(1, 4),))

    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.extra = nn.Linear(4, 4), [nn.Linear(4, 4)]

        def forward(self, x):
            return self.extra[0](self.lin(x))

    def broken():
        return (Broken(), (torch.ones(1, 4),))

    @torch.library.custom_op("tdsimcli::cpu_only", mutates_args=(), device_types="cpu")
    def cpu_only(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    class Custom(nn.Linear):
        def forward(self, x):
            return torch.ops.tdsimcli.cpu_only(super().forward(x))

    def custom():
        return (Custom(4, 4), (torch.ones(1, 4),))

    def on_meta():
        with torch.device("meta"):
            return (nn.Linear(4, 4), (torch.ones(1, 4),))
    """
)


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    assert main(["simulate", f"{path}:fine", "--device", "cuda:1", "--dtype", "bf16"]) == 0
    assert capsys.readouterr().out.startswith("ok: no placement problems")
    assert main(["simulate", f"{path}:broken", "--device", "cuda:1", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "torchdoctor/simulate/1"
    assert sorted(p["path"] for p in doc["problems"]) == ["extra.0.bias", "extra.0.weight"]
    assert main(["simulate", f"{path}:custom", "--device", "xpu"]) == 2
    assert "unsupported_op" in capsys.readouterr().out
    assert main(["simulate", f"{path}:fine", "--device", "cuda:3", "--count", "2"]) == 2  # no cuda:3 among 2
    # the CLI runs the TARGET's own code in the session (it may build on cuda:N): meta weights are named as missing
    # a model built on meta is taken as loaded on the device, as simulate() does; "off" checks the weights as missing
    assert main(["simulate", f"{path}:on_meta", "--device", "mps"]) == 0
    assert "weights not loaded: assumed on mps:0" in capsys.readouterr().out
    assert main(["simulate", f"{path}:on_meta", "--device", "mps", "--assume-device", "off"]) == 1
    assert "holds no data (meta)" in capsys.readouterr().out
    assert main(["simulate", f"{path}:on_meta", "--device", "mps", "--assume-device", "cpu"]) == 0
    assert main(["simulate", str(path), "--device", "cuda:1"]) == 2
    assert "simulate needs an object" in capsys.readouterr().err
    assert main(["simulate", f"{path}:fine", "--device", "gpu"]) == 2

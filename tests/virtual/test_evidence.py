"""Blame by evidence in virtual runs (simulate, and the virtual session behind ``call=`` and the pytest marker): a
plain attribute or container tensor is reported only when an op read it; a report never claims a dtype the code did
not run in; fixes never contradict each other or the profile; weights that are tensor subclasses simulate."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor


class _Lit(nn.Module):
    """Lightning-style module: example_input_array, a loss history, a dict aliasing a buffer (all on cpu)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.example_input_array = torch.randn(2, 8)
        self.loss_history = [torch.tensor(1.0), torch.randn(3)]
        self.register_buffer("table", torch.randn(8))
        self.aliases = {"table": self.table}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.table


class _Reads(_Lit):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.example_input_array + self.aliases["table"]


def test_attributes_and_containers_the_forward_never_reads_are_quiet() -> None:
    report = torchdoctor.simulate(_Lit(), (torch.randn(2, 8),), device="cuda:0")
    assert report.ok, report.text()
    session = torchdoctor.simulate(_Lit(), device="cuda:0", call=lambda m: m.to("cuda:0")(
        torch.randn(2, 8, device="cuda:0")))
    assert session.ok, session.text()


def test_attributes_and_containers_the_forward_reads_are_reported_by_path() -> None:
    report = torchdoctor.simulate(_Reads(), (torch.randn(2, 8),), device="cuda:0")
    paths = [p.path for p in report.problems]
    assert "example_input_array" in paths and "aliases.table" in paths, report.text()
    assert not any(p.startswith("loss_history") for p in paths)
    assert "a plain tensor attribute the forward reads" in report.text()


def test_a_run_with_float32_weights_never_reads_as_checked_in_float16() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    report = torchdoctor.simulate(model, device="cuda:0", dtype="float16", call=lambda m: m(torch.randn(2, 8)))
    assert not report.ok
    p = report.problems[0]
    assert (p.kind, p.path, p.found, p.expected) == ("dtype", "<run>", "float32", "float16")
    assert "the code ran with float32 weights, not float16" in p.message
    assert (report.fix or "").startswith("model.to(torch.float16)")
    assert "in float32 (float16 asked for)" in str(report).splitlines()[0]  # the headline says how it really ran

    def half(m: nn.Module) -> Any:
        return m.half()(torch.randn(2, 8, dtype=torch.float16))

    assert torchdoctor.simulate(model, device="cuda:0", dtype="float16", call=half).ok


def test_t4_without_bf16_suggests_float16_never_float32() -> None:
    """A T4 (capability 7.5) cannot convolve in bf16: the fix must not double the model's memory."""
    model = nn.Sequential(*[nn.Conv2d(16, 16, 3, padding=1) for _ in range(4)]).to(torch.bfloat16)
    report = torchdoctor.simulate(model, (torch.randn(1, 16, 8, 8, dtype=torch.bfloat16),), "cuda:0", profile="t4")
    assert any(p.kind == "unsupported_dtype" for p in report.problems)
    assert "model.to(torch.float16)" in (report.fix or "") and "float32" not in (report.fix or "")
    ok = torchdoctor.simulate(model.to(torch.float16), (torch.randn(1, 16, 8, 8, dtype=torch.float16),), "cuda:0",
                              profile="t4")
    assert ok.ok, ok.text()


def test_meta_weights_are_never_fixed_by_a_move() -> None:
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)])
    report = torchdoctor.simulate(model, (torch.randn(2, 16),), "cuda:0", assume_device=False)
    assert any(p.kind == "meta" for p in report.problems)
    assert "torchdoctor.move" not in (report.fix or "") and ".to('cuda:0')" not in (report.fix or "")
    assert "load the weights" in (report.fix or "")


class _Tagged(torch.Tensor):
    """A tensor subclass with its own __torch_function__ that ends in torch's default one (which converts results
    with as_subclass): a weight of this type used to end a simulation in torch's internal "Creating a new Tensor
    subclass" error."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("use_call", [False, True])
def test_a_weight_that_is_a_tensor_subclass_simulates(use_call: bool) -> None:
    model = nn.Linear(4, 4)
    model.weight = nn.Parameter(model.weight.detach().as_subclass(_Tagged))
    assert isinstance(model.weight, _Tagged)
    if use_call:
        report = torchdoctor.simulate(model, device="cuda:0", call=lambda m: m.to("cuda:0")(
            torch.randn(2, 4, device="cuda:0")))
    else:
        report = torchdoctor.simulate(model, (torch.randn(2, 4),), "cuda:0")
    assert report.ok, report.text()
    model.bias.data = model.bias.data.double()  # and a real problem next to it is still found
    bad = torchdoctor.simulate(model, (torch.randn(2, 4),), "cuda:0")
    assert [p.path for p in bad.problems][:1] == ["bias"], bad.text()


def test_integer_position_ids_the_caller_built_name_the_factory_call() -> None:
    """Issue 25: the caller's tokens made before the model ran were "a tensor made in forward". An integer tensor
    made by a factory without device= in user code outside the model keeps its origin through ``expand``."""

    class Pos(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.pos = nn.Embedding(10, 8), nn.Embedding(16, 8)

        def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
            return self.emb(input_ids) + self.pos(position_ids)

    def call(model: nn.Module) -> torch.Tensor:
        input_ids = torch.randint(0, 10, (2, 5), device="cuda:1")
        position_ids = torch.arange(5).expand(2, 5)  # the caller forgot device=
        return model.to("cuda:1")(input_ids, position_ids=position_ids)

    report = torchdoctor.simulate(Pos(), device="cuda:1", call=call)
    [p] = report.problems
    assert p.kind == "device" and p.found == "cpu" and "torch.arange" in p.message and "made in forward" not in p.message
    assert "torch.arange(..., device=" in report.fix


def test_a_forward_replacing_lora_network_left_on_cpu_is_named_by_its_path_in_a_virtual_run() -> None:
    """kohya sd-scripts' LoRA modules replace the patched module's ``forward`` and hold ``lora_down`` / ``lora_up``
    themselves (re-created here in a few lines): a network module left on cpu is named under
    ``<patched>.forward.__self__``, as scan names it, not as "a tensor made in forward"."""

    class LoRAModule(nn.Module):
        def __init__(self, org: nn.Linear) -> None:
            super().__init__()
            self.lora_down = nn.Linear(org.in_features, 4, bias=False)
            self.lora_up = nn.Linear(4, org.out_features, bias=False)
            self.org_forward = org.forward
            org.forward = self.forward

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.org_forward(x) + self.lora_up(self.lora_down(x))

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    network = [LoRAModule(model[0]), LoRAModule(model[2])]
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        model.to("cuda:1")
        network[1].to("cuda:1")  # the first module of the network is left on cpu
        model(torch.randn(2, 8, device="cuda:1"))
    paths = sorted(p.path for p in sim.problems)
    assert paths == ["0.forward.__self__.lora_down.weight", "0.forward.__self__.lora_up.weight"], sim.problems
    assert not [p for p in sim.problems if "made in forward" in p.message]
    assert {p.path for p in torchdoctor.scan(model).problems} == set(paths)

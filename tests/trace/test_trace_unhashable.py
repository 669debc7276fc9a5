"""Objects that define ``__eq__`` without ``__hash__`` (bitsandbytes' QuantState, a module with its own ``__eq__``, a
dataclass) met by a trace: a trace remembers them by identity, never by hashing them. Each test fails if the trace
hashes one: the program breaks (a module's ``self.scale = ...`` raising ``TypeError``), or the trace logs that it
could not look at the state before a call and misses what that call changed."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import sys

import pytest
import torch
from torch import nn

import torchdoctor


def _next_line() -> int:
    return sys._getframe(1).f_lineno + 1


class _WithEq(nn.Module):
    """A module defining ``__eq__`` (Python then sets ``__hash__ = None``) and a plain tensor attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.scale = torch.ones(2)

    def __eq__(self, other: object) -> bool:
        return self is other


def _trace_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("torchdoctor") and r.levelno >= logging.WARNING]


def test_a_module_without_hash_sets_a_tensor_attribute_under_a_trace_of_everything(
        caplog: pytest.LogCaptureFixture) -> None:
    assert _WithEq.__hash__ is None
    lines, first = inspect.getsourcelines(_WithEq.__init__)
    born = first + next(i for i, text in enumerate(lines) if "self.scale =" in text)
    with caplog.at_level(logging.WARNING, logger="torchdoctor"), torchdoctor.trace(None) as t:
        m = _WithEq()  # hashing it to remember the attribute's birth raised TypeError in the program
        cast = _next_line()
        m.to(torch.bfloat16)
    assert _trace_warnings(caplog) == []
    recs = {(r.path, r.kind, r.call, r.to_dtype, r.line) for r in t.records}
    assert ("scale", "add", ".scale =", "float32", born) in recs
    assert {("lin.weight", "move", "to()", "bfloat16", cast), ("lin.bias", "move", "to()", "bfloat16", cast)} <= recs


def test_bnb_4bit_layer_under_a_peft_inject_adopted_by_a_trace_of_everything(
        caplog: pytest.LogCaptureFixture) -> None:
    """A QuantState (``__eq__``, no ``__hash__``) inside the model peft's ``inject_adapter`` hands the trace first:
    the trace adopts the model and records the adapters it adds and the attribute set before, with no note."""
    bnb = pytest.importorskip("bitsandbytes")
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    q = bnb.nn.Linear4bit(16, 16, compute_dtype=torch.float32, quant_type="nf4").to("cpu")  # quantizes
    assert type(q.weight.quant_state).__hash__ is None

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = q
            self.o = nn.Linear(16, 4)
            self.scale = torch.ones(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.o(self.q_proj(x)) * self.scale

    with caplog.at_level(logging.WARNING, logger="torchdoctor"), torchdoctor.trace(None) as t:
        net = Net()
        inject = _next_line()
        model = get_peft_model(net, LoraConfig(r=2, target_modules=["q_proj"]))
        out = model(torch.randn(2, 16))
    assert out.shape == (2, 4)
    assert _trace_warnings(caplog) == []
    adds = {r.path for r in t.records if r.kind == "add" and r.line == inject and r.call == "get_peft_model()"}
    assert {p.rsplit("q_proj.", 1)[1] for p in adds} == {"lora_A.default.weight", "lora_B.default.weight"}
    assert any(r.path.endswith("scale") and r.call == ".scale =" for r in t.records)


def test_an_unhashable_dataclass_and_a_dict_as_traced_objects() -> None:
    @dataclasses.dataclass
    class Bundle:  # eq=True: no __hash__
        net: nn.Module
        extra: dict[str, torch.Tensor]

    with torchdoctor.trace(None):  # a plain tensor set on a module no trace knows: its birth is remembered
        net = nn.Linear(2, 2)
        net.table = torch.zeros(3)
    b = Bundle(net, {"k": torch.ones(1)})
    with torchdoctor.trace(b) as t:
        b.net.to(torch.float16)
        b.extra["k"] = b.extra["k"].double()
        b.net.to(torch.float32)
    recs = [(r.path, r.kind, r.to_dtype, r.call) for r in t.records]
    assert recs[1:3] == [("net.weight", "move", "float16", "to()"), ("net.bias", "move", "float16", "to()")]
    assert ("extra.k", "move", "float64", "(code the trace did not see)") in recs
    assert recs[0] == ("net.table", "add", "float32", ".table =")  # told when the bundle was traced

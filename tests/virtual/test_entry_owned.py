"""The module-entry check's list of what a module owns: the walk-free answer for plain modules equals the walk's,
on every zoo model (and its LoRA, bitsandbytes and accelerate forms), before a run and on the virtual copy during
one; anything the walk-free reader does not know is left to the walk."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import zoo
from torch import nn

import torchdoctor
from torchdoctor._virtual import entry


def _modules(obj: Any) -> list[nn.Module]:
    roots = [obj] if isinstance(obj, nn.Module) else [v for v in vars(obj).values() if isinstance(v, nn.Module)]
    return [m for r in roots for m in r.modules()]


def _both(mod: nn.Module, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    fast = entry.owned(mod)
    with monkeypatch.context() as m:
        m.setattr(entry, "_plain_owned", lambda *a: None)
        slow = entry.owned(mod)
    return fast, slow


def _same(a: list[tuple[str, Any, str]], b: list[tuple[str, Any, str]]) -> bool:
    return [(p, id(t), r) for p, t, r in a] == [(p, id(t), r) for p, t, r in b]


@pytest.mark.parametrize("name", zoo.NAMES)
def test_walk_free_answer_equals_the_walk_on_the_zoo(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    obj = zoo.build(name).obj
    mods = _modules(obj)
    fast_taken = 0
    for mod in mods:
        fast, slow = _both(mod, monkeypatch)
        assert _same(fast, slow), (type(mod).__name__, fast, slow)
        fast_taken += entry._plain_owned(*entry.holding(mod)) is not None
    assert fast_taken > len(mods) // 2  # most modules of a real model take the walk-free path


def test_what_the_walk_free_reader_declines(monkeypatch: pytest.MonkeyPatch) -> None:
    lin = nn.Linear(2, 2)
    plain = entry.owned(lin)
    assert [(p, r) for p, _, r in plain] == [("weight", "parameter"), ("bias", "parameter")]
    cases = {
        "a tensor in a list": lambda m: setattr(m, "extra", [torch.zeros(1)]),
        "a tensor with a tensor of its own": lambda m: setattr(m.weight, "quant_state", torch.zeros(1)),
        "a plain tensor in _parameters": lambda m: m._parameters.__setitem__("raw", torch.zeros(1)),
        "an object attribute": lambda m: setattr(m, "cfg", type("Cfg", (), {})()),
        "a ParameterList": lambda m: setattr(m, "plist", nn.ParameterList([nn.Parameter(torch.zeros(1))])),
    }
    for what, change in cases.items():
        m = nn.Linear(2, 2)
        change(m)
        assert entry._plain_owned(*entry.holding(m)) is None, what
        fast, slow = _both(m, monkeypatch)
        assert _same(fast, slow), what
    m = nn.Linear(2, 2)
    m.register_buffer("scale", torch.ones(1))
    m.shift = torch.zeros(1)  # a plain tensor attribute
    m.alias = m.weight.data  # another tensor over the same storage: its own entry
    m.kernel = (3, 3)
    fast, slow = _both(m, monkeypatch)
    assert _same(fast, slow)
    assert [(p, r) for p, _, r in fast] == [("weight", "parameter"), ("bias", "parameter"), ("scale", "buffer"),
                                            ("shift", "attribute"), ("alias", "attribute")]


@pytest.mark.parametrize("name", ["llama", "unet", "llama_lora", "t5"])
def test_during_a_simulation_the_two_answers_agree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    built = zoo.build(name, torch.bfloat16)
    real = entry.owned
    checked: list[int] = []

    def both(mod: nn.Module) -> Any:
        fast = real(mod)
        with monkeypatch.context() as m:
            m.setattr(entry, "_plain_owned", lambda *a: None)
            slow = real(mod)
        assert _same(fast, slow), (type(mod).__name__, fast, slow)
        checked.append(1)
        return fast

    monkeypatch.setattr(entry, "owned", both)
    report = torchdoctor.simulate(built.target(), device="cuda:1", dtype=torch.bfloat16)
    assert report.ok and report.ops > 0
    assert len(checked) > 5  # the module-entry check ran on the virtual copy's modules


def test_bitsandbytes_modules_still_take_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    seq = zoo.bnb_linear4bit()
    lin = seq.proj
    assert entry._plain_owned(*entry.holding(lin)) is None  # quant_state hangs off the weight
    fast, slow = _both(lin, monkeypatch)
    assert _same(fast, slow)
    assert any("quant_state" in p for p, _, _ in fast)

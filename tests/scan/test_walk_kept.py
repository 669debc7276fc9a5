"""A module tree's walk kept between scans (``_walk.kept``) is reused only while it is exactly what a new walk would
find: every change below, made between two scans of one model, must make the kept walk equal a fresh walk (or be
refused), and an unchanged tiny Llama must be reused (the speed path of issue 43 point 3)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._walk import kept_walk, walk
from torchdoctor._walk.kept import Kept


def _sig(w: Any) -> tuple[Any, ...]:
    entries = [(e.path, e.role, id(e.tensor), id(e.owner), e.key, e.slot, id(e.module), e.module_path,
                e.moved_by_module_to, e.alias_of) for e in w.entries]
    return (entries, [(p, id(m)) for p, m in w.modules], [(p, id(m)) for p, m in w.roots],
            [(p, id(m)) for p, m in w.detached], sorted(map(repr, w.types)), len(w.hooks), len(w.hooked),
            len(w.patches), sorted(w.holders), [p.message for p in w.problems], dict(w.module_paths))


class Cfg:
    def __init__(self) -> None:
        self.hidden = 4
        self.labels = {0: "a", 1: "b"}
        self.plan = {"x": (["h"], ["o"])}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = Cfg()
        self.names = ["a", "b"]
        self.block = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
        self.block[0].config = self.config  # shared, as transformers layers share the model's config
        self.head = nn.Linear(2, 2, bias=False)
        self.register_buffer("table", torch.arange(3.0), persistent=False)


class Other(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))


def _quant_like(m: Net) -> None:
    m.head.weight.quant_state = Cfg()
    m.head.weight.quant_state.absmax = torch.ones(1)


def _del_key(m: Net) -> None:  # a dict key replaced, its values unchanged
    labels = m.config.labels
    v = labels.pop(1)
    labels[torch.zeros(1)] = v  # type: ignore[index]


def _swap(m: Net) -> None:  # both tensors stay alive: only their slots tell
    m.head.weight, m.block[0].weight = m.block[0].weight, m.head.weight


CHANGES: dict[str, Callable[[Net], None]] = {
    "a tensor attribute": lambda m: setattr(m.block[1], "extra", torch.zeros(2)),
    "a parameter replaced": lambda m: setattr(m.head, "weight", nn.Parameter(torch.zeros(2, 2))),
    "a buffer registered": lambda m: m.block[0].register_buffer("scale", torch.ones(1)),
    "a buffer set to None": lambda m: setattr(m, "table", None),
    "a tensor in the config": lambda m: setattr(m.config, "table", torch.zeros(1)),
    "a tensor in the config's dict": lambda m: m.config.labels.__setitem__(0, torch.zeros(1)),
    "a tensor as a dict key": _del_key,
    "a tensor in a plan's inner list": lambda m: m.config.plan["x"][0].append(torch.zeros(1)),
    "a tensor in a list of names": lambda m: m.names.append(torch.zeros(1)),
    "a forward hook": lambda m: m.head.register_forward_hook(lambda *a: None),
    "hooks both ways": lambda m: (m.head.register_forward_hook(lambda *a: None),
                                  m.head.register_forward_pre_hook(lambda *a: None)),
    "an accelerate-style hook attribute": lambda m: setattr(m.head, "_hf_hook", object()),
    "a submodule added": lambda m: m.block.append(nn.Linear(2, 2)),
    "a submodule replaced": lambda m: setattr(m, "head", nn.Linear(2, 2)),
    "a tied weight": lambda m: setattr(m.head, "weight", m.block[0].weight),
    "two weights swapped": _swap,
    "a tensor's own attribute": _quant_like,
    "a forward replaced by another module's": lambda m: setattr(m.head, "forward", Other().forward),
    "a module held outside the tree": lambda m: setattr(m, "helper", [Other()]),
    "a config replaced": lambda m: setattr(m, "config", Cfg()),
    "the config's dict replaced": lambda m: setattr(m.config, "__dict__", {"w": torch.ones(1)}),
    "an int attribute made a tensor": lambda m: setattr(m.config, "hidden", torch.ones(1)),
    "a class swapped": lambda m: setattr(m.block[1], "__class__", type("Norm2", (nn.LayerNorm,), {})),
    "nothing": lambda m: None,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_kept_walk_is_what_a_new_walk_finds_after(change: str) -> None:
    m = Net()
    first = kept_walk(m, walk)
    assert _sig(first) == _sig(walk(m))
    kept = Kept.prime(m, walk(m))
    assert kept is not None, "a plain tree with a config, plans and names is kept"
    CHANGES[change](m)
    again = kept.read(m)
    fresh = walk(m)
    if again is not None:
        assert _sig(again) == _sig(fresh)
    assert _sig(kept_walk(m, walk)) == _sig(fresh)
    if change == "nothing":
        assert again is not None


def test_scans_between_changes_equal_scans_of_a_copy_never_kept() -> None:
    m = Net()
    for change in CHANGES.values():
        torchdoctor.scan(m)  # keeps the walk
        change(m)
        got = torchdoctor.scan(m)
        want = torchdoctor.scan(m, device="cpu")  # ... the same walk, asked differently
        assert got.to_dict()["tensors"] == want.to_dict()["tensors"]
        assert [e.path for e in walk(m).entries] == [t.path for t in got.tensors]


def test_a_kept_walk_never_keeps_a_model_alive_and_a_new_model_at_its_address_is_walked() -> None:
    from torchdoctor._walk import kept as kept_module

    m = Net()
    kept_walk(m, walk)
    kept_walk(m, walk)
    key = id(m)
    assert type(kept_module._KEPT[key]) is Kept
    ref = __import__("weakref").ref(m)
    del m
    gc.collect()
    assert ref() is None
    assert key not in kept_module._KEPT  # its config and plans are let go with it
    n = Net()
    n.head.extra = torch.zeros(1)
    assert _sig(kept_walk(n, walk)) == _sig(walk(n))


def test_an_unchanged_transformers_model_is_reused_and_equal() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1)
    model = LlamaForCausalLM(cfg)
    kept = Kept.prime(model, walk(model))
    assert kept is not None, "a transformers model (config, generation config, plans) is kept"
    again = kept.read(model)
    assert again is not None and _sig(again) == _sig(walk(model))
    model.model.layers[0].mlp.up_proj.weight.data = model.model.layers[0].mlp.up_proj.weight.data.half()
    again = kept.read(model)  # the same tensor in its slot: the walk is the same, scan reads its new dtype
    assert again is not None
    assert torchdoctor.scan(model).to_dict() == torchdoctor.scan(model).to_dict()
    assert [p.path for p in torchdoctor.scan(model).problems] == ["model.layers.0.mlp.up_proj.weight"]


def test_a_single_layer_gains_hooks_and_its_walk_is_read_again() -> None:
    m = nn.Linear(2, 2)
    kept = Kept.prime(m, walk(m))
    assert kept is not None and kept.read(m) is not None
    m.register_forward_pre_hook(lambda *a: None)
    m.register_forward_hook(lambda *a: None)
    assert kept.read(m) is None
    assert _sig(kept_walk(m, walk)) == _sig(walk(m)) and walk(m).hooked


def test_a_tree_that_cannot_be_kept_is_walked_each_time_and_kept_once_it_can() -> None:
    from torchdoctor._walk import kept as kept_module

    m = Net()
    m.block[0].act = lambda x: x  # a function: it may gain a closure later, so identity cannot vouch for it
    assert Kept.prime(m, walk(m)) is None
    for i in range(kept_module._RETRY + 2):
        if i == 3:
            m.block[0].act.extra = torch.ones(1)  # type: ignore[attr-defined]  # not walked: a function's dict
            m.block[1].extra = torch.zeros(1)
        assert _sig(kept_walk(m, walk)) == _sig(walk(m))
    del m.block[0].act, m.block[1].extra
    for _ in range(kept_module._RETRY + 2):
        assert _sig(kept_walk(m, walk)) == _sig(walk(m))
    assert type(kept_module._KEPT[id(m)]) is Kept


def test_a_tree_is_kept_from_its_second_walk_on() -> None:
    from torchdoctor._walk import kept as kept_module

    m = Net()
    kept_walk(m, walk)
    assert type(kept_module._KEPT[id(m)]) is tuple  # a tree scanned once never pays for priming
    kept_walk(m, walk)
    k = kept_module._KEPT[id(m)]
    assert type(k) is Kept
    assert _sig(kept_walk(m, walk)) == _sig(walk(m)) and kept_module._KEPT[id(m)] is k


def test_an_attribute_renamed_in_a_plain_object_keeps_the_walk_and_its_answer() -> None:
    m = Net()
    kept = Kept.prime(m, walk(m))
    assert kept is not None
    d = m.config.__dict__  # the same values in the same order, one under another name: no tensor either way
    items = list(d.items())
    d.clear()
    d.update(("width" if k == "hidden" else k, v) for k, v in items)
    again = kept.read(m)
    assert again is not None and _sig(again) == _sig(walk(m))

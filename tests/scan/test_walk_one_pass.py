"""The walker reads parameters, buffers and module attributes in one pass over the modules and trusts a class's key set
only when an instance has exactly those keys (issue 28's speed work): what it finds must not depend on either."""

from __future__ import annotations

import torch
from torch import nn

from torchdoctor._walk import walk


class Holder:
    def __init__(self, t: torch.Tensor | None) -> None:
        self.t = t
        self.note = "x"


def test_an_instance_with_as_many_keys_as_its_class_but_another_one_is_walked():
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    walk(m)  # the class's key set is remembered
    del m[1].in_features  # same number of keys, one of them new
    m[1].__dict__["stash"] = torch.ones(3)
    paths = [(e.path, e.role) for e in walk(m).entries]
    assert ("1.stash", "attribute") in paths and ("0.stash", "attribute") not in paths


def test_an_object_shared_by_modules_keeps_its_alias_paths():
    shared, empty = Holder(torch.zeros(2)), Holder(None)
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    for layer in m:
        layer.cfg = shared  # holds a tensor: every later path is an alias
        layer.meta = empty  # holds none: nothing at any path
    w = walk(m)
    rows = [(e.path, e.alias_of) for e in w.entries if "cfg" in e.path or "meta" in e.path]
    assert rows == [("0.cfg.t", None), ("1.cfg.t", "0.cfg.t"), ("2.cfg.t", "0.cfg.t")]
    assert not w.problems


def test_a_module_reached_twice_has_its_attributes_once_and_its_tensors_at_both_paths():
    inner = nn.Linear(2, 2)
    inner.extra = torch.ones(1)
    m = nn.Sequential(inner, nn.Sequential(inner))
    w = walk(m)
    paths = [(e.path, e.alias_of) for e in w.entries]
    assert ("0.weight", None) in paths and ("1.0.weight", "0.weight") in paths
    assert [p for p, _ in paths if p.endswith("extra")] == ["0.extra"]
    assert [p for p, _ in w.modules] == ["", "0", "1"]


def test_a_forward_set_on_the_instance_by_another_module_walks_that_module_after_the_tree():
    net, target = nn.Linear(2, 2), nn.Linear(2, 2)
    net.lora_down = torch.ones(2)
    target.forward = net.forward  # sd-scripts' LoRA network replaces the forward
    target.later = torch.zeros(1)
    w = walk(nn.Sequential(target))
    assert [(e.path, e.role) for e in w.entries] == [
        ("0.weight", "parameter"), ("0.bias", "parameter"), ("0.later", "attribute"),
        ("0.forward.__self__.weight", "parameter"), ("0.forward.__self__.bias", "parameter"),
        ("0.forward.__self__.lora_down", "attribute")]  # as before the one-pass walker (9209a9f)
    assert [(p, q) for p, _, q in w.patches] == [("0", "0.forward.__self__")]


def test_new_entry_sets_every_slot_as_the_class_call_does() -> None:
    # new_entry is the walker's hot-path copy of Entry.__init__: a slot added to one and not the other fails here
    import torch

    from torchdoctor._walk.entry import Entry, new_entry

    lin = torch.nn.Linear(2, 2)
    args = ("w.weight", "parameter", lin.weight, lin, "weight", "param", lin, "w", True)
    a, b = Entry(*args), new_entry(*args)
    for name in Entry.__slots__:
        assert getattr(a, name) is getattr(b, name), name

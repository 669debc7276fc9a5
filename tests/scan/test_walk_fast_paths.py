"""The walker's shortcuts (issue 43's speed work) must never change what it finds: an empty builtin container counted
without a record, an object whose values are all plain skipped in one pass, plans of tuples of lists proved at C
speed, a module's dicts read by subscript once its class's key set matched, torch.compile's wrapper pushed apart, a
tensor's plain flags and a config's dicts of plain values proved in place."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor
from torchdoctor._walk import walk


def _paths(obj: object) -> list[tuple[str, str, str | None]]:
    return [(e.path, e.role, e.alias_of) for e in walk(obj).entries]


class _Lying(dict):  # type: ignore[type-arg]
    """A dict that says it is empty: the walker reads it through dict's own methods, never its ``__len__``."""

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False


def test_an_empty_container_shared_by_two_modules_is_read_again_once_it_holds_a_tensor() -> None:
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    shared: list[torch.Tensor] = []
    m[0].keep, m[1].keep = shared, shared
    m[0].plan, m[0].names = {}, set()
    assert [p for p, _, _ in _paths(m) if "keep" in p] == []
    shared.append(torch.ones(3))  # the same list object, no longer empty: nothing about it was remembered
    assert [x for x in _paths(m) if "keep" in x[0]] == [("0.keep.0", "container", None),
                                                         ("1.keep.0", "container", "0.keep.0")]


def test_a_dict_subclass_that_claims_to_be_empty_is_read_by_its_items() -> None:
    m = nn.Linear(2, 2)
    m.cache = _Lying(w=torch.zeros(2))
    assert ("cache.w", "container", None) in _paths(m)


def test_an_object_of_plain_values_gains_a_tensor_and_it_is_found() -> None:
    class Config:
        def __init__(self) -> None:
            self.hidden = 4
            self.name = "x"
            self.dtype = torch.float32

    m = nn.Linear(2, 2)
    m.config = Config()
    assert [p for p, _, _ in _paths(m) if p.startswith("config")] == []
    m.config.table = torch.arange(3.0)
    assert ("config.table", "attribute", None) in _paths(m)


def test_a_plan_of_tuples_of_lists_is_proved_and_a_tensor_inside_one_is_found() -> None:
    m = nn.Linear(2, 2)
    m._pp_plan = {"embed": (["input_ids"], ["inputs_embeds"]), "norm": (["hidden"], ["hidden"])}
    assert [p for p, _, _ in _paths(m) if p.startswith("_pp_plan")] == []
    m._pp_plan["norm"] = (["hidden"], [torch.ones(1)])
    assert ("_pp_plan.norm.1.0", "container", None) in _paths(m)


def test_a_module_missing_one_of_its_dicts_is_walked_beside_one_that_has_it() -> None:
    m = nn.Sequential(nn.BatchNorm1d(2), nn.BatchNorm1d(2))
    walk(m)  # the class's key set, with _buffers, is remembered
    del m[1].__dict__["_buffers"]  # this instance's keys differ: its own key set decides what is read
    paths = [p for p, _, _ in _paths(m)]
    assert paths == ["0.weight", "0.bias", "1.weight", "1.bias", "0.running_mean", "0.running_var",
                     "0.num_batches_tracked"]


def test_a_compiled_model_keeps_the_model_s_paths_and_the_same_report() -> None:
    m = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
    m[1].weight.data = m[1].weight.data.double()
    plain = torchdoctor.scan(m)
    compiled = torch.compile(m)
    assert [p for p, _, _ in _paths(compiled)] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    report = torchdoctor.scan(compiled)
    assert [(p.kind, p.path) for p in report.problems] == [(p.kind, p.path) for p in plain.problems] == [
        ("dtype", "1.weight")]


def test_a_list_of_plain_values_among_a_module_s_attributes_is_read_again_once_it_holds_a_tensor() -> None:
    m = nn.Sequential(nn.Conv2d(2, 2, 3), nn.Conv2d(2, 2, 3))  # convs keep tuples of ints (kernel_size, stride, ...)
    sizes = [3, 3]
    m[0].sizes, m[1].also = sizes, sizes  # the same list at two modules
    assert [p for p, _, _ in _paths(m) if "sizes" in p or "also" in p] == []
    sizes.append(torch.zeros(1))
    assert [x for x in _paths(m) if "sizes" in x[0] or "also" in x[0]] == [("0.sizes.2", "container", None),
                                                                            ("1.also.2", "container", "0.sizes.2")]


def test_a_buffer_with_flag_attributes_is_skipped_and_one_with_a_tensor_attribute_is_read() -> None:
    m = nn.Linear(2, 2)
    m.register_buffer("freq", torch.ones(2))
    m.freq.persistent, m.freq._is_buffer = False, True  # transformers 5 tags its buffers so: plain flags only
    m.weight.tag = "w"
    assert _paths(m) == [("weight", "parameter", None), ("bias", "parameter", None), ("freq", "buffer", None)]
    m.freq.scale = torch.zeros(1)  # an attribute that is a tensor beside the flags
    m.weight.absmax = torch.zeros(1)
    assert _paths(m)[3:] == [("weight.absmax", "attribute", None), ("freq.scale", "attribute", None)]


def test_a_config_s_dicts_of_plain_values_are_proved_and_one_that_gains_a_tensor_is_read() -> None:
    class Config:
        def __init__(self) -> None:
            self.hidden = 4
            self.id2label = {0: "a", 1: "b"}
            self.rope = {"theta": 1e4, "kind": ("default", [1, 2])}

    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    m[0].config = m[1].config = Config()
    assert [p for p, _, _ in _paths(m) if "config" in p] == []
    m[0].config.id2label[2] = torch.ones(1)  # the same dict, no longer plain: nothing about it was remembered
    assert [x for x in _paths(m) if "config" in x[0]] == [("0.config.id2label.2", "container", None),
                                                          ("1.config.id2label.2", "container", "0.config.id2label.2")]

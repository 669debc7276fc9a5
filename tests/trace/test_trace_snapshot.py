"""The lean read (``_trace.snapshot.Shape``) against the walk it replaces, on every zoo model and bitsandbytes:
after each step of a session that casts, moves to meta, writes slots by hand, adds and removes modules,
attributes and tensors in config objects, the snapshot a trace takes equals a fresh walk's — the same paths,
the same tensors, devices and dtypes, the same objects by scope, the same modules."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from support import zoo
from torchdoctor._trace.snapshot import Shape, full, snapshot

# zoo models whose walk holds only what Module.to sees: the lean read must serve them (else it is never tested)
LEAN = {"llama", "mistral", "qwen2", "gpt2", "bert", "t5", "unet", "vae", "flux"}


def _same(got: Any, want: Any) -> None:
    snap, objects, modules = got
    wsnap, wobjects, wmodules = want
    assert list(snap) == list(wsnap)  # the order too: records follow it
    for p, v in wsnap.items():
        g = snap[p]
        assert g[0] is v[0] and g[1:] == v[1:], p
    assert objects.keys() == wobjects.keys()
    for k, (scope, ref) in wobjects.items():
        assert objects[k][0] == scope
        assert (objects[k][1] is None) == (ref is None) and (ref is None or objects[k][1]() is ref())
    assert modules.keys() == wmodules.keys()


def _first_module(obj: Any) -> nn.Module:
    return obj if isinstance(obj, nn.Module) else next(v for v in vars(obj).values() if isinstance(v, nn.Module))


def _steps(obj: Any) -> list[Any]:
    m = _first_module(obj)
    leaf = next(x for x in m.modules() if isinstance(x, nn.Linear) or isinstance(x, nn.Conv2d))
    holder = next((x for x in m.modules() if "config" in vars(x)), leaf)

    def slot_write() -> None:
        leaf._parameters["weight"] = nn.Parameter(leaf.weight.detach().to(torch.float64))

    def config_tensor() -> None:
        cfg = vars(holder).setdefault("config", type("Cfg", (), {})())
        vars(cfg)["table"] = torch.ones(2)

    def config_tensor_gone() -> None:
        vars(vars(holder)["config"]).pop("table", None)

    return [
        lambda: m.to(torch.bfloat16),
        slot_write,
        lambda: leaf.register_buffer("extra", torch.zeros(3)),
        lambda: m.to(torch.float32),
        lambda: vars(leaf).__setitem__("backup", torch.ones(2)),
        lambda: leaf._modules.__setitem__("added", nn.Linear(2, 2)),
        lambda: m.to("meta"),
        lambda: leaf._modules.pop("added"),
        lambda: vars(leaf).pop("backup"),
        lambda: leaf._buffers.pop("extra"),
        config_tensor,  # last: a tensor in an attribute object makes the model walked from then on
        lambda: m.to(torch.float16),
        config_tensor_gone,
    ]


@pytest.mark.parametrize("name", zoo.NAMES)
def test_lean_read_equals_the_walk_after_every_step(name: str) -> None:
    obj = zoo.build(name).obj
    shapes: dict[tuple[int, str], Shape | None] = {}
    _same(snapshot(obj, "", shapes), full(obj, "")[0])
    lean = shapes.get((id(obj), "")) is not None
    if name in LEAN:
        assert lean, f"{name}: the lean read never serves this model"
    for step in _steps(obj):
        step()
        _same(snapshot(obj, "", shapes), full(obj, "")[0])


def test_bitsandbytes_quant_state_goes_to_the_walk_and_stays_equal() -> None:
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    layer = bnb.nn.Linear4bit(64, 128, compute_dtype=torch.bfloat16, quant_type="nf4")
    layer.load_state_dict(nn.Linear(64, 128).state_dict())
    model = nn.Sequential(layer, nn.Linear(128, 4)).to("cpu")  # quantizes: weight.quant_state appears
    shapes: dict[tuple[int, str], Shape | None] = {}
    _same(snapshot(model, "", shapes), full(model, "")[0])
    assert shapes[(id(model), "")] is None  # a tensor with tensors of its own: always walked
    qs = model[0].weight.quant_state
    qs.absmax = qs.absmax.to("meta")
    _same(snapshot(model, "", shapes), full(model, "")[0])


def test_a_plain_model_becomes_walked_when_a_weight_gains_a_quant_state() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    shapes: dict[tuple[int, str], Shape | None] = {}
    snapshot(m, "", shapes)
    assert shapes[(id(m), "")] is not None
    m[0].weight.quant_state = type("QS", (), {})()  # type: ignore[attr-defined]
    vars(m[0].weight.quant_state)["absmax"] = torch.ones(4)
    got = snapshot(m, "", shapes)
    _same(got, full(m, "")[0])
    assert "0.weight.quant_state.absmax" in got[0]


def _nested_steps(obj: Any) -> list[Any]:
    """Changes inside attribute objects a flat read proves tensor-free by identity (``flat.Proof``)."""
    m = _first_module(obj)
    holder = next((x for x in m.modules() if "config" in vars(x)), None)
    if holder is None:
        holder = m
        vars(m)["config"] = type("Cfg", (), {})()
    cfg = vars(holder)["config"]

    def nested_list() -> None:
        vars(cfg)["td_list"] = [1, 2.0, "x"]

    def tensor_into_list() -> None:
        vars(cfg)["td_list"].append(torch.ones(1))  # same list, same config: only its contents changed

    def tensor_out_of_list() -> None:
        vars(cfg)["td_list"].pop()

    def tensor_into_nested_dict() -> None:
        vars(cfg).setdefault("td_dict", {})["inner"] = {"t": torch.zeros(2)}

    def nested_dict_gone() -> None:
        vars(cfg).pop("td_dict")

    def config_replaced() -> None:
        clone = type(cfg).__new__(type(cfg))
        vars(clone).update(vars(cfg))
        vars(clone)["td_extra"] = (torch.ones(3),)
        vars(holder)["config"] = clone

    return [lambda: m.to(torch.bfloat16), nested_list, lambda: m.to(torch.float32), tensor_into_list,
            lambda: m.to(torch.float16), tensor_out_of_list, tensor_into_nested_dict, nested_dict_gone,
            lambda: m.to(torch.float32), config_replaced, lambda: m.to(torch.bfloat16)]


@pytest.mark.parametrize("name", sorted(LEAN))
def test_flat_read_equals_the_walk_and_serves(name: str) -> None:
    """The flat read (``flat.Flat``), primed by the slot-by-slot read, gives the walk's snapshot or steps aside
    (None) after every step, plain or nested in an attribute object; and it serves an untied plain model."""
    obj = zoo.build(name).obj
    shapes: dict[tuple[int, str], Shape | None] = {}
    snapshot(obj, "", shapes)
    shape = shapes[(id(obj), "")]
    assert shape is not None
    served = 0
    for step in [lambda: None] + _steps(obj)[:4] + _nested_steps(obj):
        step()
        want = full(obj, "")[0]
        flat = shape.flat
        got = flat.read(shape.objects, shape.modules) if flat is not None and shape.target() is obj else None
        if got is not None:
            served += 1
            _same(got, want)
        slow = shape._read() if shape.target() is obj else None  # the slot-by-slot read it stands in for
        if slow is not None:
            _same(slow, want)
        _same(snapshot(obj, "", shapes), want)
        shape = shapes[(id(obj), "")] or shape
    tied = len({id(p) for p in _first_module(obj).parameters()}) != len(list(_first_module(obj).named_parameters(remove_duplicate=False)))
    if not tied:
        assert served >= 3, f"{name}: the flat read served {served} reads"


def test_flat_read_is_used_and_sees_a_slot_write_and_a_swap() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    shapes: dict[tuple[int, str], Shape | None] = {}
    snapshot(m, "", shapes)
    snapshot(m, "", shapes)
    shape = shapes[(id(m), "")]
    assert shape is not None and shape.flat is not None
    m[0]._parameters["weight"] = nn.Parameter(m[0].weight.detach().double())  # a slot write no patch sees
    got = shape.flat.read(shape.objects, shape.modules)
    assert got is not None and got[0]["0.weight"][3] == torch.float64
    torch.utils.swap_tensors(m[1].bias, nn.Parameter(torch.zeros(2, dtype=torch.float16)))
    got = shape.flat.read(shape.objects, shape.modules)
    assert got is not None and got[0]["1.bias"][3] == torch.float16
    vars(m[1])["scale"] = torch.ones(1)  # a new key: the flat read steps aside
    assert shape.flat.read(shape.objects, shape.modules) is None
    _same(snapshot(m, "", shapes), full(m, "")[0])


def test_a_tensor_put_into_a_config_right_after_priming_is_seen() -> None:
    """The flat read proves the attribute objects when it is primed (with the walk, at a trace's start): a tensor put
    into a config before the first read must still send the read to the walk, which finds it."""
    obj = zoo.build("llama").obj
    shapes: dict[tuple[int, str], Shape | None] = {}
    snapshot(obj, "", shapes)
    shape = shapes[(id(obj), "")]
    assert shape is not None and shape.flat is not None and shape.flat.proof is not None  # proved when primed
    vars(obj.config)["td_table"] = [torch.ones(2)]
    assert shape.flat.read(shape.objects, shape.modules) is None
    got = snapshot(obj, "", shapes)
    _same(got, full(obj, "")[0])
    assert "config.td_table.0" in got[0]

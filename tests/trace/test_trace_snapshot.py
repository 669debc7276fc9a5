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

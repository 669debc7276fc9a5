"""A cast-only ``move`` of a module tree of plain tensors is verified by re-reading the slots its plan walked
(``Expect``'s lean check, issue 28) instead of walking again: it must say "done" exactly where the fresh walk and a
fresh plan say so, and hand everything else to the fresh plan. The cyclic GC is paused during a move and comes back
as it was, whatever happens."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from support import zoo
from torch import nn
from torch.overrides import TorchFunctionMode

from torchdoctor import PlacementError
from torchdoctor._move.apply import move
from torchdoctor._move.plan import build
from torchdoctor._walk import walk

BF16, F32 = torch.bfloat16, torch.float32


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=16)).eval()


def _with_attribute() -> nn.Module:
    m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2, bias=False))
    m.scale = torch.ones(4)  # a plain tensor attribute of a module: re-read from its __dict__
    m.register_buffer("cache", torch.zeros(3), persistent=False)
    m.register_buffer("ids", torch.arange(3))
    return m


class Passing(TorchFunctionMode):
    """A torch function mode that runs every function as it is (as torch.device("cuda") contexts do)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


LEAN = {"gpt2-tied": _gpt2, "llama": zoo.tiny_llama, "unet": zoo.tiny_unet, "attribute": _with_attribute}


def _lean(obj: Any, dtype: torch.dtype = BF16) -> Any:
    expect = build(obj, None, dtype, True).expect
    assert expect is not None and expect.tree is not None, "a tree of plain tensors is checked without a walk"
    return expect


def _both(expect: Any, obj: Any) -> tuple[bool, bool]:
    """(the lean check, the same Expect checked by a fresh walk)."""
    return expect.holds(obj), expect._walk(obj)


@pytest.mark.parametrize("name", sorted(LEAN))
def test_lean_check_agrees_with_the_walk_and_the_fresh_plan(name: str) -> None:
    obj = LEAN[name]()
    expect = _lean(obj)
    assert _both(expect, obj) == (False, False)  # nothing cast yet
    move(obj, dtype=BF16)
    assert _both(expect, obj) == (True, True) and not build(obj, None, BF16, True).public()
    floats = [e.path for e in walk(obj).entries if e.alias_of is None and e.tensor.is_floating_point()]
    for path in floats[:: max(1, len(floats) // 8)]:  # a write that did not land, one path at a time
        other = LEAN[name]()
        expect = _lean(other)
        move(other, dtype=BF16)
        e = next(x for x in walk(other).entries if x.path == path)
        if isinstance(e.tensor, nn.Parameter):
            e.tensor.data = e.tensor.data.to(F32 if e.tensor.dtype != F32 else torch.float64)
        else:
            setattr(e.owner, e.key, e.tensor.to(F32 if e.tensor.dtype != F32 else torch.float64)) \
                if e.slot == "attr" else e.owner._buffers.__setitem__(e.key, e.tensor.to(
                    F32 if e.tensor.dtype != F32 else torch.float64))  # a buffer move keeps float32: still off
        assert _both(expect, other) == (False, False), path
        assert build(other, None, BF16, True).public(), path


def test_a_tie_that_came_apart_is_not_done() -> None:
    m = _gpt2()
    expect = _lean(m)
    move(m, dtype=BF16)
    assert m.lm_head.weight is m.transformer.wte.weight
    m.lm_head.weight = nn.Parameter(m.transformer.wte.weight.detach().clone())  # same dtype, another object
    assert _both(expect, m) == (False, False)


def test_added_or_replaced_tensors_are_not_done() -> None:
    m = _with_attribute()
    expect = _lean(m)
    move(m, dtype=BF16)
    assert expect.holds(m)
    m[0].extra = torch.zeros(2, dtype=BF16)  # a path the plan never saw
    assert _both(expect, m) == (False, False)
    del m[0].extra
    m[2].register_buffer("late", torch.zeros(2, dtype=BF16))  # a buffer slot the plan never saw
    assert _both(expect, m) == (False, False)
    del m[2]._buffers["late"]
    assert expect.holds(m)
    m.scale = nn.Parameter(m.scale)  # another class at a planned slot (a tensor attribute becomes a parameter)
    assert _both(expect, m) == (False, False)


def test_other_shapes_of_object_are_checked_by_walking() -> None:
    m = nn.Sequential(nn.Linear(2, 2))
    m.table = {"a": torch.zeros(2)}  # a container: the walk decides
    assert build(m, None, BF16, True).expect.tree is None
    m = nn.Sequential(nn.Linear(2, 2))
    m.blocks = [nn.Linear(2, 2)]  # a module outside _modules
    assert build(m, None, BF16, True).expect.tree is None
    assert build({"m": nn.Linear(2, 2)}, None, BF16, True).expect.tree is None  # the root is not a module
    m = nn.Linear(2, 2)
    with Passing():  # a mode's Python runs inside every cast
        assert build(m, None, BF16, True).expect.tree is None


def test_a_cast_under_a_mode_is_verified_by_the_walk() -> None:
    m = _with_attribute()
    with Passing():
        move(m, dtype=BF16)
    assert m[0].weight.dtype == BF16 and m.scale.dtype == BF16 and m.ids.dtype == torch.int64


@pytest.mark.parametrize("enabled", [True, False])
def test_the_gc_comes_back_as_it_was(enabled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        seen = []
        real = build

        def spying(*args: Any, **kwargs: Any) -> Any:
            seen.append(gc.isenabled())
            return real(*args, **kwargs)

        monkeypatch.setattr("torchdoctor._move.apply.build", spying)
        move(nn.Linear(2, 2), dtype=BF16)
        assert seen == [False] and gc.isenabled() is enabled
        with pytest.raises(PlacementError):  # a refused move (meta to cpu) leaves it as it was too
            move(nn.Linear(2, 2, device="meta"), device="cpu")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()

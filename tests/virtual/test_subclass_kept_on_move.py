"""A tensor or ``Parameter`` subclass that carries its own attributes keeps its class and attributes through a move to
a virtual device, as it does on the machine: a library's subclass whose ``__torch_function__`` re-wraps what torch
gives back (diffusers' ``GGUFParameter`` and its ``quant_type``) is re-wrapped by its own code, and a ``Parameter``
subclass that ``Module.to`` moves stays the object's class with its attributes (torch assigns ``.data`` on the
device). Before, the run's move gave a plain virtual tensor: the GGUF weight lost ``quant_type``, the library read its
raw bytes as weights, and a legal program died in the run ("The size of tensor a (68) must match ...")."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn as nn

import torchdoctor
from torchdoctor._virtual.tensor import VirtualTensor


class Packed(nn.Parameter):
    """A quantized weight as GGUF-style libraries write one: bytes, a ``kind`` set in ``__new__``, and a
    ``__torch_function__`` that wraps every result in its own class again with that ``kind``."""

    def __new__(cls, data: torch.Tensor, requires_grad: bool = False, kind: str | None = None) -> "Packed":
        self = torch.Tensor._make_subclass(cls, data, requires_grad)
        self.kind = kind
        return self

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = super().__torch_function__(func, types, args, kwargs or {})
        kind = next((a.kind for a in args if isinstance(a, Packed)), None)
        return cls(out, kind=kind) if isinstance(out, torch.Tensor) else out


def unpack(w: torch.Tensor) -> torch.Tensor:
    """Reads the attribute as the library does: without it the bytes would be taken as the weight (wrong shape)."""
    if getattr(w, "kind", None) != "halves":
        return w
    raw = w.as_subclass(torch.Tensor) if not isinstance(w, VirtualTensor) else torch.Tensor._make_subclass(torch.Tensor, w)
    return raw[:, : raw.shape[1] // 2].float()


class PackedLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, unpack(self.weight).to(x.dtype))


class Tagged(nn.Parameter):
    """A user's own Parameter subclass (no ``__torch_function__`` of its own) with an attribute the program reads."""


def test_a_subclass_with_its_own_torch_function_is_rewrapped_by_its_class_on_the_move() -> None:
    p = Packed(torch.ones(4, 8), kind="halves")
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as run:
        for moved in (p.to("cuda"), p.cuda(), p.to("cuda", torch.float16)):
            assert isinstance(moved, Packed) and isinstance(moved, VirtualTensor)
            assert moved.kind == "halves" and moved.device.type == "cuda"
            assert tuple(unpack(moved).shape) == (4, 4)
        back = p.to("cuda").to("cpu")
        assert isinstance(back, Packed) and back.kind == "halves" and back.device.type == "cpu"
    assert run.problems == []


def test_a_packed_layer_moved_by_module_to_runs_to_its_end() -> None:
    layer = PackedLinear(4, 4, bias=False)
    layer.weight = Packed(torch.ones(4, 8), kind="halves")
    layer.weight.note = "the program's"
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as run:
        layer.to("cuda")
        y = layer(torch.ones(2, 4, device="cuda"))
        w = layer.weight
        assert isinstance(w, Packed) and w.kind == "halves" and w.note == "the program's"
        assert y.device.type == "cuda" and tuple(y.shape) == (2, 4)
    assert run.problems == []


def test_a_users_parameter_subclass_keeps_its_class_and_attributes_through_module_to() -> None:
    """On the machine ``Module.to`` assigns ``param.data``: the object, its class and attributes, stay; a round trip
    to the cpu and a cast keep them too, and an attribute set on the device is there after it."""
    layer = nn.Linear(2, 2)
    layer.weight = Tagged(layer.weight.detach().clone())
    layer.weight.scale = 0.5
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as run:
        layer.to("cuda")
        assert isinstance(layer.weight, Tagged) and layer.weight.scale == 0.5 and layer.weight.is_cuda
        layer.weight.scale = 0.25
        y = layer(torch.ones(1, 2, device="cuda")) * layer.weight.scale
        layer.to("cpu")
        assert isinstance(layer.weight, Tagged) and layer.weight.scale == 0.25 and layer.weight.device.type == "cpu"
        layer.to("cuda", torch.float16)
        assert isinstance(layer.weight, Tagged) and layer.weight.scale == 0.25 and layer.weight.dtype == torch.float16
    assert y.device.type == "cuda" and run.problems == []


def test_a_plain_parameter_subclass_moved_by_hand_gives_a_plain_tensor_as_torch_does() -> None:
    """``Parameter``'s ``__torch_function__`` is disabled: ``p.to(...)`` is a plain tensor on the machine too."""
    p = Tagged(torch.ones(3))
    p.scale = 2.0
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False):
        moved = p.to("cuda")
        assert not isinstance(moved, Tagged) and not hasattr(moved, "scale") and moved.is_cuda


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="diffusers' GGUF support needs the gguf package")
def test_diffusers_gguf_parameter_keeps_quant_type_on_virtual_cuda() -> None:
    import gguf
    import numpy as np
    from diffusers.quantizers.gguf.utils import GGUFLinear, GGUFParameter, dequantize_gguf_tensor

    qt = gguf.GGMLQuantizationType.Q8_0
    q = gguf.quants.quantize(np.ones((64, 64), np.float32), qt)
    p = GGUFParameter(torch.from_numpy(q), quant_type=qt)
    layer = GGUFLinear(64, 64, bias=False, compute_dtype=torch.float32)
    layer.weight = GGUFParameter(torch.from_numpy(q), quant_type=qt)
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as run:
        moved = p.to("cuda")
        assert isinstance(moved, GGUFParameter) and moved.quant_type == qt
        assert tuple(dequantize_gguf_tensor(moved).shape) == (64, 64)
        layer.to("cuda")
        y = layer(torch.ones(2, 64, device="cuda"))
        assert isinstance(layer.weight, GGUFParameter) and layer.weight.quant_type == qt
    assert tuple(y.shape) == (2, 64) and run.problems == []


def test_tied_weights_moved_by_module_to_stay_one_parameter_and_the_program_goes_on() -> None:
    """An embedding and a head holding one Parameter: the run's own stand-in for the moved one (``Moved``) is not a
    program's subclass to keep (that recursed in ``state_dict()``'s detach); the two stay one object."""
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as run:
        m = nn.ModuleDict({"emb": emb, "head": head}).to("cuda")
        assert m["emb"].weight is m["head"].weight and type(m["head"].weight).__name__ == "VirtualParameter"
        assert len(m.state_dict()) == 2
        y = m["head"](m["emb"](torch.tensor([[1, 2]], device="cuda")))
    assert y.device.type == "cuda" and run.problems == []

"""A weight tied between two modules (an LM's embedding and head) moved by ``Module.to`` in a virtual run: ``_apply``
meets the same Parameter twice, the second time as the run's own replaced one. It must stay one tied tensor on the
device, as on the machine, for a plain Parameter and for a program's own Parameter subclass with attributes."""

from __future__ import annotations

import torch

import torchdoctor


class Tagged(torch.nn.Parameter):
    """A program's own Parameter subclass carrying an attribute (as quantized-weight classes do)."""


def _tied(param_cls: type = torch.nn.Parameter) -> torch.nn.ModuleDict:
    emb = torch.nn.Embedding(10, 4)
    if param_cls is not torch.nn.Parameter:
        emb.weight = param_cls(emb.weight.detach().clone())
        emb.weight.tag = "kept"
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    return torch.nn.ModuleDict({"emb": emb, "head": head})


def test_tied_weight_moved_to_a_virtual_device_stays_tied() -> None:
    with torchdoctor.virtual_devices("cuda") as vd:
        m = _tied().to("cuda")
        sd = m.state_dict()
        assert list(sd) == ["emb.weight", "head.weight"]
        assert m["emb"].weight is m["head"].weight
        assert str(m["head"].weight.device) == "cuda:0"
        out = m["head"](m["emb"](torch.tensor([1, 2], device="cuda")))
        assert tuple(out.shape) == (2, 10) and str(out.device) == "cuda:0"
        back = m.to("cpu")
        assert back["emb"].weight.device.type == "cpu" and back["head"].weight.device.type == "cpu"
    assert not vd.problems, [str(p) for p in vd.problems]


def test_tied_parameter_subclass_keeps_class_attribute_and_tie() -> None:
    with torchdoctor.virtual_devices("cuda") as vd:
        m = _tied(Tagged).to("cuda")
        w = m["head"].weight
        assert w is m["emb"].weight
        assert isinstance(w, Tagged) and w.tag == "kept" and str(w.device) == "cuda:0"
        assert len(m.state_dict()) == 2
    assert not vd.problems, [str(p) for p in vd.problems]

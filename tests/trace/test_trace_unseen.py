"""Changes made where the trace's patches cannot see: direct ``_parameters``/``_buffers``/``_modules`` slot
writes, ``torch.utils.swap_tensors``, tensors hanging off tensors (``weight.quant_state``) and off plain objects,
modules added or removed by hand, weights untied. They are found by comparing what the traced object holds with
what the trace saw last, so a trace that re-reads less (its lean snapshot) must still find every one of them:
each test states the exact records, and each fails if the re-read misses its change."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

import torchdoctor

UNSEEN = "(code the trace did not see)"


class Holder:
    """A plain object holding tensors (what bitsandbytes' QuantState is to its weight)."""

    def __init__(self, **tensors: torch.Tensor) -> None:
        self.__dict__.update(tensors)


class Config:
    """A config-like object a module keeps (transformers keeps one on most modules): no tensors, until one is put."""

    def __init__(self) -> None:
        self.hidden = 4
        self.names = ["fc", "norm"]
        self.extra: dict[str, Any] = {}


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(OrderedDict(fc=nn.Linear(4, 4), norm=nn.LayerNorm(4)))
    m.fc.config = Config()  # type: ignore[assignment]
    m.norm.config = m.fc.config  # type: ignore[assignment]
    return m


def _recs(t: torchdoctor.trace) -> list[tuple[Any, ...]]:
    return [(r.path, r.kind, r.from_dtype, r.to_dtype, r.from_device, r.to_device, r.call, r.via) for r in t.records]


def _warm(t: torchdoctor.trace, m: nn.Module) -> None:
    """Two traced calls first, so that whatever the trace keeps between calls is in place."""
    m.to(torch.float16)
    m.to(torch.float32)


def test_direct_parameter_slot_write_between_calls() -> None:
    m = _model()
    with torchdoctor.trace(m) as t:
        _warm(t, m)
        m.fc._parameters["weight"] = nn.Parameter(m.fc.weight.detach().to(torch.float64))
        m.to(torch.float32)
    assert _recs(t)[8:] == [
        ("fc.weight", "move", "float32", "float64", "cpu", "cpu", UNSEEN, "snapshot"),
        ("fc.weight", "move", "float64", "float32", "cpu", "cpu", "to()", "Module.to"),
    ]


def test_direct_slot_write_inside_a_traced_call_is_that_calls() -> None:
    class Loader(nn.Linear):
        def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
            self._parameters["weight"] = nn.Parameter(state_dict[prefix + "weight"].clone())  # no setattr, no .data
            self._buffers["scale"] = state_dict[prefix + "scale"].clone()

    m = nn.Sequential(Loader(4, 4))
    m[0].register_buffer("scale", torch.ones(2))
    sd = {"0.weight": torch.zeros(4, 4, dtype=torch.float16), "0.bias": torch.zeros(4),
          "0.scale": torch.ones(2, device="meta")}
    with torchdoctor.trace(m) as t:
        _warm(t, m)
        m.load_state_dict(sd)
    assert _recs(t)[6:] == [
        ("0.weight", "move", "float32", "float16", "cpu", "cpu", "load_state_dict()", "Module.load_state_dict"),
        ("0.scale", "move", "float32", "float32", "cpu", "meta", "load_state_dict()", "Module.load_state_dict"),
    ]


def test_swap_tensors_between_calls_keeps_the_identity_and_changes_the_placement() -> None:
    m = _model()
    with torchdoctor.trace(m) as t:
        _warm(t, m)
        w = m.fc.weight
        torch.utils.swap_tensors(w, nn.Parameter(torch.zeros(4, 4, dtype=torch.bfloat16)))
        assert m.fc.weight is w
    assert _recs(t)[8:] == [("fc.weight", "move", "float32", "bfloat16", "cpu", "cpu", UNSEEN, "snapshot")]


def test_tensor_attached_state_and_a_plain_object_attribute_are_re_read() -> None:
    m = _model()
    m.fc.weight.quant_state = Holder(absmax=torch.ones(4), code=torch.ones(2))  # type: ignore[attr-defined]
    with torchdoctor.trace(m) as t:
        _warm(t, m)
        qs = m.fc.weight.quant_state  # type: ignore[attr-defined]
        qs.absmax = qs.absmax.to("meta")  # QuantState.to does this in place
        m.to(torch.float16)
    recs = _recs(t)
    assert ("fc.weight.quant_state.absmax", "move", "float32", "float32", "cpu", "meta", UNSEEN, "snapshot") in recs
    assert not any(r[0].startswith("fc.weight.quant_state") and r[6] == "to()" for r in recs)  # Module.to skips them


def test_quant_state_put_on_a_weight_between_calls_then_moved() -> None:
    m = _model()
    with torchdoctor.trace(m) as t:
        _warm(t, m)
        m.fc.weight.quant_state = Holder(absmax=torch.ones(4))  # type: ignore[attr-defined]
        m.to(torch.float16)  # the attribute appears here; Module.to does not move it
        qs = m.fc.weight.quant_state  # type: ignore[attr-defined]
        qs.absmax = qs.absmax.to(torch.bfloat16)
        m.to(torch.float32)
    assert ("fc.weight.quant_state.absmax", "move", "float32", "bfloat16", "cpu", "cpu", UNSEEN, "snapshot") in _recs(t)


def test_a_tensor_put_in_a_config_object_between_calls_is_seen_when_it_changes() -> None:
    m = _model()
    with torchdoctor.trace(m) as t:
        _warm(t, m)
        m.fc.config.extra["table"] = torch.ones(3)  # type: ignore[union-attr]
        m.to(torch.float16)
        m.fc.config.extra["table"] = torch.ones(3, dtype=torch.float64)  # type: ignore[union-attr]
        m.to(torch.float32)
    assert ("fc.config.extra.table", "move", "float32", "float64", "cpu", "cpu", UNSEEN, "snapshot") in _recs(t)


def test_plain_tensor_attribute_of_a_module_replaced_through_its_dict() -> None:
    m = _model()
    m.norm.__dict__["cache"] = torch.ones(2)
    with torchdoctor.trace(m) as t:
        _warm(t, m)
        m.norm.__dict__["cache"] = torch.ones(2, device="meta")
        m.to(torch.float16)
    assert _recs(t)[8:9] == [("norm.cache", "move", "float32", "float32", "cpu", "meta", UNSEEN, "snapshot")]
    assert not any(r[0] == "norm.cache" and r[6] == "to()" for r in _recs(t))


def test_a_module_added_by_hand_between_calls_is_moved_by_the_next_call() -> None:
    m = _model()
    with torchdoctor.trace(m) as t:
        _warm(t, m)
        m._modules["head"] = nn.Linear(4, 2)  # no add_module, no setattr
        m.to(torch.float16)
        del m._modules["head"]
        m.to(torch.float32)
    head = [r for r in _recs(t) if r[0].startswith("head.")]
    assert head == [("head.weight", "move", "float32", "float16", "cpu", "cpu", "to()", "Module.to"),
                    ("head.bias", "move", "float32", "float16", "cpu", "cpu", "to()", "Module.to")]


def test_a_module_replaced_by_hand_and_a_buffer_slot_written() -> None:
    m = _model()
    m.register_buffer("steps", torch.zeros(3))
    with torchdoctor.trace(m) as t:
        _warm(t, m)
        m._modules["norm"] = nn.LayerNorm(4, dtype=torch.float64)
        m._buffers["steps"] = torch.zeros(3, dtype=torch.float16)
        m.to(torch.float32)
    assert _recs(t)[10:] == [
        ("norm.weight", "move", "float32", "float64", "cpu", "cpu", UNSEEN, "snapshot"),
        ("norm.bias", "move", "float32", "float64", "cpu", "cpu", UNSEEN, "snapshot"),
        ("steps", "move", "float32", "float16", "cpu", "cpu", UNSEEN, "snapshot"),
        ("norm.weight", "move", "float64", "float32", "cpu", "cpu", "to()", "Module.to"),
        ("norm.bias", "move", "float64", "float32", "cpu", "cpu", "to()", "Module.to"),
        ("steps", "move", "float16", "float32", "cpu", "cpu", "to()", "Module.to"),
    ]


def test_untying_a_tied_weight_by_hand_makes_a_second_path() -> None:
    m = nn.Sequential(OrderedDict(emb=nn.Embedding(8, 4), head=nn.Linear(4, 8, bias=False)))
    m.head.weight = m.emb.weight
    with torchdoctor.trace(m) as t:
        _warm(t, m)
        m.head._parameters["weight"] = nn.Parameter(m.emb.weight.detach().clone())
        m.to(torch.float16)
        m.head._parameters["weight"] = nn.Parameter(m.head.weight.detach().to(torch.float64))
        m.to(torch.float32)
    assert [r for r in _recs(t) if r[0] == "head.weight"] == [
        ("head.weight", "move", "float32", "float16", "cpu", "cpu", "to()", "Module.to"),
        ("head.weight", "move", "float16", "float64", "cpu", "cpu", UNSEEN, "snapshot"),
        ("head.weight", "move", "float64", "float32", "cpu", "cpu", "to()", "Module.to"),
    ]


def test_the_same_records_as_a_fresh_trace_on_a_changed_model_after_many_calls() -> None:
    """A long traced session whose model changes shape between calls records what one trace per step records."""
    m = _model()
    steps = [
        lambda: m.to(torch.float16),
        lambda: m.fc.register_buffer("b2", torch.ones(1)),
        lambda: m.to(torch.float32),
        lambda: m._modules.__setitem__("extra", nn.Linear(2, 2)),
        lambda: m.to(torch.bfloat16),
        lambda: m.fc._buffers.__setitem__("b2", None),
        lambda: m.to(torch.float32),
    ]
    with torchdoctor.trace(m) as t:
        for step in steps:
            step()
    paths = [(r[0], r[3]) for r in _recs(t)]
    assert ("fc.b2", "bfloat16") in paths and ("extra.weight", "bfloat16") in paths
    assert ("fc.b2", "float32") in paths and paths.count(("fc.b2", "float32")) == 1  # None after the bf16 cast


def test_a_tensor_attribute_added_through_the_dict_between_calls() -> None:
    m = _model()
    with torchdoctor.trace(m) as t:
        _warm(t, m)
        m.fc.__dict__["backup"] = torch.ones(2)  # SD.Next keeps weight backups as plain attributes
        m.to(torch.float16)  # Module.to does not move it
        m.fc.__dict__["backup"] = torch.ones(2, device="meta")
        m.to(torch.float32)
    assert ("fc.backup", "move", "float32", "float32", "cpu", "meta", UNSEEN, "snapshot") in _recs(t)


def test_torch_swap_mode_and_swap_tensors_work_under_a_trace_and_after_it() -> None:
    """``Module.to`` swaps tensors in torch's swap mode (and always for wrapper subclasses): swap_tensors refuses a
    tensor with a weak reference, so a trace holding one broke the user's program."""
    m = _model()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with torchdoctor.trace(m) as t:
            w = m.fc.weight
            m.to(torch.float16)
            assert m.fc.weight is w and w.dtype == torch.float16
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert [(r[0], r[3], r[6]) for r in _recs(t)][:2] == [("fc.weight", "float16", "to()"), ("fc.bias", "float16", "to()")]
    torch.utils.swap_tensors(m.fc.weight, nn.Parameter(torch.zeros(4, 4)))  # the trace object is still alive here


def test_a_replaced_tensor_is_freed_during_the_trace() -> None:
    import gc
    import weakref

    m = _model()
    m.register_buffer("steps", torch.zeros(3))
    with torchdoctor.trace(m) as t:
        old = weakref.ref(m.steps)
        m.to(torch.float16)  # a buffer is replaced by a new tensor (a parameter keeps its object)
        gc.collect()
        assert old() is None, "the trace keeps a replaced tensor alive"
        assert t.history("steps")[0].to_dtype == "float16"

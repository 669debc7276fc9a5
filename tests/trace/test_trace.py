"""trace on plain torch: every way a tensor changes device or dtype, the records' fields and outputs, patches
removed on exit, thread safety and the read-only invariant."""

from __future__ import annotations

import functools
import json
import logging
import sys
import threading
from collections import OrderedDict

import pytest
import torch
from torch import nn

import torchdoctor
from support.helpers import assert_unchanged
from torchdoctor._trace import active, note_for
from torchdoctor._trace.patches import patched

HERE = __file__


def _next_line() -> int:
    """The line after the caller's: ``L = _next_line()`` then the call on the next line."""
    return sys._getframe(1).f_lineno + 1


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(fc=nn.Linear(4, 4), norm=nn.LayerNorm(4)))


def _originals() -> dict[str, object]:
    return {
        "Module.to": nn.Module.__dict__["to"], "Module._apply": nn.Module.__dict__["_apply"],
        "Module.__setattr__": nn.Module.__dict__["__setattr__"], "Module.half": nn.Module.__dict__["half"],
        "Module.load_state_dict": nn.Module.__dict__["load_state_dict"],
        "Tensor.data": torch.Tensor.__dict__.get("data"),
    }


def test_module_moves_are_attributed_to_the_call_and_the_line() -> None:
    m = _model()
    with torchdoctor.trace(m) as t:
        line = _next_line()
        m.half()
        m.to(torch.float32)
    recs = t.history("fc.weight")
    assert [(r.from_dtype, r.to_dtype, r.call) for r in recs] == [("float32", "float16", "half()"),
                                                                  ("float16", "float32", "to()")]
    first = recs[0]
    assert (first.file, first.line, first.kind, first.qualname, first.via) == (HERE, line, "move", "Sequential.half",
                                                                              "Module.half")
    assert first.from_device == first.to_device == "cpu" and first.shape == (4, 4)
    assert {r.path for r in t.records} == {"fc.weight", "fc.bias", "norm.weight", "norm.bias"}
    assert t.who_moved("fc.bias").call == "to()"


def test_data_assignment_parameter_and_buffer_replacement_and_meta_moves() -> None:
    m = _model()
    m.register_buffer("scale", torch.ones(2))
    with torchdoctor.trace(m) as t:
        l_data = _next_line()
        m.fc.bias.data = m.fc.bias.data.to(torch.bfloat16)
        l_param = _next_line()
        m.norm.weight = nn.Parameter(torch.ones(4, dtype=torch.float64))
        l_buf = _next_line()
        m.scale = torch.ones(2, device="meta")
        l_sub = _next_line()
        m.fc = nn.Linear(4, 4, dtype=torch.float16)
    got = {(r.path, r.kind, r.to_dtype, r.to_device, r.line) for r in t.records}
    assert got == {
        ("fc.bias", "move", "bfloat16", "cpu", l_data),
        ("norm.weight", "move", "float64", "cpu", l_param),
        ("scale", "move", "float32", "meta", l_buf),
        ("fc.weight", "move", "float16", "cpu", l_sub),
        ("fc.bias", "move", "float16", "cpu", l_sub),
    }
    data = t.history("fc.bias")[0]
    assert (data.call, data.from_dtype) == (".data =", "float32")


def test_load_state_dict_assign_and_a_new_submodule_is_an_add() -> None:
    m = _model()
    sd = {k: v.to(torch.float16) for k, v in m.state_dict().items()}
    with torchdoctor.trace(m) as t:
        line = _next_line()
        m.load_state_dict(sd, assign=True)
        m.extra = nn.Linear(2, 2)
    moved = [r for r in t.records if r.line == line]
    assert {r.path for r in moved} == {"fc.weight", "fc.bias", "norm.weight", "norm.bias"}
    assert {(r.call, r.to_dtype) for r in moved} == {("load_state_dict()", "float16")}
    assert {(r.path, r.kind) for r in t.records if r.path.startswith("extra")} == {("extra.weight", "add"),
                                                                                   ("extra.bias", "add")}


def test_a_move_inside_a_library_call_is_the_library_call_of_the_users_line() -> None:
    m = _model()

    def helper_in_torch_namespace(module: nn.Module) -> None:  # user code: its own line is the user's line
        module.to(torch.bfloat16)

    with torchdoctor.trace(m) as t:
        line = _next_line()
        m.norm.apply(functools.partial(nn.Module.to, dtype=torch.float16))  # torch calls .to, not this file
        helper_in_torch_namespace(m.fc)
    norm = t.history("norm.weight")[0]
    assert (norm.call, norm.qualname, norm.line, norm.via) == ("apply()", "LayerNorm.apply", line, "Module.to")
    fc = t.history("fc.weight")[0]
    assert fc.call == "to()" and fc.line == helper_in_torch_namespace.__code__.co_firstlineno + 1


def test_logging_and_json_lines(tmp_path, caplog) -> None:
    m = _model()
    out = tmp_path / "moves.jsonl"
    with caplog.at_level(logging.INFO, logger="torchdoctor.trace"):
        with torchdoctor.trace(m, file=out):
            line = _next_line()
            m.to(torch.float16)
    lines = [r.getMessage() for r in caplog.records if r.name == "torchdoctor.trace"]
    assert len(lines) == 4
    assert "fc.weight: float32@cpu -> float16@cpu by Sequential.to() at " in lines[0]
    assert lines[0].endswith(f"test_trace.py:{line}")
    docs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(docs) == 4 and docs[0]["schema"] == "torchdoctor/trace/1"
    assert (docs[0]["path"], docs[0]["from"], docs[0]["to"], docs[0]["call"], docs[0]["line"]) == (
        "fc.weight", {"device": "cpu", "dtype": "float32"}, {"device": "cpu", "dtype": "float16"}, "to()", line)


def test_selection_moves_and_lora_only_filter_the_output(tmp_path) -> None:
    m = _model()
    out = tmp_path / "x.jsonl"
    with torchdoctor.trace(m, moves=False, lora=True, file=out) as t:
        m.to(torch.float16)
    assert len(t.records) == 4 and out.read_text() == ""  # recorded, not selected


def test_patches_exist_only_while_a_trace_is_active_also_after_an_exception() -> None:
    before = _originals()
    assert patched() == [] and not active()
    m = _model()
    with pytest.raises(ZeroDivisionError):
        with torchdoctor.trace(m):
            assert active()
            during = _originals()
            assert all(during[k] is not before[k] for k in before), "nothing was patched"
            assert isinstance(torch.Tensor.__dict__.get("data"), property)
            m.half()
            1 / 0
    assert _originals() == before and patched() == [] and not active()
    assert "data" not in torch.Tensor.__dict__


def test_nested_and_concurrent_traces_keep_patches_until_the_last_exits() -> None:
    before = _originals()
    a, b = _model(), _model()
    with torchdoctor.trace(a) as ta:
        with torchdoctor.trace(b) as tb:
            a.half()
        assert active() and nn.Module.__dict__["to"] is not before["Module.to"]
        b.half()
    assert _originals() == before
    assert len(ta.records) == 4 and tb.records == ()  # each trace sees its own object only


def test_decorator_form_accumulates_records() -> None:
    m = _model()
    tr = torchdoctor.trace(m)

    @tr
    def flip(dtype: torch.dtype) -> None:
        m.to(dtype)

    flip(torch.float16)
    assert not active()
    flip(torch.float32)
    assert [r.to_dtype for r in tr.history("fc.weight")] == ["float16", "float32"]


def test_thread_safe_moves_in_two_threads_each_with_its_own_call() -> None:
    models = [_model() for _ in range(4)]
    root = nn.ModuleList(models)
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def work(i: int) -> None:
        try:
            barrier.wait()
            for _ in range(5):
                models[i].to(torch.float16)
                models[i].to(torch.float32)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with torchdoctor.trace(root) as t:
        threads = [threading.Thread(target=work, args=(i,), name=f"w{i}") for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
    assert not errors
    assert len(t.records) == 4 * 5 * 2 * 4
    for i in range(4):
        recs = t.history(f"{i}.fc.weight")
        assert [r.to_dtype for r in recs] == ["float16", "float32"] * 5
        assert {r.thread for r in recs} == {f"w{i}"}
    assert patched() == []


def test_trace_is_read_only_and_records_nothing_on_a_forward() -> None:
    m = _model()
    x = torch.randn(2, 4)

    def run() -> torchdoctor.trace:
        with torchdoctor.trace(m) as t:
            with torch.no_grad():
                m(x)
        return t

    t = assert_unchanged(m, run)
    assert t.records == ()


def test_note_for_and_active_follow_the_trace() -> None:
    m = _model()
    with torchdoctor.trace(m):
        line = _next_line()
        m.fc.bias.data = m.fc.bias.data.double()
        note = note_for(m.fc.bias)
        assert note == f"float64 since `.data =` at {note_for_path_file()}:{line}"
        assert note_for("fc.bias") == note and note_for("bias") == note  # a path suffix finds it too
        assert note_for(m.fc.weight) is None
        line = _next_line()
        m.norm.weight = nn.Parameter(m.norm.weight.to("meta"))
        assert note_for(m.norm.weight) == f"on meta since `.weight =` at {note_for_path_file()}:{line}"
    assert note_for("fc.bias") is None and not active()


def note_for_path_file() -> str:
    from torchdoctor._trace.record import short_file

    return short_file(HERE)


def test_untraced_objects_and_bad_arguments() -> None:
    m, other = _model(), _model()
    with torchdoctor.trace(m) as t:
        other.half()
    assert t.records == ()
    with pytest.raises(TypeError, match="needs the object whose tensors to watch"):
        torchdoctor.trace("model")
    with pytest.raises(TypeError, match="a tensor path"):
        t.history(3)  # type: ignore[arg-type]


def test_trace_everything_adopts_each_module_moved() -> None:
    with torchdoctor.trace() as t:
        m = _model()  # built inside: no records for construction
        m.half()
        pair = nn.ModuleDict({"m": m})
        pair.to(torch.float32)  # the container swallows the root adopted before it
    roots = [r.root for r in t.records]
    assert roots[:4] == ["Sequential"] * 4 and roots[4:] == ["ModuleDict"] * 4
    assert [r.path for r in t.records[4:]][:1] == ["m.fc.weight"]

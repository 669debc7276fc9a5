"""Every tensor form the walker meets is one entry with its path (or an ``unsupported`` problem), in every place
it can hide; the verbs answer with a report or a clear error, never a crash from inside torch."""

from __future__ import annotations

import collections
import functools
import socket
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._move.plan import plan
from torchdoctor._walk import set_tensor, walk
from robust.kinds import PLACES, TENSORS, Holder, holder
from support.helpers import assert_unchanged


@pytest.mark.parametrize("kind", sorted(TENSORS))
def test_each_tensor_form_is_one_entry_and_scan_describes_it(kind: str) -> None:
    m, path = holder(kind)
    w = walk(m)
    extra = [e for e in w.entries if not e.path.startswith("lin.")]
    assert [(e.path, e.role) for e in extra] == [(path, "attribute")]  # internals (jagged _values...) hidden
    report = torchdoctor.scan(m)
    row = next(t for t in report.tensors if t.path == path)
    assert row.dtype == m.t.dtype and row.device == torch.device("cpu")
    assert all(isinstance(d, int) for d in row.shape) and row.nbytes > 0
    assert "NestedTensorImpl" not in str(report.to_dict())
    assert not report.truncated


def test_nested_shapes_mark_ragged_dimensions() -> None:
    strided, _ = holder("nested_strided")
    jagged, _ = holder("nested_jagged")
    assert walk(strided).entries[-1].info().shape == (2, -1, 4)
    assert walk(jagged).entries[-1].info().shape == (2, -1, 4)
    assert walk(jagged).entries[-1].info().compact == "f32[2,-1,4]@cpu"


@pytest.mark.parametrize("place", sorted(PLACES))
def test_tensors_are_found_in_every_container_and_can_be_put_back(place: str) -> None:
    m, path = holder("dense", place)
    entries = {e.path: e for e in walk(m).entries}
    assert path in entries, sorted(entries)
    e = entries[path]
    new = torch.zeros(2, 4, dtype=torch.float16)
    if place in ("frozenset",):
        with pytest.raises(TypeError, match="cannot replace"):
            set_tensor(e, new)
        return
    set_tensor(e, new)
    assert path in {x.path for x in walk(m).entries if x.tensor is new}


def test_module_used_as_a_dict_key_and_closures_found_without_running_user_code() -> None:
    class Hostile:
        calls: list[str] = []

        def __hash__(self) -> int:
            Hostile.calls.append("hash")
            return 1

        def __eq__(self, other: object) -> bool:
            Hostile.calls.append("eq")
            return False

        def __iter__(self) -> Any:
            Hostile.calls.append("iter")
            return iter(())

    class HostileSet(set):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            Hostile.calls.append("set-iter")
            return iter(())

    class HostileDeque(collections.deque):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            Hostile.calls.append("deque-iter")
            return iter(())

    m = Holder()
    side = nn.Linear(2, 2)
    m.keys = {side: "x", Hostile(): torch.ones(1)}
    m.s = HostileSet([torch.ones(2), Hostile()])
    m.d = HostileDeque([torch.ones(3)])
    m.fn = functools.partial(lambda a, b: a, torch.ones(4), b=torch.ones(5))
    Hostile.calls.clear()  # building the containers above hashed the keys: only the walk counts
    paths = {e.path for e in walk(m).entries}
    assert {"keys.<key 0>.weight", "keys.<key 0>.bias", "s.0", "d.0", "fn.args.0", "fn.keywords.b"} <= paths
    assert Hostile.calls == []


def test_a_tensor_whose_device_cannot_be_read_is_reported_unsupported_by_path() -> None:
    class Broken(torch.Tensor):
        @property
        def device(self) -> torch.device:  # type: ignore[override]
            raise RuntimeError("no device here")

    m = Holder()
    m.t = torch.ones(2).as_subclass(Broken)
    report = torchdoctor.scan(m)
    assert [(p.kind, p.path) for p in report.problems] == [("unsupported", "t")]
    assert "no device here" in report.problems[0].message
    assert "t" not in {t.path for t in report.tensors}
    assert not walk(m).truncated


def test_an_unsupported_tensor_does_not_mark_the_scan_truncated() -> None:
    class Broken(torch.Tensor):
        @property
        def device(self) -> torch.device:  # type: ignore[override]
            raise RuntimeError("no device here")

    m = Holder()
    m.t = torch.ones(2).as_subclass(Broken)
    assert not torchdoctor.scan(m).truncated


@pytest.mark.parametrize("kind", ["nested_strided", "nested_jagged", "sparse_coo", "sparse_csr", "qint8"])
def test_simulate_reports_forms_it_cannot_stand_in_for_by_path(kind: str) -> None:
    m, _ = holder(kind, "buffer")
    r = assert_unchanged(m, torchdoctor.simulate, m, device="cuda:0")
    assert not r.ok
    assert any("t " in p.message or p.path == "t" for p in r.problems), r.text()
    assert all("NestedIntNode" not in p.message and "doesn't support sizes" not in p.message for p in r.problems)


@pytest.mark.parametrize("kind", sorted(TENSORS))
def test_scan_plan_and_move_answer_for_every_form(kind: str) -> None:
    m, path = holder(kind, "buffer")
    torchdoctor.scan(m, device="cpu", dtype="bfloat16")
    steps = plan(m, dtype="bfloat16")
    assert all(s.path != path or TENSORS[kind]().is_floating_point() for s in steps)
    try:
        torchdoctor.move(m, "cpu", "bfloat16")
    except (torchdoctor.PlacementError, ValueError, TypeError) as exc:
        assert str(exc)


def test_fp8_table_in_bf16_math_is_a_problem_with_the_table_path() -> None:
    class Fp8Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(16, 4)
            self.emb.weight.data = self.emb.weight.data.to(torch.float8_e4m3fn)
            self.scale = nn.Parameter(torch.ones(4, dtype=torch.bfloat16))

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.emb(idx) * self.scale

    m = Fp8Embed()
    r = torchdoctor.simulate(m, (torch.tensor([[1, 2]]),), device="cuda:0")
    assert [(p.kind, p.path) for p in r.problems] == [("dtype", "emb.weight")], r.text()
    assert "float8_e4m3fn" in r.problems[0].found and "Promotion for Float8" in r.problems[0].message


def test_dtensor_is_one_entry_with_its_local_shard_inside(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    dist = pytest.importorskip("torch.distributed")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # the process group's rendezvous, for this test only
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=__import__("datetime").timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (1,))
        m = nn.Linear(4, 4)
        m.weight = nn.Parameter(distribute_tensor(m.weight.detach(), mesh, [Shard(0)]))
        entries = [(e.path, e.role, e.form) for e in walk(m).entries]
        assert entries == [("weight", "parameter", "dtensor"), ("bias", "parameter", "dense"),
                           ("weight._local_tensor", "subclass_inner", "dense")]
        report = torchdoctor.scan(m)
        assert report.ok and {t.path: t.device for t in report.tensors}["weight"] == torch.device("cpu")
        r = torchdoctor.simulate(m, device="cuda:0")
        assert not r.ok and any("weight" in p.message and "DTensor" in p.message for p in r.problems), r.text()
    finally:
        dist.destroy_process_group()

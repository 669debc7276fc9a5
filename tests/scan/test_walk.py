"""The walker on adversarial objects: no crash, no user code run, truncation reported where a bound is hit."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._walk import MAX_DEPTH, MAX_ITEMS, set_tensor, walk
from support.guarded import guarded


def _run_guarded(fn: Any, timeout: float = 120.0) -> Any:
    """A generous hang guard: the walk must finish (speed targets live in bench/)."""
    return guarded(fn, timeout, "walk did not finish")


class Trap(nn.Module):
    """Properties and __getattr__ that must never run."""

    calls: list[str] = []

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    @property
    def boom(self) -> torch.Tensor:
        Trap.calls.append("boom")
        raise RuntimeError("property evaluated")

    @property
    def side_effect(self) -> torch.Tensor:
        Trap.calls.append("side_effect")
        return torch.zeros(1)


class Fabricator:
    """__getattr__ invents attributes; __iter__/__eq__/__hash__ record calls."""

    calls: list[str] = []

    def __init__(self) -> None:
        self.real = torch.ones(2)

    def __getattr__(self, name: str) -> Any:
        Fabricator.calls.append(f"getattr {name}")
        return torch.zeros(1)

    def __iter__(self) -> Any:
        Fabricator.calls.append("iter")
        return iter([torch.zeros(1)])

    def __eq__(self, other: object) -> bool:
        Fabricator.calls.append("eq")
        return False

    def __hash__(self) -> int:
        Fabricator.calls.append("hash")
        return 0


class EvilList(list):
    def __iter__(self) -> Any:
        raise RuntimeError("user __iter__ called")


class EvilDict(dict):
    def items(self) -> Any:
        raise RuntimeError("user items() called")

    def __iter__(self) -> Any:
        raise RuntimeError("user __iter__ called")


def test_properties_getattr_iter_never_called() -> None:
    Trap.calls.clear()
    Fabricator.calls.clear()
    m = Trap()
    m.fab = Fabricator()
    m.evil_list = EvilList([torch.ones(1)])
    m.evil_dict = EvilDict(k=torch.ones(1))
    paths = {e.path for e in walk(m).entries}
    assert {"lin.weight", "lin.bias", "fab.real", "evil_list.0", "evil_dict.k"} <= paths
    assert Trap.calls == [] and Fabricator.calls == []


def test_self_referencing_dict_and_module_cycles() -> None:
    d: dict[str, Any] = {"t": torch.ones(1)}
    d["self"] = d
    m = nn.Sequential(nn.Linear(2, 2))
    m.loop = d
    m[0].back = [m]  # a cycle through a plain list back to the root module
    m.add_module("again", m[0])  # the same module at two paths
    w = _run_guarded(lambda: walk(m))
    paths = {e.path: e for e in w.entries}
    assert paths["again.weight"].alias_of == "0.weight"
    assert "loop.t" in paths
    assert not w.problems


def test_cycle_through_modules_dict_is_cut() -> None:
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    a._modules["b"] = b
    b._modules["a"] = a  # named_modules() would recurse forever here
    w = _run_guarded(lambda: walk(a))
    assert {e.path for e in w.entries} == {"weight", "bias", "b.weight", "b.bias"}


def test_ten_thousand_siblings() -> None:
    m = nn.ModuleList(nn.Linear(1, 1, bias=False) for _ in range(10_000))
    w = _run_guarded(lambda: walk(m))
    assert len(w.entries) == 10_000 and w.entries[-1].path == "9999.weight"


def test_thousand_deep_module_chain() -> None:
    root = cur = nn.Module()
    for _ in range(1000):
        nxt = nn.Module()
        cur.add_module("c", nxt)
        cur = nxt
    cur.register_buffer("leaf", torch.ones(1))
    w = _run_guarded(lambda: walk(root))
    assert [e.path for e in w.entries] == [".".join(["c"] * 1000) + ".leaf"]


def test_deep_plain_nesting_is_truncated() -> None:
    nest: list[Any] = [torch.ones(1)]
    for _ in range(1000):
        nest = [nest]
    m = nn.Module()
    m.nest = nest
    w = _run_guarded(lambda: walk(m))
    assert w.problems and w.problems[0].kind == "truncated"
    assert f"nesting deeper than {MAX_DEPTH}" in w.problems[0].found
    report = torchdoctor.scan(m)
    assert report.truncated and any(p.kind == "truncated" for p in report.problems)


def test_million_element_list_is_truncated() -> None:
    m = nn.Module()
    m.big = [0] * 1_000_000
    m.big[5] = torch.ones(1)
    w = _run_guarded(lambda: walk(m))
    assert any(e.path == "big.5" for e in w.entries)
    assert [p.found for p in w.problems] == [f"more than {MAX_ITEMS} items in one container"]
    report = _run_guarded(lambda: torchdoctor.scan(m))
    assert report.truncated and [(p.kind, p.path) for p in report.problems] == [("truncated", "big")]
    assert report.to_dict()["truncated"] is True


def test_scan_survives_the_big_shapes() -> None:
    siblings = nn.ModuleList(nn.Linear(1, 1, bias=False) for _ in range(10_000))
    siblings[9_999].weight = nn.Parameter(siblings[9_999].weight.to("meta"))
    report = _run_guarded(lambda: torchdoctor.scan(siblings))
    assert [p.path for p in report.problems] == ["9999.weight"] and len(report.tensors) == 10_000
    root = cur = nn.Module()
    for _ in range(1000):
        cur.add_module("c", nn.Module())
        cur = cur.c
    cur.register_buffer("leaf", torch.ones(1, dtype=torch.float64))
    cur.lin = nn.Linear(1, 1)
    for kwargs in ({}, {"dtype": torch.float32}):  # the majority by bytes is float32: the buffer is the odd one
        report = _run_guarded(lambda: torchdoctor.scan(root, **kwargs))
        assert [p.path for p in report.problems] == [".".join(["c"] * 1000) + ".leaf"]


class Slotted:
    """A plain object (no ``__dict__``) with a raising property, a side-effect property and slots."""

    __slots__ = ("weight", "missing")
    calls: list[str] = []

    def __init__(self) -> None:
        self.weight = torch.ones(2)

    @property
    def boom(self) -> torch.Tensor:
        Slotted.calls.append("boom")
        raise RuntimeError("property evaluated")

    @property
    def counter(self) -> torch.Tensor:
        Slotted.calls.append("counter")
        return torch.zeros(1)


def test_plain_object_roots_never_run_properties() -> None:
    Slotted.calls.clear()
    Fabricator.calls.clear()
    obj = {"slotted": Slotted(), "fab": Fabricator(), "evil": EvilDict(t=torch.ones(1))}
    report = torchdoctor.scan(obj, device="cpu", strict=True)
    assert {t.path for t in report.tensors} == {"slotted.weight", "fab.real", "evil.t"}
    assert report.ok and Slotted.calls == [] and Fabricator.calls == []


@dataclasses.dataclass
class State:
    weight: torch.Tensor
    extras: tuple[torch.Tensor, ...]


def test_dataclass_namedtuple_dict_roots() -> None:
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")
    obj = {"state": State(torch.ones(2), (torch.zeros(1),)), "pair": Pair(torch.ones(1), nn.Linear(1, 1))}
    paths = {e.path: e.role for e in walk(obj).entries}
    assert paths == {"state.weight": "attribute", "state.extras.0": "container", "pair.a": "container",
                     "pair.b.weight": "parameter", "pair.b.bias": "parameter"}


def test_meta_model_walks() -> None:
    with torch.device("meta"):
        m = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    entries = walk(m).entries
    assert {e.tensor.device.type for e in entries} == {"meta"} and len(entries) == 4


def test_set_tensor_puts_back_in_every_slot() -> None:
    m = nn.Sequential(nn.BatchNorm1d(2))
    m.attr = torch.ones(1)
    m.items = [torch.ones(1)]
    for e in walk(m).entries:
        set_tensor(e, e.tensor.double() if e.slot != "param" else nn.Parameter(e.tensor.double()))
    assert {e.tensor.dtype for e in walk(m).entries if e.tensor.is_floating_point()} == {torch.float64}


def test_subclass_inner_tensors_via_tensor_flatten() -> None:
    from torch.testing._internal.two_tensor import TwoTensor

    m = nn.Linear(2, 2, bias=False)
    m.weight = nn.Parameter(TwoTensor(torch.ones(2, 2), torch.zeros(2, 2)), requires_grad=False)
    rows = {e.path: e.role for e in walk(m).entries}
    assert rows == {"weight": "parameter", "weight.a": "subclass_inner", "weight.b": "subclass_inner"}


def test_accelerate_offload_roles() -> None:
    from accelerate import cpu_offload

    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    cpu_offload(m, execution_device=torch.device("cpu"))
    report = torchdoctor.scan(m)
    rows = {t.path: t for t in report.tensors}
    assert rows["0.weight"].role == "offloaded" and rows["0.weight"].device.type == "meta"
    copies = [t for t in report.tensors if "weights_map" in t.path]
    assert copies and all(t.device.type == "cpu" and t.role == "offloaded" for t in copies)
    assert report.ok, report.text()


def test_import_is_cheap_and_initialises_no_device() -> None:
    code = textwrap.dedent(
        """
        import sys, torch
        def boom(*a, **k):
            raise AssertionError("device initialised")
        # every way a device gets initialised: the Python lazy-init entry points and the C hooks behind them
        for ns, names in ((torch.cuda, ("_lazy_init", "init")), (getattr(torch, "xpu", None), ("_lazy_init", "init")),
                          (torch._C, ("_cuda_init", "_xpu_init", "_mps_init"))):
            for name in names:
                if ns is not None and hasattr(ns, name):
                    setattr(ns, name, boom)
        import torchdoctor
        heavy = {"rich", "transformers", "diffusers", "bitsandbytes", "peft", "accelerate"}
        assert not heavy & set(sys.modules), sorted(heavy & set(sys.modules))
        m = torch.nn.Sequential(torch.nn.Linear(2, 2))
        m[0].bias.data = m[0].bias.data.double()
        report = torchdoctor.scan(m, device="cpu")
        assert not report.ok and report.text() and report.to_dict()["problems"]
        assert not heavy & set(sys.modules), sorted(heavy & set(sys.modules))
        print("ok", sorted(torchdoctor.__all__) == sorted(set(torchdoctor.__all__)))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok True"


def test_import_without_torch_loaded() -> None:
    out = subprocess.run([sys.executable, "-c", "import sys, torchdoctor; print('torch' in sys.modules)"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_public_names_resolve_and_exceptions_show_public_path() -> None:
    for name in torchdoctor.__all__:
        assert getattr(torchdoctor, name) is not None, name
    assert torchdoctor.PlacementError.__module__ == "torchdoctor"
    assert issubclass(torchdoctor.PlacementError, RuntimeError)
    assert issubclass(torchdoctor.PlacementWarning, UserWarning)


@pytest.mark.parametrize("bad", [object(), 3, "x", None])
def test_atoms_and_strange_roots_do_not_crash(bad: Any) -> None:
    if isinstance(bad, str):
        return  # a string is a checkpoint path for scan; covered in test_checkpoint
    assert walk(bad).entries == []


def test_plans_of_nested_plain_lists_are_proved_tensor_free_and_a_tensor_inside_one_is_still_found() -> None:
    from torchdoctor._walk.kinds import MAPPING, atoms_only

    plan = {"embed_tokens": (["input_ids"], ["inputs_embeds"]), "norm": (["hidden_states"], ["hidden_states"])}
    assert atoms_only(plan, MAPPING, 100)  # a transformers model's _pp_plan: two levels of plain lists
    m = torch.nn.Linear(2, 2)
    m._pp_plan = plan
    m.routes = {"a": (["x"], [torch.ones(3)]), "b": (["y"], ["z"])}  # the same shape, holding a tensor
    assert not atoms_only(m.routes, MAPPING, 100)
    assert not atoms_only({"a": [[["deep"]]]}, MAPPING, 100)  # deeper than two levels: walked, not proved
    paths = [e.path for e in walk(m).entries]
    assert paths == ["weight", "bias", "routes.a.1.0"]

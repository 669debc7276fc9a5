"""Fault injection over every point where ``move`` converts or writes: after each fault, the object equals its
snapshot (identity, dtype, device, values, grads, aliasing) or the error names exactly what differs.

The points are the real operations, patched to raise once (before the operation, or after it landed):
``convert`` (``Tensor.to``: data, storages of views, grads, wrappers' own ``.to``), ``view`` (``Tensor.set_``:
views rebuilt on a moved storage), ``new parameter`` (a Parameter of the same class built for a device change),
``data`` (``.data =`` of a Parameter or a grad), ``grad`` (``.grad =``), ``slot`` (every write into an owner:
parameter and buffer slots, container items, attributes, quant_state and 8-bit state, aliases and tied weights),
``swap`` (``swap_tensors`` for wrapper Parameters) and ``verify`` (the check after the move).
Faults: ``RuntimeError``, ``torch.OutOfMemoryError``, ``KeyboardInterrupt``. Modes: ``auto`` (snapshot holding no
references, so originals nobody holds are rebuilt) and ``exact``; small models run every point, zoo models a sample
of each kind (first, middle, last).
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from support import zoo
from support.helpers import fingerprint
from torch import nn
from torch.testing._internal.two_tensor import TwoTensor

from torchdoctor import PlacementError
from torchdoctor._move import apply as move_apply
from torchdoctor._move import owners as move_owners
from torchdoctor._move import undo as move_undo
from torchdoctor._move.apply import move
from torchdoctor._walk import walk

BF16 = torch.bfloat16


class InjectedError(RuntimeError):
    pass


class InjectedOOM(torch.OutOfMemoryError):
    pass


class InjectedInterrupt(KeyboardInterrupt):
    pass


FAULTS = {"RuntimeError": lambda: InjectedError("injected fault"),
          "OutOfMemoryError": lambda: InjectedOOM("CUDA out of memory. Tried to allocate 2.00 GiB (injected)"),
          "KeyboardInterrupt": lambda: InjectedInterrupt()}


class Injector:
    """Counts the points a move passes; raises ``fault`` at each point in ``at`` (once each)."""

    AFTER = {"convert": False, "view": False, "new parameter": False, "data": True, "grad": True, "slot": True,
             "swap": True, "verify": True}

    def __init__(self) -> None:
        self.armed = False
        self.at: set[int] = set()
        self.fault: Callable[[], BaseException] | None = None
        self.points: list[str] = []
        self.fired = ""

    def hit(self, kind: str, phase: str) -> None:
        if not self.armed:
            return
        self.points.append(f"{kind} {phase}")
        if len(self.points) - 1 in self.at and self.fault is not None:
            self.at.discard(len(self.points) - 1)
            self.fired = self.fired or f"{kind} {phase}"
            raise self.fault()

    def wrap(self, kind: str, real: Callable[..., Any]) -> Callable[..., Any]:
        after = self.AFTER[kind]

        def patched(*args: Any, **kwargs: Any) -> Any:
            self.hit(kind, "before")
            out = real(*args, **kwargs)
            if after:
                self.hit(kind, "after")
            return out

        return patched

    def install(self, mp: pytest.MonkeyPatch) -> None:
        """Patch every point; each patched call counts and may raise."""
        data, grad = torch._C.TensorBase.data, torch._C.TensorBase.grad

        def plain(setter: Any) -> Callable[[torch.Tensor, Any], None]:
            def set_(t: torch.Tensor, v: Any) -> None:
                # the setter now lives in Python: a subclass' __torch_function__ would call it again
                with torch._C.DisableTorchFunctionSubclass():
                    setter(t, v)
            return set_

        set_data, set_grad = self.wrap("data", plain(data.__set__)), self.wrap("grad", plain(grad.__set__))
        mp.setattr(torch.Tensor, "data", property(data.__get__, lambda t, v: set_data(t, v)))
        mp.setattr(torch.Tensor, "grad", property(grad.__get__, lambda t, v: set_grad(t, v)))
        for cls, name, kind in ((torch.Tensor, "to", "convert"), (torch.Tensor, "set_", "view")):
            real = getattr(cls, name)
            wrapped = self.wrap(kind, real)
            mp.setattr(cls, name, lambda t, *a, _w=wrapped, **k: _w(t, *a, **k))
        mp.setattr(move_owners, "new_parameter", self.wrap("new parameter", move_owners.new_parameter))
        mp.setattr(move_owners, "set_tensor", self.wrap("slot", move_owners.set_tensor))
        mp.setattr(move_undo, "set_tensor", self.wrap("slot", move_undo.set_tensor))  # the writes of a rollback
        mp.setattr(torch.utils, "swap_tensors", self.wrap("swap", torch.utils.swap_tensors))
        mp.setattr(move_apply, "_verify", self.wrap("verify", move_apply._verify))

    def run(self, obj: Any, target: dict[str, Any], at: tuple[int, ...] = (),
            fault: Callable[[], BaseException] | None = None) -> BaseException | None:
        """``move(obj, **target)`` with the points patched (only meanwhile: copies and snapshots run unpatched).
        No optimizer is searched for unless ``target`` asks (``optimizer="auto"``): an exact snapshot holds the
        parameters, so the search would walk the whole heap on every run, and it passes no point (the matrix checks
        that a searched run passes the same points)."""
        self.at, self.fault, self.points, self.fired = set(at), fault, [], ""
        with pytest.MonkeyPatch.context() as mp:
            self.install(mp)
            self.armed = True
            try:
                move(obj, **{"optimizer": None, **target})
            except BaseException as exc:  # noqa: B036  KeyboardInterrupt is one of the faults
                return exc
            finally:
                self.armed = False
        return None


# --- what the object is, and what the error claims ------------------------------------------------------------------


@functools.cache
def _norm(path: str) -> str:
    if "[" not in path and "<" not in path:
        return path
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\[['\"](.*?)['\"]\]", r".\1", path)
    return path.replace(".<grad>", ".grad").lstrip(".")


class Snapshot:
    """Fingerprint by path, Parameter ids, and which paths share a storage. ``weak``: hold no reference to the
    object's tensors, so ``rollback="auto"`` meets originals nobody holds (identity is then moot but for Parameters)."""

    def __init__(self, obj: Any, weak: bool) -> None:
        fp = fingerprint(obj, torch_state=False)
        self.records = _records(fp)
        self.params = {id(e.tensor) for e in walk(obj).entries if isinstance(e.tensor, nn.Parameter)}
        self.sharing = _sharing(obj)
        self.weak = weak
        if weak:
            fp.keep = None  # type: ignore[attr-defined]
        self._fp = fp

    def differences(self, obj: Any, lossy: set[str] = frozenset(),  # type: ignore[assignment]
                    named: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
        """What differs from the snapshot, but the values of ``lossy`` paths and anything at ``named`` paths."""
        now = _records(fingerprint(obj, torch_state=False))
        out = []
        for path in sorted(self.records.keys() | now.keys()):
            a, b = self.records.get(path), now.get(path)
            if a == b or path in named:
                continue
            if a is not None and b is not None and a[0] == b[0] == "tensor":
                skip = {12} if path in lossy else set()
                if self.weak and a[2] not in self.params:
                    skip |= {2, 11}  # a rebuilt tensor nobody held: a new object with a new version counter
                if all(x == y for i, (x, y) in enumerate(zip(a, b)) if i not in skip):
                    continue
            out.append(f"{path}: {a} -> {b}")
        before = {(k, g - named) for k, g in self.sharing if len(g - named) > 1}
        if _sharing(obj, named) != before:
            out.append(f"sharing: {sorted(before)} -> {sorted(_sharing(obj, named))}")
        return out


def _records(fp: Any) -> dict[str, Any]:
    """Record by path; an alias record becomes the record it points to (which paths share an object is compared
    by ``_sharing``), so a path that stops being the first to reach an object does not look changed."""
    out: dict[str, Any] = {}
    aliases = []
    for path, rec in fp:
        key, n = _norm(path), 1
        while key in out:
            n += 1
            key = f"{_norm(path)}#{n}"
        if rec[0] == "alias":
            aliases.append((key, _norm(rec[1])))
            rec = out.get(_norm(rec[1]), rec)
        out[key] = rec
    for key, first in aliases:  # what lies under an object (its grad, its attributes) lies under every path to it
        out.update({key + k[len(first):]: r for k, r in list(out.items()) if k.startswith(f"{first}.")})
    return out


def _sharing(obj: Any, named: set[str] = frozenset()) -> set[tuple[str, frozenset[str]]]:  # type: ignore[assignment]
    """Groups of paths holding one object, and groups holding one storage (``named`` paths left out)."""
    groups: dict[tuple[str, int], set[str]] = {}
    for e in walk(obj).entries:
        if e.path in named:
            continue
        t = e.tensor
        groups.setdefault(("object", id(t)), set()).add(e.path)
        if type(t) is not TwoTensor and t.layout == torch.strided:
            groups.setdefault(("storage", int(t.untyped_storage()._cdata)), set()).add(e.path)
    return {(k[0], frozenset(g)) for k, g in groups.items() if len(g) > 1}


def _every_path_of(obj: Any, paths: set[str]) -> set[str]:
    """The named tensors under every path that holds them (an alias is named once), the inner tensors of named
    wrapper subclasses, and their grads."""
    entries = walk(obj).entries
    grads = {p[:-len(".grad")] for p in paths if p.endswith(".grad")}
    named = {id(e.tensor) for e in entries if e.path in paths}
    out = set(paths) | {e.path for e in entries if id(e.tensor) in named}
    out |= {e.path for e in entries if e.slot == "inner" and any(e.path.startswith(f"{p}.") for p in out)}
    of_grads = {id(e.tensor) for e in entries if e.path in grads}
    return out | {f"{p}.grad" for p in out} | {f"{e.path}.grad" for e in entries if id(e.tensor) in of_grads}


def claim(exc: BaseException) -> tuple[str, set[str]]:
    """("same" | "lossy" | "differs", paths): the error's problems, or an interrupt's note (which lists them all)."""
    if isinstance(exc, PlacementError):
        head = str(exc).splitlines()[0]
        lossy = {p.path for p in exc.problems if p.kind == "lost_precision"}
        differs = {p.path for p in exc.problems if p.kind == "not_restored"}
    else:
        head, *rows = "\n".join(getattr(exc, "__notes__", [])).split("\nFix:")[0].splitlines()
        lossy = differs = {r.strip().split("  ")[0] for r in rows}
    if "the object is as before" in head:
        assert not lossy and not differs, head
        return "same", set()
    if "IS half-moved" in head:
        return "differs", differs
    assert "lost precision" in head, head
    return "lossy", lossy


def check(obj: Any, snap: Snapshot, exc: BaseException | None, fault: type, where: str) -> None:
    assert exc is not None, f"{where}: the fault was swallowed and move returned"
    if isinstance(exc, KeyboardInterrupt):
        assert isinstance(exc, InjectedInterrupt), f"{where}: {exc!r}"
    else:
        assert isinstance(exc, PlacementError) and isinstance(exc.__cause__, fault), f"{where}: {exc!r}"
        assert "injected" in str(exc) or "(InjectedError" in str(exc), where
    kind, paths = claim(exc)
    assert kind != "differs", f"{where}: one fault, and rollback could not undo it:\n{exc}"
    diffs = snap.differences(obj, _every_path_of(obj, paths) if kind == "lossy" else set())
    assert not diffs, f"{where}: the error says {kind!r} {sorted(paths)}, but:\n" + "\n".join(diffs[:8])


# --- the matrix ------------------------------------------------------------------------------------------------------


class Hand(nn.Module):
    """Every kind of place ``move`` writes to, small: tied weights, grads, views of one storage, an int buffer,
    list-held modules, dict items, an alias, a wrapper Parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(6, 4)
        self.lin = nn.Linear(4, 4)
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        base = torch.arange(12.0)
        self.register_buffer("base", base)
        self.register_buffer("front", base[:6])
        self.tail = base[6:].view(2, 3)
        self.blocks = [nn.Linear(4, 4)]
        self.table = {"scale": torch.ones(4), "ids": torch.arange(3), "nested": [torch.zeros(2)]}
        self.scale = self.table["scale"]
        self.pair = nn.Linear(2, 2)
        self.pair.weight = nn.Parameter(TwoTensor(torch.randn(2, 2), torch.randn(2, 2)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks[0](self.lin(self.emb(ids))) * self.scale)


def hand() -> nn.Module:
    torch.manual_seed(0)
    m = Hand()
    m(torch.tensor([1, 2, 3])).sum().backward()
    return m


def fresh(template: Any) -> Any:
    """A deep copy with the grads too (``Parameter.__deepcopy__`` drops them), and bitsandbytes' ``weight.module``
    pointing at the copied layer (``Params4bit.__deepcopy__`` keeps the original layer there, which a move reaches)."""
    obj = copy.deepcopy(template)
    if isinstance(template, nn.Module):
        for a, b in zip(template.parameters(), obj.parameters()):
            if a.grad is not None:
                b.grad = a.grad.clone()
        for m in obj.modules():
            w = m.__dict__.get("_parameters", {}).get("weight")
            if w is not None and "module" in w.__dict__:
                w.module = m
    return obj


def llama_with_grads() -> nn.Module:
    m = zoo.tiny_llama()
    m.train()
    m(input_ids=torch.randint(3, 100, (1, 4)), labels=torch.randint(3, 100, (1, 4))).loss.backward()
    return m


def sample(points: list[str], every: bool) -> list[int]:
    if every:
        return list(range(len(points)))
    by: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        by.setdefault(p, []).append(i)
    return sorted({i for idx in by.values() for i in (idx[0], idx[len(idx) // 2], idx[-1])})


ALL = {f"{k} {ph}" for k, after in Injector.AFTER.items() for ph in (("before", "after") if after else ("before",))}
# name: (builder, targets, every point or a sample, the points it must reach)
CASES: dict[str, tuple[Callable[[], Any], list[dict[str, Any]], bool, set[str]]] = {
    "hand": (hand, [dict(dtype=BF16), dict(dtype=torch.float64), dict(device="meta")], True, ALL),
    "bnb4": (zoo.bnb_linear4bit, [dict(device="meta"), dict(device="meta", dtype=BF16)], True,
             {"new parameter before", "slot after"}),
    "bnb8": (zoo.bnb_linear8bit, [dict(device="meta")], True, {"new parameter before", "view before", "slot after"}),
    "bnb8_after_forward": (lambda: zoo.bnb_linear8bit(forward=True), [dict(device="meta", dtype=BF16)], True,
                           {"new parameter before", "view before", "slot after"}),
    "llama_grads": (llama_with_grads, [dict(dtype=BF16), dict(device="meta")], False,
                    {"data after", "grad after", "slot after"}),
    "gpt2_tied": (lambda: zoo.build("gpt2").obj, [dict(dtype=torch.float16)], False, {"data after"}),
    "unet": (zoo.tiny_unet, [dict(device="meta", dtype=BF16)], False, {"slot after", "new parameter before"}),
}


@pytest.mark.parametrize("mode", ["auto", "exact"])
@pytest.mark.parametrize("name", list(CASES))
def test_every_fault_point_rolls_back_to_the_snapshot_or_says_what_differs(name: str, mode: str) -> None:
    make, targets, every, must = CASES[name]
    template = make()
    inj = Injector()
    failures, runs, kinds = [], 0, set()
    for target in targets:
        target = dict(target, rollback=mode)
        clean = fresh(template)
        assert inj.run(clean, target) is None
        points = inj.points
        held = fresh(template)
        keep = Snapshot(held, weak=False)  # holds the parameters: the optimizer search walks the heap, finds none
        assert inj.run(held, dict(target, optimizer="auto")) is None and inj.points == points, keep
        for k, n in enumerate(sample(points, every)):
            # small models: every fault at every point; sampled zoo models: the faults take turns
            for fname, fault in FAULTS.items() if every else [list(FAULTS.items())[k % len(FAULTS)]]:
                obj = fresh(template)
                snap = Snapshot(obj, weak=mode == "auto")
                exc = inj.run(obj, target, (n,), fault)
                where = f"{name} {target} point {n} ({inj.fired}) {fname}"
                kinds.add(inj.fired)
                runs += 1
                try:
                    check(obj, snap, exc, type(fault()), where)
                except AssertionError as err:
                    failures.append(str(err))
    assert not failures, f"{len(failures)} of {runs} faults:\n" + "\n\n".join(failures[:5])
    assert must | {"convert before", "verify before", "verify after"} <= kinds


# --- a second fault while rolling back: the error names exactly what differs ----------------------------------------


@pytest.mark.parametrize("second", ["RuntimeError", "KeyboardInterrupt"])
@pytest.mark.parametrize("target", [dict(dtype=BF16, rollback="exact"), dict(device="meta", rollback="auto")])
def test_a_fault_while_rolling_back_is_reported_as_exactly_what_differs(target: dict[str, Any], second: str) -> None:
    template = hand()
    inj = Injector()
    held = fresh(template)
    keep = Snapshot(held, weak=False)  # searched for optimizers (none) or not: the same points
    assert inj.run(held, dict(target, optimizer="auto")) is None and keep
    searched = inj.points
    assert inj.run(fresh(template), target) is None and inj.points == searched
    first = max(i for i, p in enumerate(inj.points) if p == "convert before")  # the last tensor: much to undo
    assert inj.run(fresh(template), target, (first,), FAULTS["RuntimeError"]) is not None
    undo_points = range(first + 1, len(inj.points))
    assert len(undo_points) > 10
    kinds = []
    for m in undo_points:
        obj = fresh(template)
        snap = Snapshot(obj, weak=False)
        exc = inj.run(obj, target, (first, m), lambda: FAULTS["RuntimeError" if inj.fired == "" else second]())
        assert exc is not None
        kind, paths = claim(exc)
        kinds.append(kind)
        if second == "KeyboardInterrupt":
            assert isinstance(exc, KeyboardInterrupt) and "torchdoctor: move failed" in exc.__notes__[0]
        named = _every_path_of(obj, paths)
        diffs = snap.differences(obj, named, named if kind == "differs" else set())
        assert not diffs, f"point {m} ({inj.points[m]}): the error says {kind} {sorted(paths)}, but:\n" + "\n".join(diffs)
        if kind == "differs":  # and nothing is named that is as before
            for p in paths:
                assert snap.differences(obj, set(), named - _every_path_of(obj, {p})), (m, p, sorted(paths))
    assert "differs" in kinds

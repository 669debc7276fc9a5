"""explain pauses the cyclic GC while it reads a text, and restores it as it was.

A long log makes objects faster than they die, and each full collection walks the caller's whole heap (with torch
and transformers loaded, ~0.2 s): time per MB grew with the input before the pause (issue 28's adversarial row)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

import torchdoctor

LINE = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!\n"


@pytest.fixture
def eager_gc() -> Iterator[list[int]]:
    """Collections started while the fixture is active, with thresholds low enough to start one every few
    allocations."""
    started: list[int] = []

    def cb(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    old = gc.get_threshold()
    was = gc.isenabled()
    gc.enable()
    gc.set_threshold(200, 1, 1)
    gc.callbacks.append(cb)
    try:
        yield started
    finally:
        gc.callbacks.remove(cb)
        gc.set_threshold(*old)
        if not was:
            gc.disable()


def test_no_collection_runs_inside_explain(eager_gc: list[int]) -> None:
    text = LINE * 2000
    torchdoctor.explain(LINE)  # the first call imports what it needs
    # start from empty generation counts: what earlier tests left in them (a full collection already due) is not
    # explain's doing, and made this test depend on the order the suite ran in
    gc.collect()
    before = len(eager_gc)
    report = torchdoctor.explain(text)
    during = eager_gc[before:]
    # at most one young collection (generation 0, or 1 when generation 0 had already run once under these
    # thresholds), as the GC comes back; never the full one that walks the caller's heap
    assert len(during) <= 1 and all(g < 2 for g in during), (before, during)
    assert report and report[0].category == "device_mismatch"
    assert gc.isenabled()
    junk: list[object] = []
    for _ in range(1000):
        junk.append([junk])
    assert len(eager_gc) > before  # the GC runs again afterwards


def test_a_disabled_gc_stays_disabled() -> None:
    gc.disable()
    try:
        assert torchdoctor.explain(LINE)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_explain_leaves_no_cycles_behind() -> None:
    # the pause is safe only because explain's objects die by reference counting
    torchdoctor.explain(LINE)
    gc.collect()
    gc.disable()
    try:
        torchdoctor.explain(LINE * 500 + "RuntimeError: Input type (CUDABFloat16Type) and bias type (CPUBFloat16Type) "
                            "should be the same\n")
        assert gc.collect() == 0
    finally:
        gc.enable()

"""The virtual memory ledger under the garbage collector: a collection that runs while ``Ledger.add`` holds its lock
(creating the weakref allocates, and may collect) calls ``_dropped`` for another tensor on the same thread. With a
plain lock that deadlocked: the full test suite hung there in a Mixtral simulation. The child below makes that
collection happen inside the lock on purpose (a tracked tensor becomes cyclic garbage right after the collection
that precedes the lock), and runs under a timeout, so a regression fails instead of hanging."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import gc, types, torch
    from torchdoctor._rules.presets import preset
    from torchdoctor._virtual.hardware import Ledger

    ledger = Ledger(preset("a100"))
    dev = torch.device("cuda", 0)

    def placed(n):
        return types.SimpleNamespace(_td_device=dev, _td_elem=torch.empty(n), _td_path=None)

    held = {}

    def orphan(phase, info):  # after the first collection inside add: the tracked tensor becomes cyclic garbage
        if phase == "stop" and "t" in held:
            cycle = [held.pop("t")]
            cycle.append(cycle)

    for _ in range(50):
        a = placed(1024)
        ledger.add(a)
        held["t"] = a._td_elem
        del a
        b = placed(8)
        gc.callbacks.append(orphan)
        gc.set_threshold(1)  # every tracked allocation collects: the weakref inside the lock collects the cycle
        try:
            ledger.add(b)
        finally:
            gc.set_threshold(700)
            gc.callbacks.remove(orphan)
        del b
    gc.collect()
    print("allocated", ledger.allocated(0))
""")


def test_a_collection_inside_add_does_not_deadlock() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "allocated 0"


def test_an_ops_tensors_die_by_reference_counting() -> None:
    # each op's unwrap closure called itself through its cell: a cycle that kept the op's tensors alive until the
    # cyclic GC ran (~30k objects a simulation, and the real CPU data of a virtual run)
    import gc
    import weakref

    import torch

    from torchdoctor import virtual_devices

    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        with virtual_devices("cuda:1"):
            x = torch.ones(64, 64, device="cuda:1")
            y = (x * 2).sum()
            elem = weakref.ref(x._td_elem)
            out = weakref.ref(y._td_elem)
            del x, y
            assert elem() is None and out() is None
    finally:
        if was:
            gc.enable()

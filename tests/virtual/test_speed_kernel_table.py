"""The process-wide table of meta-kernel outputs (``_virtual.kernels.TABLE``, issue 43 point 1) changes no answer:
every zoo model simulated with the table cold, warm (filled by an earlier run) and disabled gives the same report,
finding for finding; a warm run meets answers of earlier runs; the table stays within its bound. The disabled run
also decomposes every attention (``_virtual.whole`` off), so the same reports prove the one-op path too."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import zoo

import torchdoctor
from torchdoctor._virtual import kernels
from torchdoctor._virtual import tensor as V
from torchdoctor._virtual import whole
from virtual.test_speed_kernels import counting

BF = torch.bfloat16


def _report(rep: Any, ops: bool = True) -> tuple[Any, ...]:
    return (rep.ok, rep.ops if ops else None, rep.stopped, rep.fix,
            [(p.kind, p.path, p.found, p.expected, p.message, p.op, p.module_path) for p in rep.problems])


@pytest.mark.parametrize("name", zoo.NAMES)
def test_zoo_reports_equal_cold_warm_and_disabled(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "SMALL", 0)  # every tensor a meta twin, as with a real model's weights
    hits = counting(monkeypatch)
    built = zoo.build(name, BF)
    kernels.clear()
    cold = torchdoctor.simulate(built.target(), device="cuda:1", data="meta")
    filled = len(kernels.TABLE)
    cold_hits, hits[0] = hits[0], 0
    warm = torchdoctor.simulate(built.target(), device="cuda:1", data="meta")
    warm_hits, hits[0] = hits[0], 0
    monkeypatch.setattr(kernels, "ENABLED", False)
    monkeypatch.setattr(whole, "ENABLED", False)  # every attention decomposed, as before the one-op path
    off = torchdoctor.simulate(built.target(), device="cuda:1", data="meta")
    assert hits[0] == 0
    assert _report(cold) == _report(warm)
    assert _report(cold, ops=False) == _report(off, ops=False) and cold.ops <= off.ops
    if cold.ops >= 20:
        # answers of the cold run were kept for the process, and the warm run met more of them than the cold
        # one could (the cold run's first op of each shape paid its kernel)
        assert filled > 0 and warm_hits > cold_hits, (filled, cold_hits, warm_hits)


def test_a_second_model_with_the_same_shapes_meets_the_first_ones_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "SMALL", 0)  # every tensor a meta twin: small ones would carry real values, not cached
    hits = counting(monkeypatch)
    ids = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    kernels.clear()
    first = torchdoctor.simulate(zoo.tiny_llama(BF, num_hidden_layers=1), {"input_ids": ids}, device="cuda:1",
                                 data="meta")
    after_first, hits[0] = hits[0], 0
    second = torchdoctor.simulate(zoo.tiny_llama(BF, num_hidden_layers=1, seed=1), {"input_ids": ids},
                                  device="cuda:1", data="meta")
    assert _report(first)[:3] == _report(second)[:3] and first.ok
    # one layer repeats nothing inside a run; the second model (other weights, same shapes) is answered from
    # what the first left in the process-wide table (all but the op that filled the run's own table)
    assert hits[0] > 2 * after_first and hits[0] >= second.ops // 3, (after_first, hits[0], second.ops)


def test_the_table_keeps_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "LIMIT", 40)
    kernels.clear()
    built = zoo.build("llama", BF)
    rep = torchdoctor.simulate(built.target(), device="cuda:1", data="meta")
    assert rep.ops > 40 and 0 < len(kernels.TABLE) <= 40
    again = torchdoctor.simulate(built.target(), device="cuda:1", data="meta")
    assert _report(again) == _report(rep) and len(kernels.TABLE) <= 40


def test_the_oldest_answers_go_first() -> None:
    kernels.clear()
    aten = torch.ops.aten
    keys = []
    for n in range(1, 6):
        x = torch.empty(n, device="meta")
        k = kernels.key(aten.neg.default, [x], {})
        assert k is not None
        kernels.remember(kernels.TABLE, k, aten.neg.default(x))
        keys.append(k)
    old = kernels.LIMIT
    kernels.LIMIT = 5
    try:
        y = torch.empty(9, device="meta")
        k = kernels.key(aten.neg.default, [y], {})
        assert k is not None
        kernels.remember({}, k, aten.neg.default(y))
    finally:
        kernels.LIMIT = old
    assert keys[0] not in kernels.TABLE and keys[1] not in kernels.TABLE
    assert all(k in kernels.TABLE for k in keys[2:]) and k in kernels.TABLE

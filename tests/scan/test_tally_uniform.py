"""``tally``'s C-speed pass for a one-device, one-dtype walk (``_scan.uniform``) fills the policy exactly as the
entry-by-entry loop does: rows, canonical pairs, non-persistent and 16-bit computed buffers, unloaded components,
the summary group and each component's expected device and dtype, on every zoo model in float32 and bfloat16, on
meta, with device=/dtype= asked, tied weights and a model that is not uniform (the loop's own case)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo
from torchdoctor._scan import tally as tally_mod
from torchdoctor._scan.policy import Policy
from torchdoctor._walk import walk


def _state(p: Any) -> tuple[Any, ...]:
    comps = [(c.path, c.device, c.dtype, c.device_rule, c.dtype_rule, c.offload) for c in p.components]
    return (p.rows, [(id(e), row) for e, row in p.canon], sorted(p.nonpersistent), [id(e) for e in p.computed16],
            sorted((c.path, n) for c, n in p.unloaded.values()), p.groups, comps, p.kbit_prepared)


def _both(obj: Any, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> tuple[Any, Any, bool]:
    w = walk(obj)
    used: list[bool] = []
    real = tally_mod.uniform_tally

    def spy(*a: Any) -> Any:
        got = real(*a)
        used.append(got is not None)
        return got

    monkeypatch.setattr(tally_mod, "uniform_tally", spy)
    fast = _state(Policy(w, kw.get("device"), kw.get("dtype"), False, summary=kw.get("summary", True)))
    monkeypatch.setattr(tally_mod, "uniform_tally", lambda *a: None)
    loop = _state(Policy(w, kw.get("device"), kw.get("dtype"), False, summary=kw.get("summary", True)))
    monkeypatch.setattr(tally_mod, "uniform_tally", real)
    return fast, loop, bool(used and used[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zoo_uniform_equals_loop(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    took = 0
    for name in zoo.NAMES:
        obj = zoo.build(name, dtype).obj
        for kw in ({}, {"summary": False, "dtype": torch.float16, "device": torch.device("cpu")}):
            fast, loop, used = _both(obj, monkeypatch, **kw)
            assert fast == loop, (name, kw)
            took += used
    assert took >= 30  # the C-speed pass ran on most of the zoo (one-module models in one dtype)


def test_meta_tied_and_nonpersistent_16bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A meta-built model with a tied weight (an alias row) and a bf16 non-persistent buffer: the summary group
    counts the canonical tensors once, the unloaded component holds every parameter, the buffer is a computed one."""
    with torch.device("meta"):
        m = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16, bias=False)).to(torch.bfloat16)
    m[1].weight = m[0].weight
    m.register_buffer("inv_freq", torch.ones(4, dtype=torch.bfloat16, device="meta"), persistent=False)
    fast, loop, used = _both(m, monkeypatch)
    assert used and fast == loop
    rows, canon, nonpersistent, computed16, unloaded, groups = fast[:6]
    assert [r[0] for r in rows] == ["0.weight", "1.weight", "inv_freq"] and rows[1][7] == "0.weight"
    assert len(canon) == 2 and nonpersistent == ["inv_freq"] and len(computed16) == 1
    assert unloaded == []  # one canonical parameter: "unloaded" needs two
    assert groups == {(torch.device("meta"), torch.bfloat16): [2, 16 * 8 * 2 + 4 * 2]}


def test_not_uniform_goes_to_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    m[1].bias.data = m[1].bias.data.double()
    fast, loop, used = _both(m, monkeypatch)
    assert not used and fast == loop
    assert [(p.kind, p.path) for p in torchdoctor.scan(m).problems] == [("dtype", "1.bias")]


def test_norm_first_fp32_still_votes() -> None:
    """The vote search skips what the loop skips (fp32 norms in a model voted by its other layers) and stops at the
    first tensor that votes: a model of norms only has no dtype vote, one with a Linear after them votes float32."""
    norms = nn.Sequential(nn.LayerNorm(4), nn.LayerNorm(4))
    assert torchdoctor.scan(norms).expected[""]["dtype"] == "none"
    mixed = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 4))
    assert torchdoctor.scan(mixed).expected[""]["dtype"] == "float32"

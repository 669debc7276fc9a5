"""A first scan's cheaper pieces give the answers of the pieces they replace: the one-pass proof of a plan-shaped
dict (``kinds.plain_values``) against a plain recursive reading, and the per-module question ``apps.module_casts``
(asked by ``uniform`` for the first voting tensor's layer instead of making ``Policy.casting`` for every layer)
against ``apps.casting_modules`` on the whole zoo and on a uniform model whose only weights are cast per call."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo
from torchdoctor._scan.apps import casting_modules, module_casts
from torchdoctor._scan.policy import Policy
from torchdoctor._walk import walk
from torchdoctor._walk.kinds import FAST_ATOMS, MAPPING, atoms_only


def _plain(v: Any, depth: int) -> bool:
    """The rule, read recursively: a plain value, or (two levels deep at most) an exact tuple or list of at most 64
    such values."""
    if type(v) in FAST_ATOMS:
        return True
    if type(v) in (tuple, list) and depth < 2 and len(v) <= 64:
        return all(_plain(x, depth + 1) for x in v)
    return False


class _Names(list):  # noqa: FURB189  # a list subclass: never proved
    pass


def _random_value(rng: random.Random, depth: int) -> Any:
    r = rng.random()
    if depth > 3 or r < 0.45:
        return rng.choice(["a", 1, 2.5, None, True, torch.float32, torch.device("cpu")])
    if r < 0.5:
        return rng.choice([torch.zeros(1), {"x"}, _Names(["x"]), object()])
    n = rng.choice([0, 1, 2, 3, 65]) if rng.random() < 0.1 else rng.randint(0, 3)
    items = [_random_value(rng, depth + 1) for _ in range(n)]
    return tuple(items) if rng.random() < 0.5 else items


def test_plan_proof_agrees_with_a_recursive_reading() -> None:
    rng = random.Random(43)
    proved = 0
    for _ in range(3000):
        d = {f"k{i}": _random_value(rng, 0) for i in range(rng.randint(1, 5))}
        want = all(_plain(v, 0) for v in d.values())
        assert atoms_only(d, MAPPING, 100_000) is want, d
        proved += want
    assert 300 < proved < 2700  # both answers met often


def test_a_transformers_plan_is_proved_and_a_tensor_in_one_is_found() -> None:
    plan = {"lm_head": (["hidden_states"], ["logits"]), "model.layers": (["hidden_states", "attention_mask"], [])}
    assert atoms_only(plan, MAPPING, 100_000)
    m = nn.Linear(2, 2)
    m._pp_plan = {"x": (["a"], ["b"]), "y": (["c"], [torch.zeros(2, dtype=torch.float64)])}
    assert [(p.kind, p.path) for p in torchdoctor.scan(m).problems] == [("dtype", "_pp_plan.y.1.0")]


def _owning(w: Any) -> list[nn.Module]:
    return [m for _, m in w.modules if m.__dict__.get("_parameters") or m.__dict__.get("_buffers")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_module_casts_agrees_with_casting_modules_on_the_zoo(dtype: torch.dtype) -> None:
    asked = cast = 0
    for name in zoo.NAMES:
        obj = zoo.build(name, dtype).obj
        w = walk(obj)
        table = casting_modules(w.modules, w.types)
        for m in _owning(w):
            assert module_casts(m) is (id(m) in table), (name, type(m).__name__)
            asked += 1
            cast += id(m) in table
    assert asked > 100 and cast > 0  # some layer of the zoo moves or casts its own weights per call


class _CastsItsWeight(nn.Module):
    """Casts its weight to the input's dtype on every call (as a few app layers do)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.to(x.dtype)


def test_a_layer_cast_per_call_does_not_vote_whether_or_not_the_table_was_made() -> None:
    model = nn.Sequential(_CastsItsWeight(), nn.LayerNorm(4)).to(torch.bfloat16)
    w = walk(model)
    assert module_casts(model[0]) and id(model[0]) in casting_modules(w.modules, w.types)
    lazy = Policy(w, None, None, False, summary=True)  # ``uniform`` asks the one module
    made = Policy.__new__(Policy)
    made.__dict__["casting"] = casting_modules(w.modules, w.types)  # the table made before the tally reads it
    Policy.__init__(made, w, None, None, False, summary=True)
    assert "casting" not in lazy.__dict__ or lazy.casting == made.casting
    for p in (lazy, made):
        assert [(c.device, c.dtype, c.dtype_rule) for c in p.components] == [(torch.device("cpu"), torch.bfloat16,
                                                                                "vote")]
    assert lazy.casting == made.casting  # made when read
    report = torchdoctor.scan(model, dtype="float32")
    assert {p.path for p in report.problems} == {"1.weight", "1.bias"}  # the cast layer is not a problem


def test_a_model_whose_only_weights_are_cast_per_call_has_no_vote_on_either_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from torchdoctor._scan import tally as tally_mod

    model = nn.Sequential(_CastsItsWeight(), _CastsItsWeight()).to(torch.bfloat16)
    w = walk(model)
    fast = Policy(w, None, None, False, summary=True)
    assert "casting" not in fast.__dict__  # the one-device, one-dtype pass asked the modules themselves
    monkeypatch.setattr(tally_mod, "uniform_tally", lambda *a: None)
    loop = Policy(w, None, None, False, summary=True)
    got = [[(c.device, c.dtype, c.dtype_rule) for c in p.components] for p in (fast, loop)]
    assert got[0] == got[1] == [[(None, None, "vote")]][0]

"""explain in a no-grad forward runs with no global post hook: the running modules come from the traceback
(``_guard/lean.py``), and everything explain said before is still said."""

from __future__ import annotations

import copy
import io
import pickle
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules.module import _global_forward_hooks

import torchdoctor
from torchdoctor._guard import api, lean

BF = torch.bfloat16


class _Chain(nn.Module):
    """An fp32 embedding in a bf16 model: its output reaches `head` two modules later (the culprit "entered at"
    the embedding, which ran and returned before the failing module started)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.mid = nn.Sequential(nn.Identity(), nn.Identity())
        self.head = nn.Linear(8, 8)

    def forward(self, ids: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.head(self.mid(self.emb(ids)) * scale)


def _broken() -> _Chain:
    torch.manual_seed(0)
    model = _Chain().to(BF)
    model.emb.float()
    return model


def _explain(model: nn.Module, grad: bool) -> str:
    with pytest.raises(torchdoctor.PlacementError) as err:
        with torch.set_grad_enabled(grad), torchdoctor.guard(model):
            model(torch.tensor([[1, 2, 3]]), scale=2.0)
    return str(err.value)


def test_a_no_grad_failure_is_explained_as_with_both_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    lean_text = _explain(_broken(), grad=False)
    monkeypatch.setattr(lean, "LEAN", False)
    pair_text = _explain(_broken(), grad=False)
    assert lean_text == pair_text
    assert lean_text.startswith("dtype mismatch caused by `emb.weight` (float32, expected bfloat16); float32 entered "
                                "at `emb`; it surfaced in `head` (Linear)")  # the order modules started in
    assert "input 0: f32[1,3,8]@cpu  (expected bfloat16)" in lean_text  # the failing module's input, from its frame
    assert "fix proven: the whole forward runs again on a copy of the model with emb.weight -> bfloat16" in lean_text


def test_the_post_hook_is_off_only_in_no_grad_forwards() -> None:
    seen: list[tuple[bool, int]] = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append((torch.is_grad_enabled(), len(_global_forward_hooks)))
            return x

    before = len(_global_forward_hooks)
    model = nn.Sequential(nn.Linear(4, 4), Probe())
    with torchdoctor.guard(model):
        with torch.no_grad():
            model(torch.ones(1, 4))
        model(torch.ones(1, 4))
        with torch.no_grad():
            model(torch.ones(1, 4))
    assert seen == [(False, before), (True, before + 1), (False, before)]
    assert len(_global_forward_hooks) == before and not model._forward_hooks  # nothing left on the model


def test_grad_turned_on_inside_a_no_grad_forward_puts_the_running_modules_on_the_stack() -> None:
    stacks: list[list[str]] = []

    class Inner(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            session = guard._local.sessions[-1]
            stacks.append([type(m).__name__ for m in session.frames.stack])
            return x * 2

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.enable_grad():  # (a guidance step inside a no-grad sampling loop)
                return self.inner(x)

    model = nn.Sequential(Outer(), nn.Linear(2, 2))
    model[1].register_buffer("extra", torch.zeros(1, dtype=torch.float64))  # tensors that disagree: the pre hook
    # stays in every forward (one whose tensors all agree runs with no global hook: it cannot see grad turn on)
    guard = torchdoctor.guard(model)
    with torch.no_grad(), guard:
        model(torch.ones(2))
        assert not guard._local.sessions[-1].frames.stack  # every module popped on its return
    assert stacks == [["Sequential", "Outer", "Inner"]]


_COPIES: list[Any] = []


class _Snap(nn.Module):
    """Copies and pickles itself inside its forward (a checkpoint written mid-run, an EMA copy made in forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _COPIES.append(copy.deepcopy(self))
        buf = io.BytesIO()
        pickle.dump(self, buf)
        _COPIES.append(pickle.loads(buf.getvalue()))
        return self.lin(x)


def test_a_copy_or_pickle_of_the_model_taken_inside_its_forward_holds_no_session() -> None:
    copies = _COPIES
    copies.clear()
    model = _Snap()
    with torch.no_grad(), torchdoctor.guard(model):
        model(torch.ones(1, 2))
    assert not model._forward_hooks
    assert len(copies) == 2
    for c in copies:
        assert list(c._forward_hooks.values()) == [lean._gone]
        c.lin(torch.ones(1, 2))  # the copy runs, outside any guard
        c._forward_hooks[next(iter(c._forward_hooks))](c, (), {}, None)  # and the hook left in it does nothing


def test_explain_running_leaves_the_stack_empty_for_the_next_forward() -> None:
    model = _broken()
    g = torchdoctor.guard(model)
    with torch.no_grad(), g:
        try:
            model(torch.tensor([[1, 2]]))
        except RuntimeError as exc:
            said = api.explain_running(g, exc)
        session = g._local.sessions[-1]
        assert not session.frames.stack
        model.emb.to(BF)
        model(torch.tensor([[1, 2]]))  # the next forward runs lean again, from an empty stack
        assert session.lean.ran_lean and not session.frames.stack
    assert said is not None and said.startswith("dtype mismatch caused by `emb.weight`") and "in `head`" in said


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.Identity())
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.inner(x))


def _strict(model: nn.Module) -> str:
    with pytest.raises(torchdoctor.PlacementError) as err:
        with torch.no_grad(), torchdoctor.guard(model, mode="strict"):
            model(torch.ones(2, 8, dtype=BF))
    return str(err.value)


@pytest.mark.parametrize("where", ["1.inner.0", "1.out"])
def test_strict_in_a_no_grad_forward_names_the_module_inside_a_suspect_as_before(
        monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    def broken() -> nn.Module:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Identity(), _Block(), nn.Linear(8, 8)).to(BF)
        model.get_submodule(where).bias.data = model.get_submodule(where).bias.data.float()
        return model

    lean_text = _strict(broken())
    monkeypatch.setattr(lean, "LEAN", False)
    assert lean_text == _strict(broken())
    assert lean_text.startswith(f"dtype problem in `{where}` (Linear) at aten.addmm.default: arg 0 (self) is "
                                "float32, expected bfloat16")  # the innermost module, from the live frames
    assert f"model[1].{where[2:]}.bias.data = model[1].{where[2:]}.bias.data.to(torch.bfloat16)".replace(
        ".0.", "[0].") in lean_text


def test_strict_keeps_checking_after_a_suspect_returns_in_a_no_grad_forward() -> None:
    seen: list[tuple[bool, int]] = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            session = guard._local.sessions[-1]
            seen.append((session.kwarg_hook in _global_forward_hooks, len(session.dispatch.gate.active)))
            return x

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Probe(), nn.Linear(8, 8)).to(BF)
    model[0].register_buffer("scale", torch.ones(8))  # float32, never read: a suspect that runs quietly
    model[2].weight.data = model[2].weight.data.float()
    guard = torchdoctor.guard(model, mode="strict")
    with pytest.raises(torchdoctor.PlacementError) as err, torch.no_grad(), guard:
        model(torch.ones(2, 8, dtype=BF))
    assert seen[0] == (False, 0)  # the suspect returned: no post hook, no mode, until the next one starts
    # (later entries: the proof's re-runs of the forward on a copy)
    assert str(err.value).startswith("dtype problem in `2` (Linear) at aten.")
    assert [p.path for p in guard.problems] == ["2.weight"]


class _Made(nn.Module):
    """Agreeing tensors (all bf16); the forward makes a float32 tensor that meets them two modules down."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.second = nn.Linear(8, 8)
        self.register_module("dropped", None)  # a submodule slot set to None

    def forward(self, x: torch.Tensor, again: bool = False) -> torch.Tensor:
        h = self.first(x)
        if again:  # the outermost module called again inside its own forward
            h = self(h)
        mask = torch.ones(8)  # float32: no dtype given
        return self.second(h * mask)


def test_a_no_grad_forward_of_agreeing_tensors_runs_with_no_global_hook_and_is_explained_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.nn.modules.module import _global_forward_pre_hooks

    pres: list[int] = []
    model = _Made().to(BF)
    model.second.register_forward_pre_hook(lambda m, a: pres.append(len(_global_forward_pre_hooks)))
    before = len(_global_forward_pre_hooks)

    def explain(again: bool) -> str:
        with pytest.raises(torchdoctor.PlacementError) as err:
            with torch.no_grad(), torchdoctor.guard(model):
                model(torch.ones(2, 8, dtype=BF), again=again)
        return str(err.value)

    bare = [explain(False), explain(True)]
    assert pres[0] == before  # guard's pre hook left torch's dict for the forward (later: the proofs' re-runs)
    assert len(_global_forward_pre_hooks) == before and not model._forward_hooks and not model._forward_pre_hooks
    monkeypatch.setattr(lean, "LEAN", False)
    at = len(pres)
    assert bare == [explain(False), explain(True)]
    assert pres[at] == before + 1
    assert bare[0].startswith("dtype mismatch in `second` (Linear)")
    assert "mask = torch.ones(8)" in bare[0]  # the maker, read from the failing frames


def test_a_model_whose_tensors_disagree_keeps_the_pre_hook_that_records_what_ran() -> None:
    from torch.nn.modules.module import _global_forward_pre_hooks

    model = _broken()
    g = torchdoctor.guard(model)
    with torch.no_grad(), g:
        try:
            model(torch.tensor([[1, 2]]))
        except RuntimeError:
            pass
        assert g._local.sessions[-1].lean.pre_id in _global_forward_pre_hooks
        assert [type(m).__name__ for m in g._local.sessions[-1].frames.ran][:3] == ["_Chain", "Embedding",
                                                                                   "Sequential"]

"""``move``'s rollback: the three measured families (grads of same-device casts, identity and aliasing under
``rollback="auto"``, failed verification), each checked against the real state of the object afterwards."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from support import zoo
from support.helpers import diff, fingerprint
from torch import nn

from torchdoctor import PlacementError
from torchdoctor._move.apply import move

BF16 = torch.bfloat16


def _fp(obj: Any) -> Any:
    return fingerprint(obj, torch_state=False)


class _FailAt:
    """Replaces ``torch.Tensor.to``: the n-th call raises ``exc`` (an out-of-memory by default), the others convert."""

    def __init__(self, n: int, exc: BaseException | None = None) -> None:
        self.n, self.calls, self.real = n, 0, torch.Tensor.to
        self.exc = exc or torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB (simulated)")

    def __call__(self, t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.n:
            raise self.exc
        return self.real(t, *args, **kwargs)


def _fail_at(monkeypatch: pytest.MonkeyPatch, n: int, exc: BaseException | None = None) -> _FailAt:
    fail = _FailAt(n, exc)

    def to(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:  # a function, so it binds as a method
        return fail(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    return fail


def _trained_linear() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model(torch.randn(3, 4)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    return model


# --- (a) a Parameter with a .grad: the grad conversion fails after .data was replaced ------------------------------


@pytest.mark.parametrize("rollback", ["auto", "exact"])
def test_fault_converting_a_grad_leaves_the_parameter_and_grad_as_before(monkeypatch: pytest.MonkeyPatch,
                                                                        rollback: str) -> None:
    model = _trained_linear()
    before = _fp(model)
    _fail_at(monkeypatch, 2)  # call 1 converts 0.weight's data, call 2 its grad
    with pytest.raises(PlacementError) as info:
        move(model, dtype=torch.float64, rollback=rollback)  # widening: undone exactly even without originals
    monkeypatch.undo()
    assert "0.weight" in str(info.value) and "rolled back: the object is as before" in str(info.value)
    assert _fp(model) == before, "\n".join(diff(before, _fp(model)))


def test_fault_converting_a_grad_of_a_narrowing_cast_names_weight_and_grad(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _trained_linear()
    values = {n: (p.detach().clone(), p.grad.clone()) for n, p in model.named_parameters()}
    _fail_at(monkeypatch, 4)  # 0.weight data + grad converted, 0.bias data converted, its grad fails
    with pytest.raises(PlacementError) as info:
        move(model, dtype=BF16)  # auto keeps no same-device originals: cast back, and say what lost precision
    monkeypatch.undo()
    text = str(info.value)
    assert "lost precision" in text
    rows = {ln.strip() for ln in text.split("Fix:")[0].splitlines()[1:]}
    assert rows == {"0.weight", "0.weight.grad"}  # 0.bias was never changed, its grad conversion failed
    for n, p in model.named_parameters():
        assert p.dtype == p.grad.dtype == torch.float32, n
        if n == "0.bias" or n.startswith("1."):
            assert torch.equal(p.detach(), values[n][0]) and torch.equal(p.grad, values[n][1]), n


# --- (b) rollback="auto": the original objects come back, views keep aliasing their base -------------------------


class Views(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        base = torch.arange(12.0)
        self.register_buffer("base", base)
        self.register_buffer("head", base[:6])
        self.tail = base[6:].view(2, 3)  # a plain attribute viewing the same storage
        self.last = torch.ones(2)
        self.lin = nn.Linear(3, 3)


def _storages(model: Views) -> set[int]:
    return {t.untyped_storage()._cdata for t in (model.base, model.head, model.tail)}


@pytest.mark.parametrize("target", [dict(dtype=torch.float64), dict(device="meta"),
                                    dict(device="meta", dtype=BF16)])
def test_auto_rollback_brings_back_the_same_objects_and_views(monkeypatch: pytest.MonkeyPatch,
                                                             target: dict[str, Any]) -> None:
    model = Views()
    objs = (model.base, model.head, model.tail)
    before = _fp(model)
    _fail_at(monkeypatch, 4)  # lin.weight, lin.bias, the three views (one storage), then `last` fails
    with pytest.raises(PlacementError, match="the object is as before"):
        move(model, **target)
    monkeypatch.undo()
    assert all(a is b for a, b in zip(objs, (model.base, model.head, model.tail)))
    assert len(_storages(model)) == 1
    assert _fp(model) == before, "\n".join(diff(before, _fp(model)))


def test_auto_rollback_of_a_narrowing_cast_names_only_what_lost_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Views()
    objs = (model.base, model.head, model.tail)
    _fail_at(monkeypatch, 4)
    with pytest.raises(PlacementError) as info:
        move(model, dtype=BF16)
    monkeypatch.undo()
    rows = {ln.strip() for ln in str(info.value).split("Fix:")[0].splitlines()[1:]}
    assert rows == {"lin.weight", "lin.bias"}  # the same Parameters, cast back; the views were held here: exact
    assert all(a is b for a, b in zip(objs, (model.base, model.head, model.tail)))


def test_auto_rollback_without_outside_references_keeps_views_sharing_one_storage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = Views()
    values = model.base.clone()
    _fail_at(monkeypatch, 4)
    with pytest.raises(PlacementError, match="the object is as before"):
        move(model, dtype=torch.float64)
    monkeypatch.undo()
    gc.collect()
    assert len(_storages(model)) == 1 and model.base.dtype == torch.float32
    assert torch.equal(model.base, values) and model.tail.tolist() == [[6, 7, 8], [9, 10, 11]]
    model.base[7] = -1.0  # still one storage: a write through the base shows in both views
    assert model.tail[0, 1].item() == -1.0


def test_auto_rollback_of_a_view_of_an_outside_tensor_keeps_it_a_view(monkeypatch: pytest.MonkeyPatch) -> None:
    outside = torch.arange(8.0)
    model = nn.Linear(2, 2)
    model.window = outside[2:6]
    model.last = torch.ones(2)
    _fail_at(monkeypatch, 4)  # weight, bias, window, then `last` fails
    with pytest.raises(PlacementError):
        move(model, dtype=BF16)
    monkeypatch.undo()
    assert model.window.dtype == torch.float32 and model.window._base is outside
    outside[3] = 100.0
    assert model.window[1].item() == 100.0


# --- (c) verification fails after the move: roll back too -------------------------------------------------------


class Stuck(torch.Tensor):
    """A tensor subclass whose ``.to`` does nothing (as some third-party subclasses do)."""

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        return self


def test_failed_verification_rolls_back_and_says_what_was_left_behind() -> None:
    model = zoo.tiny_llama()
    model.model.norm.cache = torch.zeros(3).as_subclass(Stuck)
    before = _fp(model)
    with pytest.raises(PlacementError) as info:
        move(model, "meta")
    text = str(info.value)
    assert "left behind" in text and "model.norm.cache" in text and "rolled back: the object is as before" in text
    assert _fp(model) == before, "\n".join(diff(before, _fp(model)))


def test_failed_verification_without_rollback_says_not_rolled_back() -> None:
    model = nn.Linear(2, 2)
    model.cache = torch.zeros(3).as_subclass(Stuck)
    with pytest.raises(PlacementError) as info:
        move(model, "meta", rollback=False)
    assert "left behind" in str(info.value) and "NOT rolled back" in str(info.value)
    assert model.weight.is_meta


# --- interrupts and logging -------------------------------------------------------------------------------------------


def test_an_interrupt_stays_an_interrupt_and_its_note_says_the_object_is_as_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = _trained_linear()
    before = _fp(model)
    _fail_at(monkeypatch, 3, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt) as info:
        move(model, "meta", rollback="exact")
    monkeypatch.undo()
    note = info.value.__notes__[-1]
    assert note.startswith("torchdoctor: move failed at 0.bias after 1 tensor(s) (KeyboardInterrupt)")
    assert note.endswith("rolled back: the object is as before")
    assert _fp(model) == before, "\n".join(diff(before, _fp(model)))


def test_lost_precision_comes_as_problems_too(monkeypatch: pytest.MonkeyPatch) -> None:
    model = zoo.tiny_unet()
    _fail_at(monkeypatch, 40)
    with pytest.raises(PlacementError) as info:
        move(model, dtype=BF16)
    monkeypatch.undo()
    problems = info.value.problems
    assert len(problems) > 20 and "... and" in str(info.value)  # the text is cut, the problems are not
    assert {p.kind for p in problems} == {"lost_precision"} and problems[0].path == "conv_in.weight"
    assert problems[0].found == problems[0].expected == "f32[4,4,3,3]@cpu"
    assert info.value.fix is not None and "rollback='exact'" in info.value.fix


def test_one_info_line_per_move_and_debug_per_unit(caplog: pytest.LogCaptureFixture) -> None:
    model = Views()
    with caplog.at_level("DEBUG", logger="torchdoctor.move"):
        move(model, dtype=BF16)
    infos = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    debugs = [r.getMessage() for r in caplog.records if r.levelname == "DEBUG"]
    assert len(infos) == 1 and infos[0].startswith("moved 6 tensor(s), ") and " to bfloat16 in " in infos[0]
    assert len(debugs) == 4  # lin.weight, lin.bias, the three views as one unit, last
    assert any("base f32[12]@cpu -> bf16[12]@cpu; head" in d for d in debugs)


def test_auto_keeps_what_a_copy_could_not_replace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-leaf tensor (autograd history) and a tensor with a hook come back as themselves, held by nobody else."""
    model = nn.Linear(2, 2)
    model.derived = model.weight.sum(0) * 2  # carries a grad_fn
    model.hooked = torch.ones(2, requires_grad=True)
    seen: list[Any] = []
    model.hooked.register_hook(seen.append)
    model.zlast = torch.ones(2)
    ids, fn = (id(model.derived), id(model.hooked)), model.derived.grad_fn
    _fail_at(monkeypatch, 5)  # weight, bias, derived, hooked, then zlast fails
    with pytest.raises(PlacementError):
        move(model, dtype=BF16)
    monkeypatch.undo()
    assert (id(model.derived), id(model.hooked)) == ids
    assert model.derived.grad_fn is fn and model.derived.dtype == torch.float32
    model.hooked.sum().backward()
    assert len(seen) == 1

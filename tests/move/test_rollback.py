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

import torchdoctor
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


# --- a failure part-way ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", [dict(device="meta"), dict(dtype=BF16, rollback="exact"),
                                    dict(device="meta", dtype=BF16)])
def test_failure_at_the_37th_tensor_rolls_back_to_exactly_before(monkeypatch: pytest.MonkeyPatch,
                                                                target: dict[str, Any]) -> None:
    model = zoo.tiny_unet()
    before = _fp(model)
    fail = _fail_at(monkeypatch, 37)
    with pytest.raises(PlacementError) as info:
        move(model, **target)
    monkeypatch.undo()
    assert fail.calls >= 37
    assert "after 36 tensor(s)" in str(info.value) and "rolled back: the object is as before" in str(info.value)
    assert "out of memory" in str(info.value) and isinstance(info.value.__cause__, RuntimeError)
    assert _fp(model) == before, "\n".join(diff(before, _fp(model)))


def test_widening_cast_rolls_back_exactly_without_keeping_originals(monkeypatch: pytest.MonkeyPatch) -> None:
    model = zoo.tiny_unet(BF16)
    before = _fp(model)
    _fail_at(monkeypatch, 37)
    with pytest.raises(PlacementError, match="the object is as before"):
        move(model, dtype=torch.float32)
    monkeypatch.undo()
    assert _fp(model) == before


def test_narrowing_cast_rolls_back_dtypes_and_names_the_precision_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    model = zoo.tiny_unet()
    params = list(model.parameters())
    _fail_at(monkeypatch, 37)
    with pytest.raises(PlacementError) as info:
        move(model, dtype=BF16)
    monkeypatch.undo()
    text = str(info.value)
    assert "lost precision" in text and "rollback='exact'" in text and "conv_in.weight" in text
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(a is b for a, b in zip(params, model.parameters()))  # the same Parameter objects
    assert torchdoctor.scan(model, dtype=torch.float32).ok


def test_rollback_false_says_what_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    model = zoo.tiny_unet()
    _fail_at(monkeypatch, 3)
    with pytest.raises(PlacementError) as info:
        move(model, dtype=BF16, rollback=False)
    monkeypatch.undo()
    assert "NOT rolled back" in str(info.value) and "conv_in.weight" in str(info.value)
    assert model.conv_in.weight.dtype == BF16 and model.time_embedding.linear_1.weight.dtype == torch.float32


def test_failure_in_bnb_quant_state_rolls_back_the_shared_state(monkeypatch: pytest.MonkeyPatch) -> None:
    model = zoo.bnb_linear4bit()
    before = _fp(model)
    _fail_at(monkeypatch, 5)  # weight, bias, absmax, code done; offset fails
    with pytest.raises(PlacementError, match="quant_state.offset after 4"):
        move(model, "meta")
    monkeypatch.undo()
    assert _fp(model) == before


def test_left_behind_is_reported_by_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchdoctor._move import (
        owners as _move_owners,  # the forward write; rollback writes through undo
    )

    real = _move_owners.set_tensor

    def lossy_set(entry: Any, new: torch.Tensor) -> None:
        if entry.path != "scale":  # an owner that silently ignores the assignment
            real(entry, new)

    monkeypatch.setattr(_move_owners, "set_tensor", lossy_set)
    model = nn.Linear(4, 4)
    model.scale = torch.full((4,), 2.0)
    with pytest.raises(PlacementError, match="left behind") as info:
        move(model, dtype=BF16)
    assert "scale  f32[4]@cpu -> bf16[4]@cpu" in str(info.value)


def test_a_failed_move_keeps_no_copies_alive_in_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:

    def bf16_alive() -> set[int]:
        gc.collect()
        return {id(o) for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.dtype == BF16}

    model = zoo.tiny_unet()
    before = bf16_alive()
    _fail_at(monkeypatch, 37)
    with pytest.raises(PlacementError) as info:
        move(model, dtype=BF16, rollback="exact")
    monkeypatch.undo()
    assert info.value.__cause__ is not None and bf16_alive() - before == set()


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
    model.zlast = torch.ones(2)
    _fail_at(monkeypatch, 4)  # weight, bias, window, then `zlast` fails (attributes go by name)
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


# --- tensor forms --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_nested_tensors_are_cast_as_one_tensor(layout: torch.layout) -> None:
    model = nn.Linear(2, 2)
    model.nt = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], layout=layout)
    report = move(model, dtype=BF16)
    assert model.nt.dtype == BF16 and model.nt.is_nested
    row = next(r for r in report.moved if r.path == "nt")
    assert row.src.startswith("f32[2,") and row.dst.startswith("bf16[2,") and row.dst.endswith(",3]@cpu")


def test_a_conversion_torch_refuses_part_way_is_rolled_back() -> None:
    """torch has no meta kernel for strided nested tensors: the error comes after other tensors moved."""
    model = nn.Linear(2, 2)
    model.nt = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)])
    before = _fp(model)
    with pytest.raises(PlacementError) as info:
        move(model, "meta")
    assert "move failed at nt after 2 tensor(s)" in str(info.value)
    assert "rolled back: the object is as before" in str(info.value)
    assert _fp(model) == before, "\n".join(diff(before, _fp(model)))

"""The lean cast (issue 28): in ``rollback="auto"`` or ``False``, a plain ``Parameter`` cast on its own device that owns
its storage and has no grad or hooks is ``param.data = param.data.to(dtype)`` with one ``CastBack`` undo record, without
the unit, the slot writes and the swaps of the general path. It must do what the general path does: the same objects,
the values ``Module.to`` makes, the same report, the same rollback; and leave everything else to the general path."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import zoo
from torch import nn

from torchdoctor import PlacementError
from torchdoctor._move import apply as _move_apply
from torchdoctor._move.apply import move

BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=16)).eval()


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths cast by the lean path, in order."""
    seen: list[str] = []
    real = _move_apply.CastBack

    class Spy(real):  # type: ignore[misc, valid-type]
        def __init__(self, target: torch.Tensor, new: torch.Tensor, path: str, was: str, dtype: torch.dtype) -> None:
            seen.append(path)
            super().__init__(target, new, path, was, dtype)

    monkeypatch.setattr(_move_apply, "CastBack", Spy)
    return seen


def _rows(report: Any) -> list[tuple[str, str, str, int]]:
    return [(m.path, m.src, m.dst, m.nbytes) for m in report.moved]


BUILDERS = {"gpt2 (tied)": _gpt2, "llama": lambda: zoo.tiny_llama(), "unet": lambda: zoo.tiny_unet()}


@pytest.mark.parametrize("name", list(BUILDERS))
@pytest.mark.parametrize("dtype", [BF16, F16, F64])
def test_the_lean_cast_makes_what_module_to_and_the_general_path_make(monkeypatch: pytest.MonkeyPatch, name: str,
                                                                      dtype: torch.dtype) -> None:
    lean, general, anchor = (BUILDERS[name]() for _ in range(3))
    params = {n: p for n, p in lean.named_parameters()}
    seen = _spy(monkeypatch)
    report = move(lean, dtype=dtype, keep_fp32=False)
    assert seen and set(seen) <= set(params)  # plain parameters only, each storage once (a tied weight once)
    assert len(seen) == len(set(seen)) == len({id(p) for p in params.values()})
    assert all(params[n] is p for n, p in lean.named_parameters())  # the same Parameter objects
    anchor.to(dtype)
    for (n, p), q in zip(lean.state_dict().items(), anchor.state_dict().values()):
        assert p.dtype == q.dtype and torch.equal(p, q), n
    seen.clear()
    exact = move(general, dtype=dtype, keep_fp32=False, rollback="exact")  # the general path: keeps the originals
    assert not seen
    assert _rows(report) == _rows(exact) and report.storage_bytes == exact.storage_bytes
    for p, q in zip(lean.state_dict().values(), general.state_dict().values()):
        assert p.dtype == q.dtype and torch.equal(p, q)


def test_what_the_lean_cast_leaves_to_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    m = nn.Module()
    m.plain = nn.Linear(4, 4)
    m.trained = nn.Linear(4, 4)
    m.trained(torch.randn(2, 4)).sum().backward()  # grads move with their parameters
    m.hooked = nn.Linear(4, 4)
    m.hooked.weight.register_post_accumulate_grad_hook(lambda p: None)
    base = torch.randn(8)
    m.views = nn.Module()
    m.views.a = nn.Parameter(base[:4])  # two Parameters over one storage: moved as one unit
    m.views.b = nn.Parameter(base[4:])
    m.part = nn.Module()
    m.part.w = nn.Parameter(torch.randn(8)[2:])  # a view of a storage it does not cover whole
    m.sub = nn.Module()
    m.sub.p = nn.Parameter(torch.randn(4).as_subclass(_Sub))  # a Parameter subclass
    m.register_buffer("buf", torch.ones(3))  # buffers and attribute tensors: the general path's slot writes
    seen = _spy(monkeypatch)
    before = {n: p for n, p in m.named_parameters()}
    move(m, dtype=BF16)
    assert seen == ["plain.weight", "plain.bias", "hooked.bias"]
    assert all(before[n] is p and p.dtype == BF16 for n, p in m.named_parameters())
    assert m.trained.weight.grad.dtype == BF16 and m.buf.dtype == BF16
    assert m.views.a.untyped_storage().data_ptr() == m.views.b.untyped_storage().data_ptr()
    seen.clear()
    move(m, dtype=F32, rollback="exact")
    move(m, dtype=F16, non_blocking=True)
    assert not seen


class _Sub(torch.Tensor):
    pass


def test_a_lean_cast_interrupted_part_way_rolls_back_and_names_what_lost_precision(
        monkeypatch: pytest.MonkeyPatch) -> None:
    m = _gpt2()
    params = {n: p for n, p in m.named_parameters()}
    values = {n: p.detach().clone() for n, p in params.items()}
    seen = _spy(monkeypatch)
    real, calls = torch.Tensor.to, [0]

    def to(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 5:
            raise KeyboardInterrupt
        return real(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    with pytest.raises(KeyboardInterrupt) as info:
        move(m, dtype=BF16)
    monkeypatch.setattr(torch.Tensor, "to", real)
    assert len(seen) == 4  # four lean casts landed before the interrupt
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "lost precision" in note and all(path in note for path in seen)
    for n, p in m.named_parameters():
        assert p is params[n] and p.dtype == F32
        assert torch.equal(p.detach(), values[n].to(BF16).to(F32) if n in seen else values[n]), n


def test_a_lean_cast_rolled_back_after_a_failed_verification_is_exact_for_a_widening_cast(
        monkeypatch: pytest.MonkeyPatch) -> None:
    m = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    m.cache = torch.zeros(2).as_subclass(_Stuck)  # its cast never lands: the verification finds it
    values = [p.detach().clone() for p in m.parameters()]
    seen = _spy(monkeypatch)
    with pytest.raises(PlacementError, match="left behind") as info:
        move(m, dtype=F64)
    assert seen == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert "rolled back: the object is as before" in str(info.value)
    assert all(p.dtype == F32 and torch.equal(p.detach(), v) for p, v in zip(m.parameters(), values))


class _Stuck(torch.Tensor):
    def to(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        return self

"""``F.scaled_dot_product_attention`` and ``F.linear`` answered as one aten op (``_virtual.whole``, issue 43 point 1)
change no finding: planted bugs around them give the same report with the one-op path on and off (ops apart: the
point is fewer of them), provenance of a linear's result included; the path is taken where the operands agree, and
not where something inside the decomposition could be a problem, nor (attention) on real values. The whole zoo, on
and off: ``test_speed_kernel_table.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support import zoo
from torch import nn

import torchdoctor
from torchdoctor._virtual import dispatch as D
from torchdoctor._virtual import tensor as V
from torchdoctor._virtual import whole
from torchdoctor._virtual.tensor import VirtualTensor, make

aten = torch.ops.aten
BF = torch.bfloat16


def _report(rep: Any) -> tuple[Any, ...]:
    return (rep.ok, rep.stopped, rep.fix,
            [(p.kind, p.path, p.found, p.expected, p.message, p.op, p.module_path) for p in rep.problems])


def _sent(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The aten ops dispatch saw, in order."""
    seen: list[Any] = []
    inner = D._dispatch_op

    def spy(func: Any, args: Any, kwargs: Any) -> Any:
        seen.append(func)
        return inner(func, args, kwargs)

    monkeypatch.setattr(D, "_dispatch_op", spy)
    return seen


def _both(monkeypatch: pytest.MonkeyPatch, run: Any) -> tuple[Any, Any, list[Any], list[Any]]:
    seen = _sent(monkeypatch)
    one = run()
    on = list(seen)
    seen.clear()
    monkeypatch.setattr(whole, "ENABLED", False)
    try:
        off = run()
    finally:
        monkeypatch.setattr(whole, "ENABLED", True)
    return one, off, on, list(seen)


def test_a_llama_takes_the_path_for_every_attention_on_meta(monkeypatch: pytest.MonkeyPatch) -> None:
    model = zoo.tiny_llama(BF)
    ids = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    # small tensors keep real values: the first layer's attention decomposes (another CPU kernel would round
    # otherwise), and its causal mask, made on meta, leaves meta values to the second layer, which takes the path
    seen = _sent(monkeypatch)
    assert torchdoctor.simulate(model, {"input_ids": ids}, device="cuda:1").ok
    assert seen.count(aten.scaled_dot_product_attention.default) == 1
    seen.clear()
    monkeypatch.setattr(V, "SMALL", 0)  # every tensor a meta twin, as with a real model's weights
    one, off, on, seen_off = _both(monkeypatch, lambda: torchdoctor.simulate(model, {"input_ids": ids},
                                                                             device="cuda:1"))
    assert one.ok and off.ok and _report(one) == _report(off)
    # one attention a layer (2 layers), ~30 ops each when decomposed; q, k, v, o, gate, up, down and lm_head
    assert on.count(aten.scaled_dot_product_attention.default) == 2
    assert on.count(aten.linear.default) == (15 if whole.LINEAR else 0)
    assert aten.scaled_dot_product_attention.default not in seen_off and one.ops + 40 < off.ops


class _Attn(nn.Module):
    def __init__(self, mask: str = "none") -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.mask = mask
        self.register_buffer("bias", torch.zeros(1, 2, 4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(1, 4, 2, 8).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        if self.mask == "none":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.mask == "bias":  # a buffer left in float32 while the model runs in bfloat16
            return F.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=self.bias.to(torch.float64))
        cpu = torch.ones(4, 4, dtype=torch.bool).tril()  # made on the cpu in forward
        return F.scaled_dot_product_attention(q, k, v, attn_mask=cpu)


@pytest.mark.parametrize("mask", ["none", "bias", "cpu"])
def test_planted_bugs_around_attention_read_the_same(mask: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "SMALL", 0)
    model = _Attn(mask).to(BF)
    x = torch.randn(1, 4, 16, dtype=BF)
    one, off, on, _ = _both(monkeypatch, lambda: torchdoctor.simulate(model, (x,), device="cuda:1", dtype=BF))
    assert _report(one) == _report(off)
    assert one.ok == (mask == "none"), (mask, one.problems)
    # a float64 mask is recorded where it is made and the run goes on with it cast: the attention then agrees
    sdpa, bmm = aten.scaled_dot_product_attention.default, aten.bmm.default
    if mask == "cpu":  # the checked run decomposes what meets the cpu mask; a proof's re-run, with the mask made on
        # the device by the printed fix, may then take the path
        assert bmm in on and (sdpa not in on or on.index(bmm) < on.index(sdpa)), on
    else:
        assert sdpa in on, on


class _Floats(nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8, bias=bias), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).float())  # an upcast activation meets b's bfloat16 weight


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(2, 8), (1, 3, 8)])
def test_a_linear_result_is_named_as_the_decomposition_names_it(bias: bool, shape: tuple[int, ...],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "SMALL", 0)
    model = _Floats(bias).to(BF)
    x = torch.randn(*shape, dtype=BF)
    one, off, on, _ = _both(monkeypatch, lambda: torchdoctor.simulate(model, (x,), device="cuda:1"))
    assert _report(one) == _report(off) and not one.ok
    assert (aten.linear.default in on) == whole.LINEAR  # `a` (`b`, float32 input, bfloat16 weight, decomposes)
    made = {(True, 2): "aten.addmm in `a`", (False, 2): "aten.mm in `a`", (True, 3): "aten.view in `a`",
            (False, 3): "aten._unsafe_view in `a`"}[bias, len(shape)]
    assert f"from a tensor made by {made}" in one.problems[0].message, one.problems[0].message


def test_training_and_autocast_decompose_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "SMALL", 0)
    model = _Attn().to(BF)
    x = torch.randn(1, 4, 16, dtype=BF)

    def step(m: nn.Module) -> None:  # autograd records: the op must go through it
        m.to("cuda:1")(x.to("cuda:1")).sum().backward()

    one, off, on, _ = _both(monkeypatch, lambda: torchdoctor.simulate(model, device="cuda:1", call=step))
    assert _report(one) == _report(off) and one.ok and one.ops == off.ops
    assert aten.scaled_dot_product_attention.default not in on

    def autocast(m: nn.Module) -> None:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            m.to("cuda:1")(x.to("cuda:1"))

    one, off, on, _ = _both(monkeypatch, lambda: torchdoctor.simulate(model, device="cuda:1", call=autocast))
    assert _report(one) == _report(off) and one.ops == off.ops
    assert aten.scaled_dot_product_attention.default not in on


def _v(*shape: int, dtype: torch.dtype = BF, device: str = "cuda:1") -> Any:
    return make(VirtualTensor, torch.empty(shape, dtype=dtype, device="meta"), torch.device(device))


def test_the_gate_reads_keyword_calls_and_refuses_what_it_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = _v(1, 2, 4, 8), _v(1, 2, 4, 8), _v(1, 2, 4, 8)
    sdpa = aten.scaled_dot_product_attention.default
    assert whole.single(F.scaled_dot_product_attention, (q, k, v), {}) == (sdpa, (q, k, v, None, 0.0, False), {})
    assert whole.single(F.scaled_dot_product_attention, (), {"query": q, "key": k, "value": v, "is_causal": True,
                                                             "scale": 0.5}) == \
        (sdpa, (q, k, v, None, 0.0, True), {"scale": 0.5})
    bool_mask, mask = _v(4, 4, dtype=torch.bool), _v(4, 4)
    assert whole.single(F.scaled_dot_product_attention, (q, k, v, bool_mask), {}) is not None
    assert whole.single(F.scaled_dot_product_attention, (q, k, v, mask), {}) is not None
    for odd in (_v(4, 4, dtype=torch.float32), _v(4, 4, device="cuda:0"), _v(4, 4, dtype=torch.bool, device="cpu"),
                torch.ones(4, 4, dtype=torch.bool)):  # another dtype or device, or a plain tensor: decomposed
        assert whole.single(F.scaled_dot_product_attention, (q, k, v, odd), {}) is None
    assert whole.single(F.scaled_dot_product_attention, (q, k, _v(1, 2, 4, 8, dtype=torch.float32)), {}) is None
    assert whole.single(F.scaled_dot_product_attention, (q, k, v), {"bogus": 1}) is None
    assert whole.single(F.scaled_dot_product_attention, (q, k, v), {"query": q}) is None  # given twice
    assert whole.single(torch.add, (q, k), {}) is None
    monkeypatch.setattr(whole, "LINEAR", True)  # the gate alone (``named`` is pinned by a simulate above)
    x, w, b = _v(5, 4, 8), _v(3, 8), _v(3)
    assert whole.single(F.linear, (x, w), {"bias": b}) is None  # the provenance needs them named by the model
    w._td_path, b._td_path = "lin.weight", "lin.bias"
    assert whole.single(F.linear, (x, w), {"bias": b}) == (aten.linear.default, (x, w, b), {})
    assert whole.single(F.linear, (x, w, _v(3, dtype=torch.float32)), {}) is None
    assert whole.single(F.linear, (q, w, b), {}) is None  # a 4-d input
    assert whole.single(F.linear, (x.transpose(0, 1), w, b), {}) is None  # not contiguous
    monkeypatch.setattr(whole, "LINEAR", False)
    assert whole.single(F.linear, (x, w, b), {}) is None
    monkeypatch.setattr(whole, "ENABLED", False)
    assert whole.single(F.scaled_dot_product_attention, (q, k, v), {}) is None

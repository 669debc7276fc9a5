"""The per-run table of meta-kernel outputs (``_virtual.kernels``) saves time and never a finding: the same
problems, paths, messages and op counts with and without it, on the zoo and on planted bugs, with every value on
meta so that the table is really used; errors are never remembered; recalled outputs are what the kernel makes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import zoo
from torch import nn

import torchdoctor
from torchdoctor._virtual import dispatch as D
from torchdoctor._virtual import kernels
from torchdoctor._virtual import tensor as V

aten = torch.ops.aten
BF = torch.bfloat16


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def test_only_ops_with_fresh_outputs_are_remembered() -> None:
    assert kernels.cacheable(aten.mul.Tensor) and kernels.cacheable(aten.native_layer_norm.default)
    assert kernels.cacheable(aten.max.dim) and kernels.cacheable(aten._to_copy.default)
    for op in (aten.view.default, aten.transpose.int, aten.add_.Tensor, aten.add.out, aten.split.Tensor,
               aten.nonzero.default, aten.masked_select.default, aten.unique_consecutive.default):
        assert not kernels.cacheable(op), op


@pytest.mark.parametrize("call", [
    lambda: (aten.mul.Tensor, [_meta(2, 3, dtype=BF), _meta(3)], {}),
    lambda: (aten.mul.Tensor, [_meta(2, 3, dtype=torch.int64), 2.0], {}),
    lambda: (aten.mul.Tensor, [_meta(2, 3, dtype=torch.int64), 2], {}),
    lambda: (aten.add.Tensor, [_meta(4, 1, 5).as_strided((4, 1, 5), (1, 20, 4)), _meta(4, 6, 5)], {"alpha": 2}),
    lambda: (aten.convolution.default, [_meta(1, 3, 8, 8).to(memory_format=torch.channels_last), _meta(4, 3, 3, 3),
                                        None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1], {}),
    lambda: (aten.native_layer_norm.default, [_meta(2, 5, dtype=BF), [5], _meta(5), _meta(5), 1e-5], {}),
    lambda: (aten.max.dim, [_meta(3, 7), 1], {}),
    lambda: (aten._to_copy.default, [_meta(3, 7)], {"dtype": BF}),
    lambda: (aten.cat.default, [[_meta(2, 3), _meta(4, 3)]], {}),
], ids=["broadcast", "int*float", "int*int", "strided", "channels_last", "layer_norm", "max_dim", "to_copy", "cat"])
def test_recalled_outputs_are_what_the_kernel_makes(call: Any) -> None:
    func, args, kwargs = call()
    fresh = func(*args, **kwargs)
    table: dict[Any, Any] = {}
    k = kernels.key(func, args, kwargs)
    assert k is not None
    kernels.remember(table, k, fresh)
    again = kernels.recall(table[k])

    def meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return (x.shape, x.stride(), x.dtype, x.device, x.storage_offset())
        return type(x), [meta(y) for y in x]

    assert meta(again) == meta(fresh)
    assert all(a is not b for a, b in zip(again, fresh)) if isinstance(fresh, tuple) else again is not fresh


def test_keys_tell_values_and_metadata_apart() -> None:
    x = _meta(2, 3, dtype=torch.int64)
    keys = {kernels.key(aten.mul.Tensor, [x, v], {}) for v in (2, 2.0, True)}
    keys |= {kernels.key(aten.mul.Tensor, [_meta(2, 3), 2], {}), kernels.key(aten.mul.Tensor, [x.t(), 2], {})}
    assert len(keys) == 5
    assert kernels.key(aten.mul.Tensor, [torch.ones(2), 2], {}) is None  # values on cpu: the kernel reads them
    assert kernels.key(aten.mul.Tensor, [x, object()], {}) is None


def test_a_key_read_from_the_wrappers_is_the_key_of_what_the_kernel_is_given() -> None:
    # the op path looks the table up from the wrappers before it unwraps them: the same key, or None
    space, dev = V.Space("meta", "cuda"), torch.device("cuda", 1)
    prev = V.swap_space(space)
    try:
        w = [V.make(V.VirtualTensor, _meta(2, 3, dtype=BF), dev), V.make(V.VirtualTensor, _meta(3), dev),
             V.make(V.VirtualTensor, _meta(4, 6, 5).as_strided((4, 1, 5), (30, 5, 1), 5), dev)]
        real = V.make(V.VirtualTensor, torch.ones(3), dev)  # a small real tensor: a meta twin once unwrapped
        calls = [(aten.mul.Tensor, [w[0], w[1]], {}), (aten.add.Tensor, [w[2], w[2]], {"alpha": 2}),
                 (aten.cat.default, [[w[0], w[0]], 1], {}), (aten.cat.default, [(w[1], _meta(3))], {}),
                 (aten.mul.Tensor, [w[0], 2.0], {}), (aten.mul.Tensor, [w[1], real], {}),
                 (aten.stack.default, [[[w[0]]]], {}), (aten.mul.Tensor, [w[1], object()], {})]
        for func, args, kwargs in calls:
            owner: dict[int, Any] = {}
            on_meta = any(getattr(a, "_td_elem", torch.ones(0)).is_meta for a in args)
            unwrapped = [D._unwrap(a, on_meta, owner, {}) for a in args]
            slow = kernels.key(func, unwrapped, {k: D._unwrap(v, on_meta, owner, {}) for k, v in kwargs.items()})
            fast = kernels.virtual_key(func, args, kwargs, V.VirtualTensor)
            assert fast == slow or (fast is None and any(a is real for a in args)), (func, fast, slow)
    finally:
        V.swap_space(prev)
    assert fast is None and slow is None  # an object no key reads


def _findings(report: Any) -> list[tuple[Any, ...]]:
    return [(p.kind, p.path, p.found, p.expected, p.message, p.op, p.module_path) for p in report.problems]


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Remembered answers used, counted for the test (the list's one item): ``kernels.recall`` (a tuple of outputs)
    and the op path's own making of one output from the table's answer (``dispatch._answered``)."""
    hits = [0]
    recall, answered = kernels.recall, D._answered

    def counted(entry: Any) -> Any:
        hits[0] += 1
        return recall(entry)

    def counted_one(*args: Any) -> Any:
        hits[0] += 1
        return answered(*args)

    monkeypatch.setattr(kernels, "recall", counted)
    monkeypatch.setattr(D, "_answered", counted_one)
    return hits


def test_one_output_made_from_the_table_is_what_recall_and_wrap_make() -> None:
    # the op path makes a single output's wrapper straight from the remembered size, stride and dtype
    out = aten.add.Tensor(_meta(4, 1, 5).as_strided((4, 1, 5), (1, 20, 4)), _meta(4, 6, 5))
    entry = kernels._shape_of(out, set())
    space = V.Space("meta", "cuda")
    dev = torch.device("cuda", 1)
    prev = V.swap_space(space)
    try:
        made = D._answered(entry, dev, "w", space, aten.add.Tensor, [], {})
        wrapped = D._wrap(kernels.recall(entry), dev, {}, "w")
    finally:
        V.swap_space(prev)

    def meta(x: Any) -> Any:
        return (x.shape, x.stride(), x.dtype, x.device, x.storage_offset(), x.requires_grad, type(x))

    assert meta(made) == meta(wrapped) and meta(made._td_elem) == meta(wrapped._td_elem) == meta(out)
    assert (made._td_device, made._td_path, made._td_origin) == (wrapped._td_device, "w", None)
    assert made._td_elem is not out


def _both_ways(monkeypatch: pytest.MonkeyPatch, run: Any) -> tuple[Any, Any, int]:
    """``run()`` with the table and without it, every value on meta; returns both reports and the hits."""
    monkeypatch.setattr(V, "SMALL", 0)  # every tensor a meta twin, as with a real model's weights
    hits = counting(monkeypatch)
    monkeypatch.setattr(kernels, "ENABLED", False)
    without = run()
    assert hits[0] == 0
    monkeypatch.setattr(kernels, "ENABLED", True)
    with_ = run()
    return without, with_, hits[0]


def _same(without: Any, with_: Any) -> None:
    assert _findings(with_) == _findings(without)
    assert (with_.ops, with_.stopped, with_.ok) == (without.ops, without.stopped, without.ok)


@pytest.mark.parametrize("name", zoo.NAMES)
def test_zoo_finds_the_same_with_and_without_the_table(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    built = zoo.build(name, BF)
    without, with_, hits = _both_ways(monkeypatch, lambda: torchdoctor.simulate(
        built.target(), device="cuda:1", data="meta"))
    _same(without, with_)
    assert hits > 0 or with_.ops < 20


def _llama_with_fp32_layers() -> Any:
    model = zoo.tiny_llama(BF, num_hidden_layers=3)
    for i in (0, 2):  # two layers with the same shapes: the second meets the table's answer for the first
        down = model.model.layers[i].mlp.down_proj
        down.weight.data = down.weight.data.float()
    norm = model.model.layers[1].input_layernorm
    norm.weight = nn.Parameter(norm.weight.detach().to("meta"))  # a leftover on meta among loaded weights
    return model


def test_planted_bugs_in_repeated_layers_are_found_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    model = _llama_with_fp32_layers()
    without, with_, hits = _both_ways(monkeypatch, lambda: torchdoctor.simulate(
        model, {"input_ids": ids}, device="cuda:1"))
    _same(without, with_)
    assert hits > 50
    paths = {p.path for p in with_.problems}
    assert {"model.layers.0.mlp.down_proj.weight", "model.layers.2.mlp.down_proj.weight",
            "model.layers.1.input_layernorm.weight"} <= paths, _findings(with_)


class _Twice(nn.Module):
    """The same bad matmul twice (a shape error of the user's code), then a good one twice."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(300, 300))
        self.errors: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            try:
                x @ self.w[:7]
            except RuntimeError as e:
                self.errors.append(str(e).splitlines()[0])
        return (x @ self.w) @ self.w


def test_an_error_of_the_kernel_is_never_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _Twice()

    def run() -> Any:
        return torchdoctor.simulate(model, (torch.randn(2, 300),), device="cuda:1")

    errors: list[list[str]] = []
    original = _Twice.forward

    def recording(self: _Twice, x: torch.Tensor) -> torch.Tensor:  # simulate runs a copy: its errors, read here
        out = original(self, x)
        errors.append(list(self.errors))
        return out

    monkeypatch.setattr(_Twice, "forward", recording)
    without, with_, hits = _both_ways(monkeypatch, run)
    _same(without, with_)
    assert with_.ok and hits >= 1
    assert errors[0] == errors[1] and len(errors[1]) == 2, errors
    assert "must have same reduction dim" in errors[1][1]

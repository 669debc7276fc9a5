"""Unusual tensors and the odd places they hide, built fresh for each use (shared by the tests of this folder)."""

from __future__ import annotations

import collections
import functools
import warnings
from collections.abc import Callable

import torch
from torch import nn


def _nested(layout: torch.layout) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=layout)


def _quiet(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    def make() -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()

    return make


TENSORS: dict[str, Callable[[], torch.Tensor]] = {
    "dense": lambda: torch.randn(2, 4),
    "nested_strided": lambda: _nested(torch.strided),
    "nested_jagged": lambda: _nested(torch.jagged),
    "sparse_coo": _quiet(lambda: torch.randn(3, 4).to_sparse()),
    "sparse_csr": _quiet(lambda: torch.randn(3, 4).to_sparse_csr()),
    "qint8": _quiet(lambda: torch.quantize_per_tensor(torch.randn(2, 4), 0.1, 0, torch.qint8)),
    "quint8_per_channel": _quiet(lambda: torch.quantize_per_channel(
        torch.randn(2, 4), torch.tensor([0.1, 0.2]), torch.tensor([0, 0]), 0, torch.quint8)),
    "complex64": lambda: torch.randn(2, 4, dtype=torch.complex64),
    "float64": lambda: torch.randn(2, 4, dtype=torch.float64),
    "int64": lambda: torch.arange(8).reshape(2, 4),
    **{f"fp8_{str(d).split('.')[-1]}": (lambda d=d: torch.randn(2, 4).to(d))
       for d in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
                 getattr(torch, "float8_e8m0fnu", None)) if d is not None},
}


def _closure(t: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: t


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


# where a tensor sits: (name, function putting it on a module, the path the walker gives it)
PLACES: dict[str, tuple[Callable[[nn.Module, torch.Tensor], None], str]] = {
    "attribute": (lambda m, t: setattr(m, "t", t), "t"),
    "buffer": (lambda m, t: m.register_buffer("t", t), "t"),
    "list": (lambda m, t: setattr(m, "box", [t]), "box.0"),
    "set": (lambda m, t: setattr(m, "box", {t}), "box.0"),
    "frozenset": (lambda m, t: setattr(m, "box", frozenset([t])), "box.0"),
    "deque": (lambda m, t: setattr(m, "box", collections.deque([1, t])), "box.1"),
    "dict_key": (lambda m, t: setattr(m, "box", {t: "v"}), "box.<key 0>"),
    "partial_arg": (lambda m, t: setattr(m, "box", functools.partial(torch.add, t)), "box.args.0"),
    "partial_kw": (lambda m, t: setattr(m, "box", functools.partial(torch.add, other=t)), "box.keywords.other"),
    "closure": (lambda m, t: setattr(m, "box", _closure(t)), "box.__closure__.t"),
    "default": (lambda m, t: setattr(m, "box", eval("lambda x, w=w: x", {"w": t})), "box.__defaults__.0"),
}


def holder(kind: str, place: str = "attribute") -> tuple[nn.Module, str]:
    m = Holder()
    put, path = PLACES[place]
    put(m, TENSORS[kind]())
    return m, path

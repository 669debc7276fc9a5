"""A torch warning given with a stack level (``F.softmax`` without ``dim`` warns with ``stacklevel=3``) is shown in a
virtual run where it is shown without one: the run's function mode calls the op again from its own frames, which
the level must not count, or the warning lands in ``torch/nn/functional.py``."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

import torchdoctor


def _where(body: Callable[[], Any], run: bool) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda m, c, f, n, file=None, line=None: seen.append((f, n))
        if run:
            with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False):
                body()
        else:
            body()
    return seen


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _functional() -> None:
    x = torch.randn(2, 3, device=_device())
    torch.nn.functional.softmax(x)  # implicit dim


def _module() -> None:
    x = torch.randn(2, 3, device=_device())
    torch.nn.Softmax()(x)  # dim=None: warns from inside Module.__call__ with its own level


def test_softmax_without_dim_warns_at_the_programs_line_in_a_run() -> None:
    line = (__file__, _functional.__code__.co_firstlineno + 2)
    assert _where(_functional, run=False) == [line]
    assert _where(_functional, run=True) == [line]  # was torch/nn/functional.py:2125


def test_a_module_level_warning_lands_in_the_file_it_lands_in_without_the_run() -> None:
    plain = _where(_module, run=False)
    assert len(plain) == 1 and plain[0][0].endswith("/torch/nn/modules/module.py")  # torch's own level, as it is
    run = _where(_module, run=True)  # (the line differs: the run's global module hooks take Module's slow path)
    assert [f for f, _ in run] == [plain[0][0]]  # was torch/overrides.py, the run's function mode

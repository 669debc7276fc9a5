"""A torch warning raised while a virtual run handles the program's call (torch's C++ warnings take the innermost
Python frame, which is the run's own dispatch) is shown at the program's line, as without the run; the run's own
speed note of a T4's emulated bf16 matmul at the frame that called the op, never a line of torchdoctor."""

from __future__ import annotations

import warnings
from typing import Any

import torch

import torchdoctor

HERE = __file__


def _shown(body: Any, **kw: Any) -> list[tuple[str, int, str]]:
    seen: list[tuple[str, int, str]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda m, c, f, n, file=None, line=None: seen.append((f, n, str(m)))
        if kw:
            with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False, **kw):
                body()
        else:
            body()
    return seen


def _copy_construct() -> None:
    a = torch.ones(3, device="cuda") if torch.cuda.is_available() else torch.ones(3)
    torch.tensor(a)  # torch advises .detach().clone()


def test_a_torch_warning_in_a_run_is_shown_at_the_programs_line() -> None:
    line = _copy_construct.__code__.co_firstlineno + 2
    plain = _shown(_copy_construct)
    assert [(f, n) for f, n, _ in plain] == [(HERE, line)]
    run = _shown(_copy_construct, profile="h100")
    assert [(f, n) for f, n, m in run if "copy construct" in m] == [(HERE, line)]  # was _virtual/runtime.py:316


def test_the_speed_note_of_an_emulated_bf16_matmul_is_shown_in_the_program() -> None:
    def matmul() -> None:
        lin = torch.nn.Linear(8, 8).to("cuda", torch.bfloat16)
        lin(torch.randn(2, 8, device="cuda", dtype=torch.bfloat16))

    notes = [(f, m) for f, _, m in _shown(matmul, profile="t4") if "tensor cores" in m]
    assert len(notes) == 1 and "/src/torchdoctor/" not in notes[0][0]  # the frame that called the op (nn.Linear's)
    assert "bfloat16 matmul runs by emulation, several times slower than float16" in notes[0][1]

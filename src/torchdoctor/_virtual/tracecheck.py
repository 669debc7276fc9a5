"""``torch.jit.trace``'s own check inside a virtual run: it compares values the run does not hold.

By default ``torch.jit.trace`` traces the function a second time and compares the two traces: their outputs, as
numbers, and their graphs, as text. A virtual run holds no values for most tensors (meta), and a graph prints a
tensor constant of ten elements or fewer by its values: a plain tensor attribute of a model copied for
``simulate(call=...)`` is a virtual tensor with no storage, so printing it raised ``The tensor has a non-zero number
of elements, but its data is not allocated yet`` out of torch's ``_check_trace``, a traceback in place of a
report. In a run, the check runs as far as the run's tensors let it: a comparison that needs values the run does
not hold is skipped (it says nothing about placement), and every other failure of the check (a graph that differs
between the two traces) raises as it would on the machine. The trace itself, and everything the run records of
it, is untouched.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from torchdoctor._virtual import tensor as V

_NO_VALUES = ("data is not allocated yet", "Cannot copy out of meta tensor", "meta tensor", "Tensor.item() cannot",
              "cannot be called on meta tensors")


def _holds_no_values(exc: BaseException) -> bool:
    text = str(exc)
    return any(s in text for s in _NO_VALUES)


def install(installs: Any) -> None:
    """Put the run's trace check in ``torch.jit._trace`` for the threads of this run (``Installs.set``)."""
    module = torch.jit._trace
    original = module.__dict__.get("_check_trace")
    if original is None:  # another torch: nothing to stand in for
        return

    def check_trace(*args: Any, **kwargs: Any) -> Any:
        if V.current_space() is None:
            return original(*args, **kwargs)
        with warnings.catch_warnings():
            # the outputs of the two traces hold no values in a virtual run: "does not match" says nothing here
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning,
                                    message=r"Output nr \d+\. of the traced function does not match")
            try:
                return original(*args, **kwargs)
            except (RuntimeError, NotImplementedError) as exc:
                if _holds_no_values(exc):
                    return None  # the check needed values (a constant printed, outputs compared) the run lacks
                raise

    installs.set(module, "_check_trace", check_trace)

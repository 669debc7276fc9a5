"""Storage dtypes kept by a verb's own cast: ``simulate(dtype=...)``, ``virtual_devices(dtype=...)`` and the CLI's
``--dtype`` cast the floating compute weights of what they check, never float8 or packed storage.

``Module.to(torch.bfloat16)`` casts every floating tensor, float8 included (torch counts it as floating), so a
verb that cast the object with it checked a bf16 model instead of the fp8 one the program runs: a layer that
dequantizes per call (``self.weight.to(self.scale.dtype) * self.scale``) was checked on weights it never holds.
Integer storage (GGUF, bitsandbytes) is never cast by ``Module.to``. Inside ``kept()`` the run's moves keep a
float8 or packed tensor's dtype when asked for another one; a program's own ``.to(dtype)`` outside it is as torch does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from torchdoctor._placement import PACKED_DTYPES

_ON = threading.local()


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """The verb's own cast of the object it checks: float8 and packed storage keep their dtype (this thread)."""
    before = getattr(_ON, "on", False)
    _ON.on = True
    try:
        yield
    finally:
        _ON.on = before


def cast_to(have: torch.dtype, want: torch.dtype) -> torch.dtype:
    """The dtype a move asked for ``want`` gives a tensor of dtype ``have``."""
    if have in PACKED_DTYPES and want != have and getattr(_ON, "on", False):
        return have
    return want

"""A fix that trains without loss scaling, applied in a re-run (``simulate(call=)``, the pytest marker): while the
re-run runs, every ``GradScaler`` passes the loss and the step through (``scale`` returns what it is given,
``step(opt)`` is ``opt.step()``, ``unscale_`` and ``update`` do nothing) and an autocast of the fixed device type asked
for float16 computes in bfloat16, as the program would once changed as the fix says (``libfloat``: a GradScaler's own
float64 on a device with no float64 kernels). Put back when the re-run ends; the program's own code is unchanged."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch


@contextlib.contextmanager
def unscaled(fixes: Sequence[Any]) -> Iterator[None]:
    """While a re-run runs: the fixes' device types train in bfloat16 autocast with no GradScaler."""
    types = {t for f in fixes if (t := getattr(f, "noscale", None)) is not None}
    if not types:
        yield
        return
    scaler, autocast = torch.amp.GradScaler, torch.amp.autocast_mode.autocast
    saved = {name: scaler.__dict__[name] for name in ("scale", "unscale_", "step", "update")}
    init = autocast.__init__

    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        return optimizer.step(*args, **kwargs)

    def bf16_init(self: Any, device_type: str, dtype: Any = None, *args: Any, **kwargs: Any) -> None:
        if device_type in types and dtype == torch.float16:
            dtype = torch.bfloat16
        init(self, device_type, dtype, *args, **kwargs)

    def nothing(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    patches: dict[str, Any] = {"scale": lambda self, outputs: outputs, "unscale_": nothing, "step": step,
                               "update": nothing}
    try:
        for name, fn in patches.items():
            setattr(scaler, name, fn)
        autocast.__init__ = bf16_init  # type: ignore[method-assign]
        yield
    finally:
        for name, fn in saved.items():
            setattr(scaler, name, fn)
        autocast.__init__ = init  # type: ignore[method-assign]

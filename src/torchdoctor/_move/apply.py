"""``move``: carry out a plan unit by unit, with an undo log, then verify nothing was left behind.

``torchdoctor._move.plan`` decides what moves where (and what is refused); this module changes the object. Rollback
modes are described in ``move``'s docstring and in ``torchdoctor._move.plan``.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import torch

from torchdoctor._move import owners as q
from torchdoctor._move.plan import MoveReport, Moved, _Plan, build
from torchdoctor._placement import compact, device_str, dtype_str, parse_device, parse_dtype
from torchdoctor._report.model import PlacementError
from torchdoctor._report.text import format_error

__all__ = ["move"]


def _mode(rollback: bool | str) -> str:
    if rollback is True or rollback == "exact":
        return "exact"
    if rollback is False or rollback == "off":
        return "off"
    if rollback == "auto":
        return "auto"
    raise ValueError(f"rollback must be 'auto', 'exact' (or True) or False, not {rollback!r}")


def _failure(exc: BaseException, path: str, done: list[Moved], log: q.UndoLog, total: int) -> PlacementError:
    n = len(done)
    what = type(exc).__name__ + (f": {str(exc).splitlines()[0]}" if str(exc).strip() else "")
    rows = [f"{m.path}  {m.src} -> {m.dst}" for m in done]
    if log.mode == "off":
        return PlacementError(format_error(
            f"move failed at {path} after {n} tensor(s) ({what}); NOT rolled back (rollback=False): these {n} of "
            f"{total} moved, the rest are where they were", rows))
    try:
        log.rollback()
    except Exception as undo_exc:  # the loudest case: say exactly that the object is half-moved
        return PlacementError(format_error(
            f"move failed at {path} after {n} tensor(s) ({what}), and rolling back failed too "
            f"({type(undo_exc).__name__}: {undo_exc}): the object IS half-moved; these moved:", rows))
    if log.lossy:
        return PlacementError(format_error(
            f"move failed at {path} after {n} tensor(s) ({what}); rolled back: every tensor has its old device "
            f"and dtype again, but these {len(log.lossy)} were cast down and back and lost precision",
            log.lossy[::-1], "torchdoctor.move(obj, ..., rollback='exact')  # keeps the originals until the move is done"))
    return PlacementError(f"move failed at {path} after {n} tensor(s) ({what}); rolled back: the object is as before")


def move(obj: Any, device: str | torch.device | int | None = None, dtype: str | torch.dtype | None = None, *,
         non_blocking: bool = False, keep_fp32: bool = True, rollback: bool | str = "auto") -> MoveReport:
    """Move every tensor reachable from ``obj`` to ``device`` and cast its floating tensors to ``dtype``, in place.

    Reaches what ``Module.to`` misses (tensor attributes, list-held modules, quant_state, 8-bit state,
    containers), keeps ``Parameter`` objects and tied weights, never casts integer / packed / quantization
    tensors, keeps ``_keep_in_fp32_modules`` and fp32 peft adapters in fp32 (``keep_fp32=False`` casts what
    ``Module.to`` casts), verifies with ``scan``. Refuses up front (nothing moved) under accelerate offload
    hooks or with meta tensors to materialise; undoes everything when a tensor fails part-way.

    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> m.scale = torch.ones(2)            # Module.to leaves this behind
    >>> [(row.path, row.dst) for row in move(m, "meta", torch.bfloat16).moved]
    [('0.weight', 'bf16[2,2]@meta'), ('0.bias', 'bf16[2]@meta'), ('scale', 'bf16[2]@meta')]
    >>> m = torch.nn.Linear(2, 2); w = m.weight
    >>> _ = move(m, dtype=torch.bfloat16); m.weight is w, m.weight.dtype
    (True, torch.bfloat16)
    """
    t0 = time.perf_counter()
    dev = parse_device(device) if device is not None else None
    dt = parse_dtype(dtype) if dtype is not None else None
    if dev is None and dt is None:
        raise ValueError("move needs device= and/or dtype=, e.g. torchdoctor.move(model, 'cuda:0', torch.bfloat16)")
    if dt is not None and not (dt.is_floating_point or dt.is_complex):
        raise TypeError(f"move casts floating-point tensors only: dtype must be a floating dtype, not {dt}")
    log = q.UndoLog(_mode(rollback))
    p = build(obj, dev, dt, keep_fp32)
    p.raise_refusals()
    done: list[Moved] = []
    cursor = [""]
    try:
        total = _apply(p, log, done, cursor, non_blocking)
    except BaseException as exc:
        err = _failure(exc, cursor[0], done, log, len(p.steps))
        # the traceback's frames hold the new copies (on the target device): drop them with the failed move
        traceback.clear_frames(exc.__traceback__)
        if not isinstance(exc, Exception):
            raise
        raise err from exc
    kept = p.kept
    log.undo.clear()  # undo closures point back at the log: clearing frees kept originals now, not at the next gc
    del p, log
    left = _verify(obj, dev, dt, keep_fp32)
    if left:
        raise PlacementError(format_error(f"move finished but {len(left)} tensor(s) were left behind", left,
                                          "torchdoctor.scan(obj, device=..., dtype=...)  # for the details"))
    return MoveReport(done, device_str(dev) if dev is not None else None, dtype_str(dt) if dt is not None else None,
                      kept=kept, storage_bytes=total, seconds=time.perf_counter() - t0)


def _apply(p: _Plan, log: q.UndoLog, done: list[Moved], cursor: list[str], non_blocking: bool) -> int:
    """Move unit by unit, recording undo steps; returns the bytes now held (each storage once)."""
    swapped: dict[int, torch.Tensor] = {}
    total = 0
    for unit in p.units():
        cursor[0] = unit[0].entry.path
        before = [compact(t.dtype, tuple(t.shape), t.device) for t in (s.entry.tensor for s in unit)]
        news = q.new_tensors([(s.entry.tensor, s.device, s.dtype) for s in unit], non_blocking)
        total += news[0].untyped_storage().nbytes() if len(unit) > 1 else _nbytes(news[0])
        for s, new, src in zip(unit, news, before):
            cursor[0] = s.entry.path
            q.install(s.entry, s.aliases, new, s.device, s.dtype, log, swapped, non_blocking)
            done.append(Moved(s.entry.path, src, compact(s.dtype, tuple(new.shape), s.device), _nbytes(new)))
    return total


def _nbytes(t: torch.Tensor) -> int:
    try:
        return t.nelement() * t.element_size()
    except Exception:
        return 0


def _verify(obj: Any, device: torch.device | None, dtype: torch.dtype | None, keep_fp32: bool) -> list[str]:
    """Paths left behind: a fresh plan must be empty, and scan must find nothing on another device or on meta."""
    from torchdoctor._scan.scan import scan

    left = [str(s) for s in build(obj, device, dtype, keep_fp32).public()]
    if device is not None:
        for prob in scan(obj, device=device, strict=True).problems:
            if prob.kind in ("device", "meta") and not any(x.startswith(prob.path + "  ") for x in left):
                left.append(f"{prob.path}  {prob.message}")
    return left

"""``scan``: which tensors sit on the wrong device or in the wrong dtype, by path; and ``assert_placement``.

What counts as wrong is decided by the one placement policy (``torchdoctor._scan.policy``); this module walks,
asks the policy, and builds the report.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from dataclasses import replace
from typing import Any

import torch

from torchdoctor._report.model import ScanReport, Target, summarize_rows, summary_of
from torchdoctor._placement import compact, device_str, dtype_str, parse_device, parse_dtype

log = logging.getLogger("torchdoctor.scan")


def scan(obj: Any, device: str | torch.device | int | None = None, dtype: str | torch.dtype | None = None, *,
         strict: bool = False) -> ScanReport:
    """Every tensor reachable from ``obj`` and the ones on the wrong device or in the wrong dtype, by path.

    ``obj`` is a module, a pipeline-like object, a dict/list of them, a ``Target``, or a checkpoint path.
    Without ``device``/``dtype`` each component's expectation is what it declares (transformers ``config.dtype``)
    or a vote of its layers (``report.expected`` says which rule decided). ``strict`` also judges
    tensors of non-module objects (e.g. a scheduler's) against ``device``/``dtype``. Read-only.

    >>> m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    >>> m[1].bias.data = m[1].bias.data.double()
    >>> [(p.kind, p.path) for p in scan(m).problems]
    [('dtype', '1.bias')]
    """
    if isinstance(obj, Target):
        obj = obj.obj
    dev = parse_device(device) if device is not None else None
    dt = parse_dtype(dtype) if dtype is not None else None
    if dt is not None and not (dt.is_floating_point or dt.is_complex):
        raise ValueError(f"scan judges floating-point tensors against dtype=, so it must be a floating dtype such as "
                         f"torch.bfloat16, not {dt} (integer and bool tensors never have a dtype expectation)")
    if not isinstance(obj, torch.nn.Module) and isinstance(obj, (str, os.PathLike)):  # (an ABC's check: ~0.5 us)
        from torchdoctor._checkpoint.scan import scan_checkpoint

        return scan_checkpoint(obj, device=dev, dtype=dt)
    # imported past the path branch: a checkpoint's first scan never pays for the object machinery
    optimizer_problems, pipeline_problems, Policy, walk, SCRIPTED, kept_walk = _MACHINERY or _machinery()

    # Every object scan allocates (entries, rows, problems) survives into the report; pausing the cyclic GC
    # (restored after, as the checkpoint reader does) keeps a collection of the user's whole heap out of the scan.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        # a module scanned again reuses its last walk where flat re-reads prove the tree unchanged
        w = kept_walk(obj, walk) if isinstance(obj, torch.nn.Module) else walk(obj)
        policy = Policy(w, dev, dt, strict, summary=True)
        policy.subject = obj
        problems = pipeline_problems(obj, policy) + _with_trace_notes(
            policy.judge() + optimizer_problems(obj, w), w) + list(w.problems)
        if any(map(SCRIPTED.get, w.types)):  # constants a trace baked into a module's code
            from torchdoctor._scan.scripted import constant_problems

            problems += constant_problems(policy)
        rows = policy.rows
        expected = {c.path: _expected_row(c) for c in reversed(policy.components)}
        groups = policy.groups
        if groups is not None and len(groups) == 1:  # one device and dtype: ``summary_of``'s one row, made here
            ((dev_, dt_), (n_, nbytes_)), = groups.items()
            summary: tuple[dict[str, Any], ...] = (
                {"device": device_str(dev_), "dtype": dtype_str(dt_), "tensors": n_, "nbytes": nbytes_},)
        elif groups is not None:  # no storage to share: grouped in the policy's pass
            summary = summary_of(groups)
        else:
            with torch._C.DisableTorchFunction():  # storage keys of real tensors, also inside a virtual-device run
                summary = summarize_rows(rows, [_real(e.tensor) for e in w.entries])
        # TensorInfo objects are made from the rows when report.tensors is first read
        report = ScanReport.of_rows(rows, tuple(problems), expected, type(obj).__name__, w.truncated, summary)
        if isinstance(obj, dict) and rows:  # components by key: a fix reads obj['model'].to(...)
            report.extra["keyed"] = True
        if policy.computed16 and policy.casting:  # computed buffers a forward upcasts, rounded by a cast: notes
            from torchdoctor._scan.rounded import rounded_notes

            try:
                notes = rounded_notes(policy)
            except Exception:  # a note is extra: the report stands without it
                log.debug("rounded-buffer notes failed", exc_info=True)
                notes = []
            if notes:
                report.extra["notes"] = [n.to_dict() for n in notes]
        return report
    finally:
        if gc_was_enabled:
            gc.enable()
        if log.isEnabledFor(logging.INFO) and "w" in locals() and "problems" in locals():
            log.info("scanned %s: %d tensor paths, %d problem(s)", type(obj).__name__, len(w.entries), len(problems))


_MACHINERY: tuple[Any, ...] = ()  # what an object's scan uses, imported at its first call (five imports a call
# were a few microseconds of every scan)


def _machinery() -> tuple[Any, ...]:
    global _MACHINERY
    from torchdoctor._scan.optim import optimizer_problems
    from torchdoctor._scan.pipeline import pipeline_problems
    from torchdoctor._scan.policy import Policy
    from torchdoctor._walk import kept_walk, walk
    from torchdoctor._walk.kinds import SCRIPTED

    _MACHINERY = (optimizer_problems, pipeline_problems, Policy, walk, SCRIPTED, kept_walk)
    return _MACHINERY


def _with_trace_notes(problems: list[Any], w: Any) -> list[Any]:
    """When a ``torchdoctor.trace`` is recording, each problem says which call last moved or cast its tensor."""
    if not problems:
        return problems
    try:
        _trace = sys.modules.get("torchdoctor._trace")  # never imported: no trace can be recording
        if _trace is None or not _trace.active():
            return problems
        tensors = {e.path: e.tensor for e in w.entries}
        out = []
        for p in problems:
            note = _trace.note_for(tensors[p.path]) if p.path in tensors else None
            out.append(replace(p, message=f"{p.message} ({note})") if note else p)
        return out
    except Exception:  # the trace is extra: the problems stand without it
        log.debug("trace notes failed", exc_info=True)
        return problems


def _real(t: torch.Tensor) -> torch.Tensor | None:
    """The tensor when its storage can be read (a virtual tensor's cannot: it is counted without dedup)."""
    tp = type(t)
    if tp is torch.Tensor or tp is torch.nn.Parameter:
        return t
    return None if hasattr(tp, "_td_device") else t


def _expected_row(c: Any) -> dict[str, str]:
    row = {"device": device_str(c.device) if c.device else "none", "dtype": dtype_str(c.dtype) if c.dtype else "none",
           "device_rule": c.device_rule, "dtype_rule": c.dtype_rule}
    if c.offload is not None:
        row["offloaded"] = f"moved to {device_str(c.offload)} at call by {c.offload_by}"
    return row


def assert_placement(obj: Any, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None) -> None:
    """Fail with the paths found and expected, like pytest's own assertion explanations.

    >>> assert_placement(torch.nn.Linear(2, 2), device="cpu", dtype=torch.float32)
    """
    _check_subject(obj, "assert_placement")
    report = scan(obj, device=device, dtype=dtype)
    if report.ok:
        return
    raise AssertionError(placement_failure_text(report, device, dtype))


def _check_subject(obj: Any, verb: str) -> None:
    """Wrong arguments raise (``assert_placement(None, ...)`` must never pass): what is checked must hold tensors."""
    if obj is None or isinstance(obj, (bool, int, float, complex)) or (
            callable(obj) and not isinstance(obj, (torch.nn.Module, torch.Tensor)) and isinstance(obj, type(_check_subject))):
        what = "None" if obj is None else f"a {type(obj).__name__} ({obj!r:.60})"
        raise TypeError(f"{verb} checks an object that holds tensors (a module, pipeline, tensor, optimizer, dict or "
                        f"list of them, or a checkpoint path), but got {what}: pass the model itself"
                        + (" (call the function first)" if callable(obj) else ""))


def placement_failure_text(report: ScanReport, device: Any = None, dtype: Any = None) -> str:
    want = ", ".join(x for x in (f"device={device_str(device)}" if device else "",
                                  f"dtype={dtype_str(parse_dtype(dtype))}" if dtype else "") if x) or "consistent"
    lines = [f"placement is not {want}: {len(report.problems)} problem(s)"]
    for p in sorted(report.problems, key=lambda p: p.path)[:40]:
        lines.append(f"  {p.path}: found {p.found}, expected {p.expected}  ({p.kind}, {p.role})")
    if len(report.problems) > 40:
        lines.append(f"  ... and {len(report.problems) - 40} more")
    return "\n".join(lines)


__all__ = ["assert_placement", "compact", "scan"]

"""What each side says about one agreement case: the real outcome, the virtual predictions, and every tool.

Each function returns plain JSON-ready dicts and never raises: a tool that breaks is recorded as broken (its
exception type and first line), since one broken tool must not hide the other cases' answers.
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

import torchdoctor
from gpu_agreement_cases import Case

PROFILE = "h200"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


def broken(exc: BaseException) -> dict[str, Any]:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"
    return {"broken": first_line(exc), "at": where}


def resolve(obj: Any, path: str) -> Any:
    """The object at a dotted path (attributes, list indices, dict keys, ``grad``), or None where it breaks."""
    for part in path.split("."):
        try:
            if isinstance(obj, (list, tuple)) and part.isdigit():
                obj = obj[int(part)]
            elif isinstance(obj, dict):
                obj = obj[part]
            elif isinstance(obj, torch.nn.Module) and part in obj._modules:
                obj = obj._modules[part]
            else:
                obj = getattr(obj, part)
        except (AttributeError, IndexError, KeyError):
            return None
    return obj


def tensor_at(obj: Any, path: str | None) -> dict[str, Any] | None:
    """Where the declared culprit really is, read off the real object after the step."""
    if not path:
        return None
    t = resolve(obj, path)
    if not isinstance(t, torch.Tensor):
        return {"path": path, "found": None}
    return {"path": path, "device": str(t.device), "dtype": str(t.dtype).replace("torch.", "")}


def outcome(fn: Callable[[], Any]) -> tuple[dict[str, Any], Any]:
    """Run ``fn``: ``{"raises": bool, "error": exact first line}`` and its result (None when it raised)."""
    try:
        out = fn()
    except Exception as exc:  # the hardware's error text is the evidence
        return {"raises": True, "error": first_line(exc), "exception": exc}, None
    return {"raises": False, "error": None}, out


def real(case: Case, device: str) -> tuple[dict[str, Any], Any]:
    """The user's program on ``device``: its outcome, and where the declared culprit really was."""
    obj = case.make()
    res, out = outcome(lambda: case.step(obj, device))
    res["culprit_at"] = tensor_at(obj, case.culprit)
    return res, (obj, out)


def problems(ps: Any) -> list[dict[str, Any]]:
    return [{"kind": p.kind, "path": p.path, "role": p.role, "found": p.found, "expected": p.expected,
             "tensors": list(p.tensors)[:4]} for p in list(ps)[:6]]


def simulated(case: Case, device: str) -> dict[str, Any]:
    """``simulate`` running the same step on a copy, on virtual ``device`` with the H200's profile."""
    try:
        t0 = time.perf_counter()
        r = torchdoctor.simulate(case.make(), device=device, profile=PROFILE, data=case.data,
                                 call=lambda m: case.step(m, device))
        return {"ok": r.ok, "problems": problems(r.problems), "culprits": r.culprits, "stopped": r.stopped,
                "seconds": round(time.perf_counter() - t0, 3)}
    except Exception as exc:
        return broken(exc)


def virtual(case: Case, device: str) -> dict[str, Any]:
    """``virtual_devices`` around the user's own code: the object made before the block, moved inside it."""
    try:
        obj = case.make()
        with torchdoctor.virtual_devices(device, profile=PROFILE, raise_on_exit=False, data=case.data) as s:
            res, _ = outcome(lambda: case.step(obj, device))
        found = list(s.problems)
        return {"ok": not found and not res["raises"], "problems": problems(found),
                "raised": res["error"]}
    except Exception as exc:
        return broken(exc)


def guarded(case: Case, device: str, mode: str) -> dict[str, Any]:
    """guard in ``mode`` around the real step: what it raised or fixed, and the first tensor it named."""
    try:
        obj = case.make()
        g = torchdoctor.guard(obj, mode=mode)
        try:
            with g:
                case.step(obj, device)
        except torchdoctor.PlacementError as exc:
            named = [p.path for p in exc.problems]
            return {"raised": "PlacementError", "named": named[:4], "headline": str(exc).splitlines()[0][:300]}
        except Exception as exc:  # not a RuntimeError: guard explains it in a note on the user's own exception
            notes = [n for n in getattr(exc, "__notes__", []) if isinstance(n, str)]
            return {"raised": type(exc).__name__, "named": [], "headline": first_line(exc),
                    "noted": notes[0].splitlines()[0][:300] if notes else None}
        return {"raised": None, "named": [f.path for f in g.fixes][:4] or [p.path for p in g.problems][:4],
                "fixes": len(g.fixes)}
    except Exception as exc:
        return broken(exc)


def scanned(obj: Any, device: str) -> dict[str, Any]:
    try:
        r = torchdoctor.scan(obj, device=device)
        return {"ok": r.ok, "named": [p.path for p in r.problems][:4], "count": len(r.problems)}
    except Exception as exc:
        return broken(exc)


def moved(case: Case, device: str) -> dict[str, Any]:
    """move (rollback kept exact) on the real model after the user's step, then scan again."""
    try:
        obj = case.make()
        outcome(lambda: case.step(obj, device))
        try:
            r = torchdoctor.move(obj, device, rollback="exact")
        except Exception as exc:  # a refusal or a rollback: said, with what it left
            return {"moved": None, "refused": first_line(exc), "after": scanned(obj, device)}
        return {"moved": len(r.moved), "after": scanned(obj, device)}
    except Exception as exc:
        return broken(exc)


def traced(case: Case, device: str) -> dict[str, Any]:
    try:
        obj = case.make()
        with torchdoctor.trace(obj) as t:
            outcome(lambda: case.step(obj, device))
        history = None
        if case.culprit:  # a tensor left behind has no move in its history: the trace's evidence
            try:
                history = [f"{r.call}: {r.from_device}->{r.to_device}" for r in t.history(case.culprit)][:3]
            except Exception as exc:
                history = [first_line(exc)]
        return {"records": len(t.records), "culprit_history": history}
    except Exception as exc:
        return broken(exc)


def explained(res: dict[str, Any]) -> dict[str, Any] | None:
    """explain on the real exception (message, chain and frames), as a user pastes it."""
    exc = res.get("exception")
    if exc is None:
        return None
    try:
        report = torchdoctor.explain(exc)
        return {"category": report[0].category if len(report) else None}
    except Exception as e:
        return broken(e)


def first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out:
        return first_tensor(out[0])
    return None


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def overhead(case: Case, device: str, repeats: int) -> dict[str, Any] | None:
    """guard's cost on the real forward (median of paired runs, after a warm call) and that its output is the same.

    Pairs alternate their order so a clock drift or a cache warmed by the first does not favour one side."""
    try:
        # the output compared on two fresh objects, seeded alike: a training step changes its weights each call
        first = case.make()
        torch.manual_seed(0)  # after the build, which may seed itself: the step's own draws start alike
        base = case.step(first, device)
        obj = case.make()
        g = torchdoctor.guard(obj)
        torch.manual_seed(0)
        with g:
            watched = case.step(obj, device)  # also the warm-up of the timed object: its move, first launches
        a, b = first_tensor(base), first_tensor(watched)
        same = a is not None and b is not None and torch.equal(a, b)
        plain: list[float] = []
        guarded_: list[float] = []
        for i in range(repeats):
            order = (False, True) if i % 2 == 0 else (True, False)
            for with_guard in order:
                sync(device)
                t0 = time.perf_counter()
                if with_guard:
                    with g:
                        case.step(obj, device)
                else:
                    case.step(obj, device)
                sync(device)
                (guarded_ if with_guard else plain).append(time.perf_counter() - t0)
        p, q = statistics.median(plain), statistics.median(guarded_)
        return {"plain_ms": round(1000 * p, 3), "guard_ms": round(1000 * q, 3),
                "added_ms": round(1000 * (q - p), 3), "same_output": same}
    except Exception as exc:
        return broken(exc)

"""Where one warm ``simulate`` call's time goes, part by part, on the real-width shapes of ``bench/shapes.py``.

    python bench/simulate_parts.py llama:1 [flux:1 ...] [--calls 20]

Each part is a function wrapped for the run (process CPU time; a part's time is its own, the wrapped parts it calls
taken out), summed over ``--calls`` warm calls and given per call, next to the whole call and a plain meta forward
of the same model. The wrappers cost about a microsecond per call each, so the per-op parts read a little high.
Parts: the steps of ``simulate`` itself (the walk, the virtual copy, the runtime's enter and exit, the model's own
``.to``, the placement scan after it, the forward) and, inside the forward, the runtime's function mode, the op
path, the rules' check per op and the module-entry checks.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # bench/trace.py shadows stdlib trace
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import torchdoctor  # noqa: E402
from torchdoctor import _tracker, _walk as walk_pkg  # noqa: E402
from torchdoctor._scan import scan as scan_mod  # noqa: E402
from torchdoctor._virtual import dispatch, entry, recorder, runtime, simulate as sim_mod  # noqa: E402

CLOCK = time.process_time
SELF: Counter[str] = Counter()
CALLS: Counter[str] = Counter()
_STACK: list[float] = []
_DONE: list[bool] = []  # the module-level parts are wrapped once


def _timed(label: str, f: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        start = CLOCK()
        _STACK.append(0.0)
        try:
            return f(*args, **kwargs)
        finally:
            inner, took = _STACK.pop(), CLOCK() - start
            SELF[label] += took - inner
            CALLS[label] += 1
            if _STACK:
                _STACK[-1] += took
    return run


def wrap_all(model_cls: type) -> dict[str, Any]:
    """The parts, wrapped where ``simulate`` and the runtime look them up; returns what the model's class held
    itself, to put back."""
    for mod, name, label in () if _DONE else ((walk_pkg, "walk", "walk (the user's object)"), (sim_mod, "virtual_copy", "virtual copy"),
                             (scan_mod, "scan", "scan after the move (walk of the copy included)"),
                             (dispatch, "_dispatch_op", "op path (dispatch, kernel table)"),
                             (recorder._Recorder, "check", "rules' check per op (recorder.check)"),
                             (runtime.VirtualMode, "handle", "function mode: handle (moves, factories, the C++ hop)"),
                             (runtime.VirtualMode, "__torch_function__", "function mode: entry (attributes, queries)"),
                             (_tracker.ModuleStack, "_pre", "module entry: the stack"),
                             (entry.EntryCheck, "__call__", "module entry: checks"),
                             (entry, "owned", "module entry: owned tensors"),
                             (entry, "_given", "module entry: inputs kept for proofs")):
        setattr(mod, name, _timed(label, getattr(mod, name)))
    if not _DONE:
        sim_mod.virtual_world = _world(sim_mod.virtual_world)
    _DONE.append(True)
    own = {k: model_cls.__dict__[k] for k in ("to", "__call__") if k in model_cls.__dict__}
    model_cls.to = _timed("the model's .to (the move)", model_cls.to)  # type: ignore[attr-defined]
    model_cls.__call__ = _timed("forward: the model's own code, and what no part below names",  # type: ignore
                                model_cls.__call__)
    return own


def _world(f: Callable[..., Any]) -> Callable[..., Any]:
    @contextlib.contextmanager
    def run(*args: Any, **kwargs: Any) -> Iterator[None]:
        cm = f(*args, **kwargs)
        _timed("runtime enter (virtual_world)", cm.__enter__)()
        try:
            yield
        finally:
            _timed("runtime exit (virtual_world)", cm.__exit__)(None, None, None)
    return run


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["llama:1"])
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("_bench_shapes", os.path.join(_HERE, "shapes.py"))
    assert spec and spec.loader
    shapes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shapes)
    print(f"torch {torch.__version__}, load average {os.getloadavg()[0]:.1f}, {args.calls} warm calls")
    for arg in args.shapes:
        name, _, scale = arg.partition(":")
        model, inputs = shapes.BUILDERS[name](int(scale or 1))
        meta_in = shapes.meta_inputs(inputs)

        def sim() -> Any:
            return torchdoctor.simulate(model, inputs, device="cuda:1", dtype="bfloat16", assume_device="cpu")

        def meta() -> None:
            with torch.no_grad():
                model(**meta_in)

        for _ in range(3):
            sim(), meta()
        plain = []
        for _ in range(args.calls):
            gc.collect()
            start = CLOCK()
            meta()
            plain.append(CLOCK() - start)
        own = wrap_all(type(model))
        SELF.clear(), CALLS.clear()
        whole = 0.0
        for _ in range(args.calls):
            gc.collect()
            start = CLOCK()
            report = sim()
            whole += CLOCK() - start
        n = args.calls
        # the forward's own line: what the model's code and the parts not listed took
        print(f"\n{arg}: {report.ops} ops; simulate {whole / n * 1e3:.2f} ms per call, plain meta forward "
              f"{sorted(plain)[n // 2] * 1e3:.2f} ms (median, unwrapped)")
        for label, t in SELF.most_common():
            print(f"  {t / n * 1e3:7.2f} ms  {CALLS[label] / n:7.0f} calls  {label}")
        print(f"  {(whole - sum(SELF.values())) / n * 1e3:7.2f} ms  simulate's own code and what no part names")
        for k in ("to", "__call__"):  # the wrappers were set on the class: what it held itself goes back
            if k in own:
                setattr(type(model), k, own[k])
            else:
                delattr(type(model), k)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

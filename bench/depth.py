"""The rows that must hold at any depth (issue 43 points 1, 3 and 6): simulate against a plain meta forward and
against FakeTensorMode, and scan against accelerate's pair, on Flux, SDXL-UNet and Llama-3-8B widths built on meta
(``bench/shapes.py``), each at 1x and 4x depth, every anchor in the same process as what it anchors.

``python bench/table.py --only depth`` prints them. A child process measures one shape at one depth; the growth
rows compare the 4x and 1x medians of the same process kind (time at 4x over time at 1x: linear growth reads ~4,
and torchdoctor's growth should stay at or under its anchor's).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch

import torchdoctor


def _shapes() -> Any:
    """``bench/shapes.py``, loaded by path: putting ``bench/`` on ``sys.path`` would let ``bench/trace.py`` shadow
    the standard library's ``trace``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_bench_shapes", os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "shapes.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


shapes = _shapes()

SCALES = (1, 4)


def fake_forward(model: torch.nn.Module, inputs: dict[str, Any]) -> None:
    """FakeTensorMode on fake cpu: every tensor a bf16 fake (float inputs too, as simulate's cast makes them), then
    the forward through ``torch.func.functional_call``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def low(t: torch.Tensor) -> torch.dtype:
        return torch.bfloat16 if t.is_floating_point() else t.dtype

    def fakes(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return torch.empty(x.shape, dtype=low(x))
        if isinstance(x, dict):
            return {k: fakes(v) for k, v in x.items()}
        return x

    with FakeTensorMode(), torch.no_grad():
        params = {n: torch.empty(t.shape, dtype=low(t)) for n, t in [*model.named_parameters(),
                                                                       *model.named_buffers()]}
        torch.func.functional_call(model, params, (), fakes(inputs))


def simulate_triplets(arg: str, n: int, triplet_times: Callable[..., tuple[list[float], ...]]) -> tuple[Any, ...]:
    """``n`` rounds of simulate, a plain meta forward and FakeTensorMode on ``shape:scale``, in this process."""
    name, scale = arg.split(":")
    model, inputs = shapes.BUILDERS[name](int(scale))
    meta_in = shapes.meta_inputs(inputs)

    def sim() -> None:
        rep = torchdoctor.simulate(model, inputs, device="cuda:1", dtype="bfloat16", assume_device="cpu")
        assert rep.ops > 100 and rep.ok, rep

    def meta() -> None:
        with torch.no_grad():
            model(**meta_in)

    return triplet_times(sim, meta, lambda: fake_forward(model, inputs), n)


def scan_pairs(arg: str, n: int) -> tuple[list[float], list[float]]:
    """``n`` interleaved pairs of scan and accelerate's ``named_module_tensors`` + ``find_tied_parameters``."""
    from accelerate.utils import find_tied_parameters, named_module_tensors

    name, scale = arg.split(":")
    model, _ = shapes.BUILDERS[name](int(scale))

    def acc() -> None:
        list(named_module_tensors(model, include_buffers=True, recurse=True))
        find_tied_parameters(model)

    def ours() -> None:
        torchdoctor.scan(model)

    a: list[float] = []
    b: list[float] = []
    for _ in range(2):
        ours()
        acc()
    for i in range(n):
        for fn, out in ((ours, a), (acc, b)) if i % 2 == 0 else ((acc, b), (ours, a)):
            t = time.process_time()
            fn()
            out.append(time.process_time() - t)
    return a, b


def growth(docs: dict[int, list[dict[str, list[float]]]], key: str) -> float:
    """Median time at 4x over median time at 1x, pooled over the processes of each depth."""
    import statistics

    at = {s: statistics.median(x for d in docs[s] for x in d[key]) for s in SCALES}
    return at[SCALES[1]] / at[SCALES[0]]


def rows(n: int, children: Callable[..., list[dict[str, list[float]]]], summary: Callable[..., dict[str, Any]],
         row: Callable[..., None], procs: int = 2) -> None:
    per = max(3, -(-n // procs))
    for name in shapes.BUILDERS:
        docs = {s: children("depth_simulate", f"{name}:{s}", per, procs) for s in SCALES}
        for s in SCALES:
            a = [x for d in docs[s] for x in d["a"]]
            for key, anchor, goal in (("b", "plain meta forward", 1.0), ("c", "FakeTensorMode on fake cpu", 0.9)):
                per_proc = ", ".join(f"x{summary(d['a'], d[key])['ratio']:.2f}" for d in docs[s])
                row(f"simulate {shapes.LABELS[name]} at {s}x, cuda:1 bf16", anchor,
                    summary(a, [x for d in docs[s] for x in d[key]]), goal,
                    note=f"rounds of {len(docs[s])} fresh processes pooled (their medians {per_proc})")
        g_ours, g_meta, g_fake = growth(docs, "a"), growth(docs, "b"), growth(docs, "c")
        print(f"  .. growth 1x -> 4x, {name}: simulate x{g_ours:.2f}, meta forward x{g_meta:.2f}, "
              f"FakeTensorMode x{g_fake:.2f}", flush=True)
        res = {"ratio": g_ours / g_meta, "lo": g_ours / g_meta, "hi": g_ours / g_meta, "n": 1, "ours": g_ours,
               "anchor": g_meta}
        row(f"simulate {name}: growth 4x/1x (time at 4x over time at 1x)", "the meta forward's growth", res, 1.1,
            unit="growth", note="simulate grows faster than the forward it checks")
        scans = {s: children("depth_scan", f"{name}:{s}", max(n, 15), procs) for s in SCALES}
        for s in SCALES:
            a = [x for d in scans[s] for x in d["a"]]
            b = [x for d in scans[s] for x in d["b"]]
            row(f"scan {shapes.LABELS[name]} at {s}x", "accelerate named_module_tensors + find_tied_parameters",
                summary(a, b), 0.9, note=f"pairs of {len(scans[s])} fresh processes pooled")

"""``torchdoctor.move`` against ``Module.to`` for an fp32 -> bf16 cast of a ~110M-parameter model (CPU).

Warm time: one process, one copy of the model per variant, interleaved rounds (the order alternates each round);
each round times one cast per variant and casts back to fp32 untimed. Median time ratios; target (issue 28) <= 1.05.
The machine is shared (2 cores): single casts range 3-5x, so compare medians, and CPU time next to wall time.

Cold time and peak memory: one fresh subprocess per variant and repeat (RSS is per process, and the allocator's
state after a first cast would blur a second one). torchdoctor's modules are imported first (a one-time cost, not
part of a cast), the model is built, ``gc.collect()``, the kernel's peak-RSS counter is reset
(``echo 5 > /proc/self/clear_refs``), then one cast runs, timed (wall and process CPU time); the memory figure is
``VmHWM`` (peak RSS) minus the RSS before the cast.

The model is a GPT-2 shape (transformers ``GPT2LMHeadModel``, 10 layers of 768, vocab 50257, 110M parameters).

    python bench/move.py            # both parts
    python bench/move.py --rounds 9
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

import torchdoctor

VARIANTS = ("Module.to", "move", "move(rollback='exact')")


def build(scale: int = 1) -> torch.nn.Module:
    """The GPT-2 110M shape (10 layers); ``scale=4``: 40 layers, the same widths (the table's 4x row)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_embd=768, n_layer=10 * scale, n_head=12, vocab_size=50257,
                                      n_positions=1024)).eval()


def cast(variant: str, model: torch.nn.Module) -> None:
    if variant == "Module.to":
        model.to(torch.bfloat16)
    elif variant == "move":
        torchdoctor.move(model, dtype=torch.bfloat16)
    else:
        torchdoctor.move(model, dtype=torch.bfloat16, rollback="exact")


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1)) * 1024  # type: ignore[union-attr]


def rss_child(variant: str) -> None:
    import torchdoctor._move.plan  # noqa: F401  one-time imports are not part of a cast (torch's own are loaded too)
    import torchdoctor._scan.scan  # noqa: F401

    model = build()
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = _status("VmRSS")
    c0, t0 = time.process_time(), time.perf_counter()
    cast(variant, model)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = _status("VmHWM")
    print(json.dumps({"before": before, "peak": peak, "after": _status("VmRSS"), "wall": wall, "cpu": cpu}))


def rss(repeats: int) -> dict[str, dict[str, float]]:
    """Cold figures per variant: medians over fresh processes, variant order alternating per repeat."""
    out: dict[str, dict[str, list[float]]] = {v: {k: [] for k in ("before", "peak", "after", "wall", "cpu")}
                                              for v in VARIANTS}
    for r in range(repeats):
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            res = subprocess.run([sys.executable, __file__, "--rss-child", v], capture_output=True, text=True,
                                 check=True)
            doc = json.loads(res.stdout.strip().splitlines()[-1])
            for k in out[v]:
                out[v][k].append(doc[k])
    med = {v: {k: statistics.median(x) for k, x in d.items()} for v, d in out.items()}
    for v in VARIANTS:  # paired: the same repeat's Module.to ran right next to it, under the same load
        med[v]["paired_wall"] = _paired(out[v]["wall"], out["Module.to"]["wall"])
        med[v]["paired_cpu"] = _paired(out[v]["cpu"], out["Module.to"]["cpu"])
    return med


def _paired(xs: list[float], refs: list[float]) -> float:
    return statistics.median(x / r for x, r in zip(xs, refs))


def timing(rounds: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU (process) time per variant. CPU time is the steadier figure on a shared machine."""
    models = {v: build() for v in VARIANTS}
    wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for v, m in models.items():  # warm-up: first-touch page faults, allocator growth
        cast(v, m)
        m.to(torch.float32)
    for r in range(rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for v in order:
            m = models[v]
            c0, t0 = time.process_time(), time.perf_counter()
            cast(v, m)
            wall[v].append(time.perf_counter() - t0)
            cpu[v].append(time.process_time() - c0)
            m.to(torch.float32)  # untimed: back to fp32 for the next round
    return wall, cpu


def overhead(model: torch.nn.Module, n: int = 20) -> tuple[float, float]:
    """Median time of a move / Module.to with nothing to cast: move's walk, plan and verification alone."""
    model.to(torch.bfloat16)
    out = []
    for fn in (lambda: torchdoctor.move(model, dtype=torch.bfloat16), lambda: model.to(torch.bfloat16)):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        out.append(statistics.median(ts))
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=21, help="interleaved rounds of the in-process (warm) timing")
    ap.add_argument("--repeats", type=int, default=9, help="fresh processes per variant (cold timing, peak RSS)")
    ap.add_argument("--rss-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        rss_child(args.rss_child)
        return
    n = sum(p.numel() for p in build().parameters())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, GPT-2 shape with {n / 1e6:.1f}M parameters "
          f"({n * 4 / 2**20:.0f} MiB fp32), fp32 -> bf16 on CPU")
    mem = rss(args.repeats)
    ref = mem["Module.to"]
    print(f"cold: the first cast in a fresh process, median of {args.repeats} processes per variant (interleaved)")
    for v, d in mem.items():
        extra = d["peak"] - d["before"]
        print(f"  {v:<24} wall {d['wall'] * 1e3:5.0f} ms ratio {d['wall'] / ref['wall']:.2f} (paired "
              f"{d['paired_wall']:.2f})  cpu {d['cpu'] * 1e3:5.0f} ms ratio {d['cpu'] / ref['cpu']:.2f} (paired "
              f"{d['paired_cpu']:.2f})  RSS before {d['before'] / 2**20:4.0f} MiB, peak +"
              f"{extra / 2**20:3.0f} MiB (ratio {d['peak'] / ref['peak']:.3f}; increment x"
              f"{extra / max(ref['peak'] - ref['before'], 1):.2f}), after {d['after'] / 2**20:4.0f} MiB")
    wall, cpu = timing(args.rounds)
    base, base_cpu = statistics.median(wall["Module.to"]), statistics.median(cpu["Module.to"])
    print(f"warm: one process, cast and cast back, median of {args.rounds} interleaved rounds (wall min-max)")
    for v in VARIANTS:
        med, med_cpu = statistics.median(wall[v]), statistics.median(cpu[v])
        print(f"  {v:<24} wall {med * 1e3:5.0f} ms ({min(wall[v]) * 1e3:.0f}-{max(wall[v]) * 1e3:.0f}) ratio "
              f"{med / base:.2f} (paired {_paired(wall[v], wall['Module.to']):.2f})  cpu {med_cpu * 1e3:5.0f} ms "
              f"ratio {med_cpu / base_cpu:.2f} (paired {_paired(cpu[v], cpu['Module.to']):.2f})")
    mv, mt = overhead(build())
    print(f"nothing to cast (walk + plan + verify alone): move {mv * 1e3:.2f} ms, Module.to {mt * 1e3:.2f} ms")


if __name__ == "__main__":
    main()

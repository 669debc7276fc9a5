"""Cost of ``torchdoctor.trace``: a forward with no moves, and a full model ``.to()``, against the same work
untraced, interleaved in many rounds in one process (this machine is noisy: ratios of medians).

    python bench/trace.py [--rounds N]
    python bench/trace.py --own [--rounds N] [--threads T]   # the issue-28 row's cast, and the trace's own time

Targets: forward under trace <= 1.05x plain; a full model ``.to()`` under trace <= 1.3x.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch

# this folder holds scripts named like standard modules (trace.py, html.py): keep it off the import path
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.join(_HERE, "..", "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torchdoctor  # noqa: E402


def llama(hidden: int, layers: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=hidden * 4, num_hidden_layers=layers,
                      num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
                      max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


def timed(fn, traced: bool, model, repeat: int) -> float:
    """Median seconds of ``fn`` run ``repeat`` times, inside an active trace of ``model`` or with none active
    (entering and leaving the trace is measured separately: it is paid once per block, not per call)."""
    times = []
    tr = torchdoctor.trace(model) if traced else None
    if tr is not None:
        tr.__enter__()
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    finally:
        if tr is not None:
            tr.__exit__(None, None, None)
    return statistics.median(times)


def compare(name: str, model, fn, rounds: int, repeat: int = 4) -> float:
    plain, traced = [], []
    for _ in range(rounds):
        order = [False, True]
        random.shuffle(order)
        for tr in order:
            (traced if tr else plain).append(timed(fn, tr, model, repeat))
    p, t = statistics.median(plain), statistics.median(traced)
    print(f"{name:<52} plain {p * 1e3:9.3f} ms   traced {t * 1e3:9.3f} ms   ratio {t / p:5.3f}")
    return t / p


def enter_exit(name: str, model, rounds: int) -> None:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        with torchdoctor.trace(model):
            pass
        times.append(time.perf_counter() - t0)
    print(f"{name:<52} {statistics.median(times) * 1e3:9.3f} ms (patch, first and last walk, unpatch)")


def own(rounds: int, threads: int) -> None:
    """The issue-28 row (108M Llama shape, ``.to(bf16)`` and back, the trace entered outside the timed part):
    traced / untraced as process CPU and wall, and the thread CPU spent inside the trace's own code per pair
    (the reads before and after each call, the diff, the records), which the load on a shared machine moves
    far less than the ratio."""
    from torchdoctor._trace import patches, session

    torch.set_num_threads(threads)
    model = llama(768, 12)
    spent = [0.0]

    def timed(fn):  # type: ignore[no-untyped-def]
        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            t = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.thread_time() - t
        return wrapper

    patches._touch = timed(patches._touch)
    session.Session.finish = timed(session.Session.finish)

    def cast() -> None:
        model.to(torch.bfloat16)
        model.to(torch.float32)

    cast()
    cpu: dict[bool, list[float]] = {True: [], False: []}
    wall: dict[bool, list[float]] = {True: [], False: []}
    mine: list[float] = []
    for i in range(max(rounds, 5)):
        for on in (True, False) if i % 2 == 0 else (False, True):
            tr = torchdoctor.trace(model) if on else None
            if tr is not None:
                tr.__enter__()
            try:
                spent[0] = 0.0
                c, w = time.process_time(), time.perf_counter()
                cast()
                cpu[on].append(time.process_time() - c)
                wall[on].append(time.perf_counter() - w)
                if on:
                    mine.append(spent[0])
            finally:
                if tr is not None:
                    tr.__exit__(None, None, None)

    def ratio(d: dict[bool, list[float]]) -> str:
        rs = [a / b for a, b in zip(d[True], d[False])]
        return f"x{statistics.median(rs):.3f} ({min(rs):.2f}-{max(rs):.2f}, {len(rs)})"

    print(f"threads {threads}, load {os.getloadavg()[0]:.1f}: untraced {statistics.median(cpu[False]) * 1e3:.1f} ms CPU "
          f"/ {statistics.median(wall[False]) * 1e3:.1f} ms wall per pair")
    print(f"  traced / untraced: CPU {ratio(cpu)}, wall {ratio(wall)}")
    print(f"  the trace's own thread CPU per pair: {statistics.median(mine) * 1e3:.2f} ms (min {min(mine) * 1e3:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--own", action="store_true", help="the issue-28 row's cast and the trace's own time")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.own:
        own(args.rounds, args.threads)
        return
    torch.set_num_threads(1)
    ids = torch.randint(0, 1024, (1, 128))

    for hidden, layers in ((64, 2), (512, 8), (1024, 12)):
        model = llama(hidden, layers)
        n = sum(p.numel() for p in model.parameters())
        label = f"llama h{hidden} x{layers} ({n / 1e6:.1f} M params)"

        def forward() -> None:
            with torch.no_grad():
                model(ids)

        state = {"dtype": torch.float32}

        def round_trip() -> None:  # a real cast each call: fp32 -> bf16, then back on the next call
            state["dtype"] = torch.bfloat16 if state["dtype"] == torch.float32 else torch.float32
            model.to(state["dtype"])

        def noop_to() -> None:
            model.to("cpu")

        model.to(torch.float32)
        compare(f"forward, no moves: {label}", model, forward, args.rounds)
        compare(f"full .to(dtype): {label}", model, round_trip, args.rounds, repeat=6)
        compare(f".to('cpu') already there: {label}", model, noop_to, args.rounds)
        enter_exit(f"enter + exit of a trace: {label}", model, args.rounds)
        model.to(torch.float32)


if __name__ == "__main__":
    main()

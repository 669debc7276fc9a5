"""guard overhead: plain forward vs `explain` vs `strict` vs `fix`, on a GPT-2-small-shaped model and a tiny one.

GPT-2-small shape: transformers GPT2LMHeadModel, 12 layers, 768 wide, seq 128, batch 1, no_grad, random weights.
All variants run in a shuffled order in every round (interleaved). The tiny run adds a no-op TorchDispatchMode:
the floor any per-op checker pays before doing any work. Printed: medians of wall time and of process
CPU time, and the median of the per-round ratios to plain (robust to load drift on a shared machine). On the tiny
model (2 layers, 64 wide, one intra-op thread) the difference to plain is divided by the number of module calls /
aten ops per forward.
Targets (issue 14): `explain` <= 1.03x, `strict` <= 1.1x on the GPT-2-small shape; strict's extra CPU per aten op
<= 1.5x the no-op dispatch-mode floor on the tiny model.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging

import torchdoctor

logging.set_verbosity_error()
MODES = ("explain", "strict", "fix")


def build(n_layer: int, n_embd: int, n_head: int, vocab: int) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=1024,
                     bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    return GPT2LMHeadModel(cfg).eval()


class NoopMode(TorchDispatchMode):
    """The floor of any dispatch-mode checker: torch's own cost of routing every op through Python."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def variants(model: torch.nn.Module, ids: torch.Tensor, floor: bool = False) -> dict[str, Callable[[], Any]]:
    def plain() -> Any:
        with torch.no_grad():
            return model(input_ids=ids).logits

    def guarded(mode: str) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad(), torchdoctor.guard(model, mode=mode):
                return model(input_ids=ids).logits

        return run

    def noop_mode() -> Any:
        with torch.no_grad(), NoopMode():
            return model(input_ids=ids).logits

    return {"plain": plain, **{m: guarded(m) for m in MODES}, **({"noop_mode": noop_mode} if floor else {})}


def measure(fns: dict[str, Callable[[], Any]], rounds: int, warmup: int = 2) -> dict[str, dict[str, float]]:
    """Per variant: median wall time, median CPU time, median per-round wall and CPU ratio to plain."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for _ in range(rounds):
        random.shuffle(order)
        for key in order:
            c0, t0 = time.process_time(), time.perf_counter()
            fns[key]()
            wall[key].append(time.perf_counter() - t0)
            cpu[key].append(time.process_time() - c0)
    out = {}
    for k in fns:
        out[k] = {
            "wall": statistics.median(wall[k]),
            "cpu": statistics.median(cpu[k]),
            "ratio": statistics.median(a / b for a, b in zip(wall[k], wall["plain"])),
            "cpu_ratio": statistics.median(a / b for a, b in zip(cpu[k], cpu["plain"]) if b > 0),
            "cpu_extra": statistics.median(a - b for a, b in zip(cpu[k], cpu["plain"])),
        }
    return out


def counts(model: torch.nn.Module, ids: torch.Tensor) -> tuple[int, int]:
    """(module calls, aten ops) of one forward."""
    n = {"mod": 0, "op": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            n["op"] += 1
            return func(*args, **(kwargs or {}))

    def hook(*_: Any) -> None:
        n["mod"] += 1

    h = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        with torch.no_grad(), Count():
            model(input_ids=ids)
    finally:
        h.remove()
    return n["mod"], n["op"]


def report(name: str, med: dict[str, dict[str, float]]) -> None:
    base = med["plain"]
    print(f"{name}:")
    print(f"  plain    wall {base['wall'] * 1e3:8.2f} ms   cpu {base['cpu'] * 1e3:8.2f} ms")
    for m in [k for k in med if k != "plain"]:
        r = med[m]
        print(f"  {m:<8} wall {r['wall'] * 1e3:8.2f} ms   cpu {r['cpu'] * 1e3:8.2f} ms   "
              f"ratio of medians x{r['wall'] / base['wall']:.3f} (cpu x{r['cpu'] / base['cpu']:.3f})   "
              f"median per-round ratio x{r['ratio']:.3f} (cpu x{r['cpu_ratio']:.3f})")


def main(rounds: int = 30, tiny_rounds: int = 300) -> None:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, medians of interleaved shuffled rounds")
    ids = torch.randint(0, 50257, (1, 128), generator=torch.Generator().manual_seed(0))
    big = build(12, 768, 12, 50257)
    same = torch.equal(variants(big, ids)["plain"](), variants(big, ids)["strict"]())
    med = measure(variants(big, ids), rounds)
    report(f"gpt2-small shape (12x768, seq 128, batch 1, no_grad), {rounds} rounds", med)
    print(f"  strict output equal to plain bit for bit: {same}")
    tiny = build(2, 64, 4, 256)
    tiny_ids = ids[:, :16] % 256
    mods, ops = counts(tiny, tiny_ids)
    torch.set_num_threads(1)  # per-call Python cost; two intra-op threads only add barrier waits under load
    tmed = measure(variants(tiny, tiny_ids, floor=True), tiny_rounds, warmup=10)
    report(f"tiny gpt2 (2x64, seq 16, 1 thread), {tiny_rounds} rounds", tmed)
    per = ", ".join(f"{m} {tmed[m]['cpu_extra'] / mods * 1e6:.1f} us" for m in MODES)
    floor = tmed["noop_mode"]["cpu_extra"]
    print(f"  {mods} module calls and {ops} aten ops per forward; median per-round extra cpu per module call: {per}; "
          f"per aten op: strict {tmed['strict']['cpu_extra'] / ops * 1e6:.1f} us, of which torch's own "
          f"dispatch-mode floor (a no-op TorchDispatchMode) {floor / ops * 1e6:.1f} us")
    explain, strict = med["explain"]["ratio"], med["strict"]["ratio"]
    per_op = tmed["strict"]["cpu_extra"] / floor if floor > 0 else float("nan")
    print(f"targets (median per-round wall ratio): explain x{explain:.3f} <= 1.03 "
          f"{'met' if explain <= 1.03 else 'NOT met'}; strict x{strict:.3f} <= 1.1 {'met' if strict <= 1.1 else 'NOT met'}; "
          f"strict per aten op x{per_op:.2f} of the floor <= 1.5 {'met' if per_op <= 1.5 else 'NOT met'}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))

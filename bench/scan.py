"""scan speed on Llama-3-8B- and 70B-shaped transformers models built on meta.

Prints the median time of `torchdoctor.scan` and of `walk` alone, against a bare
`named_parameters()+named_buffers()` loop measured in the same process, interleaved (the order alternates
each round). Ratios are given for wall time and for thread CPU time: on a shared machine the second moves less.
Both models are built on meta, so all their weights are missing: scan reports one "weights not loaded" problem
per component (not one per tensor) and still builds a row per tensor. Also against issue 28's anchor, accelerate's
`named_module_tensors` + `find_tied_parameters` (which find less).
Targets (issue 2): ratio <= 3 and < 0.5 s for the 70B shape; issue 28: at or under accelerate.
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging

import torchdoctor
from torchdoctor._walk import walk

logging.set_verbosity_error()

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256),
    "llama3-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8, vocab_size=128256),
}


def bare(model: torch.nn.Module) -> int:
    n = 0
    for _, p in model.named_parameters(remove_duplicate=False):
        n += p.dtype.itemsize
    for _, b in model.named_buffers(remove_duplicate=False):
        n += b.dtype.itemsize
    return n


def main(rounds: int = 31) -> None:
    print(f"torch {torch.__version__}, {rounds} interleaved rounds, medians of wall time (and of thread CPU time, "
          "which load from other processes on a shared machine disturbs less)")
    for name, cfg in SHAPES.items():
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(**cfg))
        from accelerate.utils import find_tied_parameters, named_module_tensors

        def acc() -> None:
            list(named_module_tensors(model, include_buffers=True, recurse=True))
            find_tied_parameters(model)

        fns = {"bare": lambda: bare(model), "walk": lambda: walk(model), "scan": lambda: torchdoctor.scan(model),
               "accelerate": acc}
        wall: dict[str, list[float]] = {k: [] for k in fns}
        cpu: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(3):
            for fn in fns.values():
                fn()
        for i in range(rounds):
            order = list(fns.items())
            if i % 2:
                order.reverse()  # neither variant always runs right after the other
            for key, fn in order:
                c0, t0 = time.thread_time(), time.perf_counter()
                fn()
                wall[key].append(time.perf_counter() - t0)
                cpu[key].append(time.thread_time() - c0)
        med = {k: statistics.median(v) for k, v in wall.items()}
        cmed = {k: statistics.median(v) for k, v in cpu.items()}
        n = len(torchdoctor.scan(model).tensors)
        print(f"{name}: {n} tensor paths; bare {med['bare'] * 1e3:.2f} ms, "
              f"walk {med['walk'] * 1e3:.2f} ms (x{med['walk'] / med['bare']:.2f}; cpu x{cmed['walk'] / cmed['bare']:.2f}), "
              f"scan {med['scan'] * 1e3:.2f} ms (x{med['scan'] / med['bare']:.2f}; cpu x{cmed['scan'] / cmed['bare']:.2f}); "
              f"scan / accelerate cpu x{cmed['scan'] / cmed['accelerate']:.2f}")


if __name__ == "__main__":
    main()

"""Child process of ``bench/table.py``: the first call of a verb in a fresh process against later calls.

    python bench/first_call.py scan|checkpoint|move PATH   -> {"first": s, "later": s}
    python bench/first_call.py move_cast Module.to|move   -> {"Module.to": s, "move": s}  (GPT-2 110M to bf16,
                                                            the first cast of each, the one named first)

Process CPU time. torch, torchdoctor and (for scan / move) transformers are imported and the model is built before
the clock starts: what the first call pays on top is torchdoctor's own lazy imports and first-use caches.
Run by ``bench/table.py``; printing a JSON line and nothing else, it is not a benchmark of its own.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # bench/trace.py shadows stdlib trace
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def tiny_gpt2() -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)).eval()


def main() -> None:
    if len(sys.argv) < 2:  # `make bench` runs every script here: this one only serves bench/table.py
        print("bench/first_call.py: a child of bench/table.py (see its docstring)")
        return
    kind, arg = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    if kind == "move_cast":
        import torch

        import torchdoctor

        import importlib.util

        spec = importlib.util.spec_from_file_location("_bench_move", os.path.join(_HERE, "move.py"))
        assert spec and spec.loader
        mv = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mv)
        models = {}
        for variant in ("Module.to", "move"):
            with torch.device("meta"):  # built without the random init (seconds per child); zeros cast as fast
                models[variant] = mv.build()
            models[variant].to_empty(device="cpu")
            with torch.no_grad():
                for t in [*models[variant].parameters(), *models[variant].buffers()]:
                    t.zero_()
        out = {}
        # the first cast of each in this process, in the order asked (the caller alternates it between processes)
        for variant in (arg, "move" if arg == "Module.to" else "Module.to"):
            t = time.process_time()
            mv.cast(variant, models[variant])
            out[variant] = time.process_time() - t
        print(json.dumps(out))
        return
    import torch

    import torchdoctor

    if kind == "checkpoint":
        def call() -> Any:
            return torchdoctor.scan(arg)
    elif kind == "scan":
        model = tiny_gpt2()

        def call() -> Any:
            return torchdoctor.scan(model)
    else:
        model = tiny_gpt2()
        state = {"dtype": torch.float32}

        def call() -> Any:  # a real cast every call: bf16, then back to fp32
            state["dtype"] = torch.bfloat16 if state["dtype"] == torch.float32 else torch.float32
            return torchdoctor.move(model, dtype=state["dtype"])
    import gc

    # every call starts after a full collection: one set off by importing torch, transformers and building the
    # model would land in the first call (~5-10 ms with these imports) and be counted as its own
    gc.collect()
    t = time.process_time()
    call()
    first = time.process_time() - t
    later = []
    for _ in range(6):
        gc.collect()
        t = time.process_time()
        call()
        later.append(time.process_time() - t)
    print(json.dumps({"first": first, "later": statistics.median(later)}))


if __name__ == "__main__":
    main()

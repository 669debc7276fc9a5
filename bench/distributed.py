"""Cost of ``torchdoctor.distributed.check`` over 4 gloo ranks against a local ``torchdoctor.scan``, on the
Llama-3-70B-shaped transformers model built on meta (725 tensor paths).

``python bench/distributed.py`` launches itself with ``torch.distributed.run --standalone --nproc-per-node=4``; every
rank builds the model and, in interleaved rounds (the order alternates each round), times the local scan, the
whole collective check, and the ``all_gather_object`` of one rank's payload alone. Rank 0 prints medians and ratios.
Two cases: ``device="meta"`` (a clean model: no problems travel) and ``device="cpu"`` (every tensor a ``meta`` problem:
the largest payload a 70B model can send).
"""

from __future__ import annotations

import os
import pickle
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # bench/html.py would shadow the standard library's html module
RANKS = 4
ROUNDS = 15
SHAPE = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
             num_key_value_heads=8, vocab_size=128256)


def rank_main() -> None:
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    import torchdoctor
    from torchdoctor._distributed.local import scan_payload

    logging.set_verbosity_error()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    for label, device in (("clean (device='meta')", "meta"), ("every tensor a problem (device='cpu')", "cpu")):
        payload = scan_payload(model, device, None, False, rank, rank)
        out: list[object] = [None] * RANKS
        fns = {
            "scan": lambda d=device: torchdoctor.scan(model, device=d),
            "check": lambda d=device: torchdoctor.distributed.check(model, d),
            "gather": lambda o=out, p=payload: dist.all_gather_object(o, p),
        }
        times: dict[str, list[float]] = {k: [] for k in fns}
        for fn in fns.values():
            fn()
        for i in range(ROUNDS):
            order = list(fns.items())
            if i % 2:
                order.reverse()
            for key, fn in order:
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        if rank == 0:
            size = len(pickle.dumps(payload))
            print(f"{label}: {payload['count']} tensor paths, {len(payload['problems'])} problems, payload "
                  f"{size / 1024:.0f} KiB per rank; medians of {ROUNDS} rounds on {RANKS} ranks: "
                  f"scan {med['scan'] * 1e3:.1f} ms, check {med['check'] * 1e3:.1f} ms "
                  f"(x{med['check'] / med['scan']:.2f} of scan), gather alone {med['gather'] * 1e3:.1f} ms "
                  f"(x{med['gather'] / med['scan']:.2f})", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    if "RANK" in os.environ:
        rank_main()
        return
    import torch

    print(f"torch {torch.__version__}, {RANKS} ranks over gloo (CPU), Llama-3-70B shape on meta", flush=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}", __file__]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=900, check=False)
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()

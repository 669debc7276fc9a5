"""Run under ``python -m torch.distributed.run --standalone --nproc-per-node=N check_scenarios.py OUTDIR SUITE``.

Every rank runs every scenario of SUITE (one launch, many cases: a launch costs seconds) and writes
``OUTDIR/rank<R>.json``: scenario name -> the report's ``to_dict()`` or the error it raised. The tests read those.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/ for ``support``

import torchdoctor

RANK = int(os.environ.get("RANK", "0"))  # importable outside a launch (doctest collection)
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


def small(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))


def tiny_llama() -> nn.Module:
    from support import zoo

    return zoo.tiny_llama(torch.float32, seed=0)


# --- suite "small": 2 ranks, nn.Module, DDP, FSDP2, DTensor ------------------------------------------------


def ddp_clean() -> Any:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(small())
    model(torch.randn(2, 8)).sum().backward()
    return torchdoctor.distributed.check(model, "cpu", checksums=True)


def fsdp2_clean() -> Any:
    from torch.distributed.fsdp import fully_shard

    model = small()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    before = torchdoctor.distributed.check(model, device="cpu", checksums=True)
    model(torch.randn(2, 8)).sum().backward()
    after = torchdoctor.distributed.check(model, device="cpu", checksums=True)
    return {"before": before.to_dict(), "after": after.to_dict()}


def fsdp2_cpu_offload_against_accelerator() -> Any:
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    model = small()
    fully_shard(model, offload_policy=CPUOffloadPolicy(pin_memory=False))
    return torchdoctor.distributed.check(model, device="cuda:{local_rank}")


def plain_cpu_against_accelerator() -> Any:  # the negative of the offload case: without FSDP2 it is a problem
    return torchdoctor.distributed.check(small(), device="cuda:{local_rank}")


def fsdp2_mixed_precision() -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = small()
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    return torchdoctor.distributed.check(model, device="cpu", dtype=torch.bfloat16)


def dtensor_sharded_here_replicated_there() -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = init_device_mesh("cpu", (WORLD,))
    model = small()
    placement = Shard(0) if RANK == 0 else Replicate()
    local = model[1].bias.detach()[: 16 // WORLD] if RANK == 0 else model[1].bias.detach()
    model[1].register_buffer("running", DTensor.from_local(local, mesh, [placement], run_check=False))
    return torchdoctor.distributed.check(model, device="cpu")


def tensor_parallel_clean() -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))  # Megatron-style: column- then row-sharded
    model = parallelize_module(mlp, init_device_mesh("cpu", (WORLD,)), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    model(torch.randn(2, 8))
    return torchdoctor.distributed.check(model, device="cpu", checksums=True)


def read_only_fsdp2_with_checksums() -> Any:
    from support.helpers import assert_unchanged
    from torch.distributed.fsdp import fully_shard

    model = small()
    fully_shard(model)
    return assert_unchanged(model, torchdoctor.distributed.check, model, device="cpu", checksums=True)


def same_bad_argument_everywhere() -> Any:
    return torchdoctor.distributed.check(small(), device="cpu", dtype="int8")


SMALL: dict[str, Callable[[], Any]] = {f.__name__: f for f in (
    ddp_clean, fsdp2_clean, fsdp2_cpu_offload_against_accelerator, plain_cpu_against_accelerator,
    fsdp2_mixed_precision, dtensor_sharded_here_replicated_there, tensor_parallel_clean, read_only_fsdp2_with_checksums,
    same_bad_argument_everywhere)}


# --- suite "llama": 4 ranks, a tiny transformers Llama with one bug on one rank ---------------------------


def llama_meta_on_rank_2() -> Any:
    model = tiny_llama()
    if RANK == 2:  # one rank never materialised a weight
        model.model.layers[0].mlp.down_proj.weight = nn.Parameter(torch.empty(64, 128, device="meta"))
    return torchdoctor.distributed.check(model, device="cpu")


def llama_attribute_on_meta_on_rank_3() -> Any:
    model = tiny_llama()
    if RANK == 3:  # a plain attribute: Module.to never moves it
        model.model.layers[1].self_attn.cache = torch.zeros(4, device="meta")
    return torchdoctor.distributed.check(model, device="cpu")


def llama_bf16_on_rank_1() -> Any:
    model = tiny_llama()
    if RANK == 1:
        model.to(torch.bfloat16)
    return torchdoctor.distributed.check(model, None)


def llama_desync_freeze_extra() -> Any:
    model = tiny_llama()
    with torch.no_grad():
        if RANK == 2:  # weights out of sync
            model.lm_head.weight[0, 0] += 1.0
    if RANK == 1:
        model.model.embed_tokens.weight.requires_grad_(False)
    if RANK == 3:
        model.model.register_buffer("only_here", torch.zeros(3))
    return torchdoctor.distributed.check(model, device="cpu", checksums=True)


def llama_clean_ddp() -> Any:
    from torch.nn.parallel import DistributedDataParallel as DDP

    return torchdoctor.distributed.check(DDP(tiny_llama()), device="cpu", checksums=True)


def llama_rank_3_raises() -> Any:
    return torchdoctor.distributed.check(tiny_llama(), device="cpu", dtype="int8" if RANK == 3 else None)


LLAMA: dict[str, Callable[[], Any]] = {f.__name__: f for f in (
    llama_meta_on_rank_2, llama_attribute_on_meta_on_rank_3, llama_bf16_on_rank_1, llama_desync_freeze_extra,
    llama_clean_ddp, llama_rank_3_raises)}


def main() -> None:
    """SUITE is ``small`` or ``llama``, optionally after ``cli+``: then the same launch first records the command
    lines of ``cli_runs.py`` (``OUTDIR/cli/rank<R>.json``; first, before any scenario imports a library) and then
    runs the scenarios (a launch costs seconds)."""
    out, suite = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    if suite.startswith("cli+"):
        sys.path.insert(0, os.path.dirname(__file__))
        import cli_runs

        os.makedirs(os.path.join(out, "cli"), exist_ok=True)
        cli_runs.record(os.path.join(out, "cli"))
        suite = suite[len("cli+"):]
    run_suite(out, suite)
    dist.barrier()  # gloo may abort a rank whose peer closed its connections first
    dist.destroy_process_group()


def run_suite(out: str, suite: str) -> None:
    results: dict[str, Any] = {}
    for name, fn in {"small": SMALL, "llama": LLAMA}[suite].items():
        try:
            value = fn()
            results[name] = value.to_dict() if hasattr(value, "to_dict") else value
        except Exception as exc:  # recorded for the test; the collective itself must not have hung
            results[name] = {"raised": type(exc).__name__, "message": str(exc),
                             "traceback": traceback.format_exc()[-2000:]}
    with open(os.path.join(out, f"rank{RANK}.json"), "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1, default=str)


if __name__ == "__main__":
    main()

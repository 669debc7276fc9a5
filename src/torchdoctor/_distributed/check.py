"""``torchdoctor.distributed.check``: every rank scans with the one policy, ``all_gather_object`` brings the results
together, and every rank gets the same report of per-rank problems and cross-rank disagreements.

The call is collective, and it never leaves a rank waiting: whatever a rank's local part raises is caught and sent
in the gather instead of its results, so the other ranks return (and report that rank's error) rather than hang.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from torchdoctor._distributed.compare import build_report
from torchdoctor._distributed.local import error_payload, scan_payload
from torchdoctor._distributed.report import DistributedReport


def local_rank_of(rank: int) -> int:
    """``LOCAL_RANK`` as torchrun / accelerate set it, else the rank in the group."""
    value = os.environ.get("LOCAL_RANK", "")
    return int(value) if value.strip().isdigit() else rank


def _group_position(group: Any) -> tuple[int, int]:
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("torchdoctor.distributed.check needs torch.distributed, which this torch build lacks "
                           "(torch.distributed.is_available() is False); use torchdoctor.scan in one process")
    if not dist.is_initialized():
        raise RuntimeError(
            "torchdoctor.distributed.check is collective and needs an initialised process group: call "
            "torch.distributed.init_process_group() first (under torchrun it reads RANK, WORLD_SIZE, MASTER_ADDR and "
            "MASTER_PORT), then call check on every rank; for one process use torchdoctor.scan(model)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of group=: only the group's ranks may call check with it")
    return rank, dist.get_world_size(group)


def gather(local: Callable[[int, int], dict[str, Any]], group: Any = None) -> list[dict[str, Any]]:
    """Run ``local(rank, local_rank)`` on this rank and gather every rank's payload (a failure becomes its payload)."""
    import torch.distributed as dist

    rank, world = _group_position(group)
    local_rank = local_rank_of(rank)
    try:
        payload = local(rank, local_rank)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit from user code too: the other ranks are waiting in the gather
        payload = error_payload(rank, local_rank, exc)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, payload, group=group)
    return [g for g in gathered if isinstance(g, dict)]


def raise_if_all_failed_alike(payloads: list[dict[str, Any]]) -> None:
    """A bad argument fails every rank the same way: raise it on every rank instead of reporting it N times."""
    if not payloads or any(p.get("error") is None for p in payloads):
        return
    kinds = {(p.get("error_type"), p.get("error_message")) for p in payloads}
    if len(kinds) == 1:
        kind, message = kinds.pop()
        if kind in ("ValueError", "TypeError"):
            raise (ValueError if kind == "ValueError" else TypeError)(f"{message} (on every rank)")


def check(model: Any, device: str | torch.device | None = "cuda:{local_rank}", dtype: str | torch.dtype | None = None,
          *, group: Any = None, checksums: bool = False) -> DistributedReport:
    """Check placement on every rank of ``group`` (default: the default process group) and compare the ranks.

    Collective: every rank of the group must call it, with its own model. Each rank runs ``torchdoctor.scan``
    against ``device`` (``{local_rank}`` is filled from ``LOCAL_RANK``, else the group rank; ``{rank}`` with the
    group rank; ``None`` judges against each rank's majority) and ``dtype``; the results are gathered with
    ``all_gather_object``. Every rank returns the same ``DistributedReport``: each rank's problems or error, and
    the tensors whose device index, dtype, shape, ``requires_grad``, DTensor layout or presence differ between
    ranks; with ``checksums=True`` also replicated tensors whose values differ (each rank hashes its bytes, copying
    accelerator tensors to the CPU). A rank whose check raises still joins the gather: the others return and the
    report names its error; when every rank fails with the same bad argument, every rank raises it.

    With nccl, object collectives run on the current CUDA device: call ``torch.cuda.set_device(local_rank)``
    first (or initialise with ``backend="cpu:gloo,cuda:nccl"``). Pipeline stages hold different layers on
    purpose: pass the group of replicas (e.g. the data-parallel group) as ``group``.

    >>> import torchdoctor
    >>> torchdoctor.distributed.check(torch.nn.Linear(2, 2), device="cpu")
    Traceback (most recent call last):
    ...
    RuntimeError: torchdoctor.distributed.check is collective and needs an initialised process group: ...
    """
    payloads = gather(lambda rank, local_rank: scan_payload(model, device, dtype, checksums, rank, local_rank),
                      group)
    raise_if_all_failed_alike(payloads)
    return build_report("check", payloads, checksums)

"""Collectives of ``torch.distributed`` on virtual tensors refused as the process group's backend refuses them.

gloo moves cpu and cuda tensors only: on a Mac, DDP over a one-process gloo group with the model on mps stops in its
constructor (``ProcessGroupGloo::allgather: invalid tensor type ... device=mps:0``). A virtual run handed gloo the
virtual tensors' host storage, so the same program trained to its end and was reported clean. Here the run's
collectives (DDP's parameter check and broadcast, ``dist.all_reduce`` and its kind) look at the backend first: a
device its backend cannot move raises the backend's own text — gloo's, made by a private one-rank gloo group on a
meta tensor and said with the device — with the line that made the process group and the backend it chose.
A program that asks for nccl in a virtual cuda run gets a gloo group standing in for it (a GPU build has NCCL, this
CPU build has not), refusing what nccl refuses: a cpu tensor.
"""

from __future__ import annotations

import os
from datetime import timedelta
import sys
from typing import Any

import torch

from torchdoctor._placement import tensor_device
from torchdoctor._virtual.tensor import VirtualTensor

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the torchdoctor package
_MOVES = {"gloo": ("cpu", "cuda"), "nccl": ("cuda",), "xccl": ("xpu",), "mpi": ("cpu", "cuda")}
_MADE: dict[str, tuple[str, str]] = {}  # "default" -> (the program's line, the backend it asked for)
_OPS = {"all_reduce": "allreduce", "broadcast": "broadcast", "all_gather": "allgather", "reduce": "reduce",
        "all_gather_into_tensor": "_allgather_base", "reduce_scatter": "reduce_scatter", "gather": "gather",
        "scatter": "scatter", "all_to_all": "alltoall", "all_to_all_single": "alltoall_base"}


def install(installs: Any) -> None:
    """The run's collectives, for the threads of this run (``Installs.set``); nothing when torch has no c10d."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return
    init = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend", args[0] if args else None)
        caller: Any = sys._getframe(1)
        while caller is not None and caller.f_code.co_filename.startswith(_OURS):  # (the run's per-thread switch)
            caller = caller.f_back
        at = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}" if caller is not None else "?"
        _MADE["default"] = (at, str(backend))
        if _nccl_stand_in(backend):  # a GPU build has NCCL; this CPU one has not: gloo carries the run's storage
            kwargs = {**kwargs, "backend": "gloo"}
            args = args[1:] if args else ()
        return init(*args, **kwargs)

    installs.set(dist, "init_process_group", init_process_group)
    verify = dist._verify_params_across_processes

    def verify_params(group: Any, tensors: Any, *rest: Any, **kw: Any) -> Any:
        _refuse(dist, group, list(tensors), "allgather", mixed=True)
        return verify(group, tensors, *rest, **kw)

    installs.set(dist, "_verify_params_across_processes", verify_params)
    coalesced = dist._broadcast_coalesced

    def broadcast_coalesced(group: Any, tensors: Any, *rest: Any, **kw: Any) -> Any:
        _refuse(dist, group, list(tensors), "broadcast")
        return coalesced(group, tensors, *rest, **kw)

    installs.set(dist, "_broadcast_coalesced", broadcast_coalesced)
    for name, op in _OPS.items():
        original = getattr(dist, name, None)
        if original is not None:
            installs.set(dist, name, _checked(dist, original, op))


def _checked(dist: Any, original: Any, op: str) -> Any:
    def collective(*args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group")
        _refuse(dist, group, [*_tensors(args), *_tensors(kwargs.values())], op)
        return original(*args, **kwargs)

    collective.__name__ = original.__name__
    collective.__doc__ = original.__doc__
    return collective


def _tensors(values: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += _tensors(v)
    return out


def _refuse(dist: Any, group: Any, tensors: list[torch.Tensor], op: str, mixed: bool = False) -> None:
    """Raise as the group's backend does for the first tensor on a device it cannot move: a virtual one, or a real
    cpu one where gloo stands in for the program's nccl."""
    made = _MADE.get("default")
    stand_in = made is not None and _nccl_stand_in(made[1])
    if not stand_in and not any(isinstance(t, VirtualTensor) for t in tensors):
        return
    try:
        backend = str(dist.get_backend(group)).lower()
    except Exception:  # no group yet: torch's own error comes from the call itself
        return
    if stand_in and backend == "gloo" and group in (None, dist.group.WORLD):
        backend = made[1].lower()  # type: ignore[index]  # the backend the program asked for
    bad = next((t for t in tensors if (stand_in or isinstance(t, VirtualTensor))
                and not _moves(backend, tensor_device(t).type)), None)
    if bad is None:
        return
    device = tensor_device(bad)
    where = f"made at {made[0]} with backend={made[1]!r}" if made else f"backend {backend!r}"
    said = _backend_text(backend, op, device, bad.dtype, mixed)
    raise RuntimeError(f"{said}\n(the process group, {where}, moves {', '.join(_devices(backend))} tensors, not "
                       f"{device.type}. Advice, not proven by a re-run: pick the backend by device — 'gloo' for cpu, "
                       f"'nccl' for cuda, 'xccl' for xpu — and on mps run one process without a process group)")


def _nccl_stand_in(backend: Any) -> bool:
    """The program asked for nccl in a virtual cuda run on a torch built without it: gloo stands in."""
    import torch.distributed as dist

    from torchdoctor._virtual import tensor as V

    space = V.current_space()
    return space is not None and space.vtype == "cuda" and "nccl" in str(backend).lower() and \
        not dist.is_nccl_available()


def _moves(backend: str, kind: str) -> bool:
    if ":" in backend:  # "cpu:gloo,cuda:nccl": a backend per device type
        pairs = dict(p.split(":", 1) for p in backend.split(",") if ":" in p)
        return kind in pairs
    known = _MOVES.get(backend)
    return known is None or kind in known  # (a backend torch does not ship: its own rules)


def _devices(backend: str) -> tuple[str, ...]:
    if ":" in backend:
        return tuple(p.split(":", 1)[0] for p in backend.split(",") if ":" in p)
    return _MOVES.get(backend, ())


def _backend_text(backend: str, op: str, device: torch.device, dtype: torch.dtype, mixed: bool) -> str:
    """The backend's own refusal: gloo's, raised for real by a private one-rank gloo group on meta tensors (never
    the program's group), with the device said; another backend's, as torch words it."""
    if "gloo" not in backend:
        return f"No backend type associated with device type {device.type}"
    import torch.distributed as dist

    pg: Any = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=30))
    meta = torch.zeros(2, dtype=dtype, device="meta")
    try:
        if mixed:  # DDP's parameter check gathers its metadata: what the Mac says for an mps model
            pg.allgather([[meta]], [torch.zeros(2, dtype=dtype)]).wait()
        else:
            pg.allreduce([meta]).wait()
    except RuntimeError as e:
        text = str(e).strip().splitlines()[0]
        return text.replace("allreduce", op).replace("device=meta", f"device={device}") \
            .replace("device type meta", f"device type {device.type}")
    return f"ProcessGroupGloo::{op}: unsupported device type {device.type}"

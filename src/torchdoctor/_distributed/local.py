"""One rank's side of a distributed check: scan with the one policy, then describe the tensors for comparison.

Judging is ``torchdoctor.scan``'s. This module only adapts what distributed wrappers add around a model:

- paths are the original module's: the wrapper segments ``module.`` (DDP, at the root), ``_fsdp_wrapped_module``,
  ``_checkpoint_wrapped_module`` and ``_orig_mod`` (``torch.compile``) are dropped;
- tensors inside torch.distributed's own state (FSDP2's per-module state, device meshes, DDP bookkeeping) are
  not the user's and are left out;
- FSDP2 with ``CPUOffloadPolicy`` keeps sharded parameters on the CPU on purpose, and with
  ``MixedPrecisionPolicy(param_dtype=...)`` keeps them in their stored dtype while computing in ``param_dtype``;
- a DTensor is described by its local shard's device, its global shape and dtype, and its mesh and placements.
"""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import sys
import traceback
from typing import Any

import torch
from torch import nn

from torchdoctor._placement import device_str, dtype_str, parse_device
from torchdoctor._report.model import Problem, Target
from torchdoctor._scan.scan import scan
from torchdoctor._walk import walk

WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})
_ROOT_WRAPPERS = ("DistributedDataParallel", "DataParallel")
_STATE_KEY = "__composable_api_state_key"


def fill_device(device: Any, rank: int, local_rank: int) -> torch.device | None:
    """``"cuda:{local_rank}"`` -> ``cuda:3`` on local rank 3 (``{rank}`` is the group rank)."""
    if device is None:
        return None
    if isinstance(device, str) and "{" in device:
        try:
            device = device.format(local_rank=local_rank, rank=rank)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"device={device!r}: only {{local_rank}} and {{rank}} are filled in a device template, "
                             f"e.g. 'cuda:{{local_rank}}'") from exc
    return parse_device(device)


def host() -> str:
    try:
        return socket.gethostname()
    except OSError:
        return "?"


def error_payload(rank: int, local_rank: int, exc: BaseException) -> dict[str, Any]:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    first = (str(exc).strip().splitlines() or [""])[0]
    return {"rank": rank, "local_rank": local_rank, "host": host(), "judged": None,
            "error": f"{type(exc).__name__}: {first}{where}", "error_type": type(exc).__name__,
            "error_message": first, "problems": [], "tensors": {}, "count": 0, "mesh": []}


def strip_wrappers(path: str, root_wrapped: bool) -> str:
    parts = path.split(".")
    if root_wrapped and parts and parts[0] == "module":
        parts = parts[1:]
    return ".".join(p for p in parts if p not in WRAPPER_SEGMENTS)


def _internal(e: Any) -> bool:
    """A tensor of torch.distributed's own bookkeeping (FSDP state, device meshes, a DTensor's local shard)."""
    owner = e.owner
    if _STATE_KEY in e.path:
        return True
    if owner is None or isinstance(owner, nn.Module):
        return False
    mod = getattr(type(owner), "__module__", "") or ""
    return mod.startswith("torch.distributed")


def _dtensor_type() -> Any:
    if "torch.distributed.tensor" not in sys.modules:
        return None  # nothing can be a DTensor before the module that defines it was imported
    from torch.distributed.tensor import DTensor

    return DTensor


def _fsdp2_intent(w: Any) -> tuple[set[str], dict[str, torch.dtype]]:
    """Paths FSDP2 offloads to the CPU on purpose, and paths it computes in another ``param_dtype``."""
    offloaded: set[str] = set()
    param_dtype: dict[str, torch.dtype] = {}
    if "torch.distributed.fsdp" not in sys.modules:
        return offloaded, param_dtype
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return offloaded, param_dtype
    for _path, mod in w.modules:
        if not isinstance(mod, FSDPModule):
            continue
        try:  # FSDP2 internals: a torch that moved them leaves offloaded params judged as placed
            groups = mod._get_fsdp_state()._fsdp_param_groups
            for group in groups:
                for fp in group.fsdp_params:
                    info = fp._module_info
                    mpath = w.module_paths.get(id(info.module))
                    if mpath is None:
                        continue
                    path = f"{mpath}.{info.param_name}" if mpath else info.param_name
                    if getattr(fp, "offload_to_cpu", False):
                        offloaded.add(path)
                    # set at FSDP's lazy init (first forward); the group's policy says it before that
                    dt = getattr(fp, "param_dtype", None) or getattr(getattr(group, "mp_policy", None), "param_dtype", None)
                    if isinstance(dt, torch.dtype):
                        param_dtype[path] = dt
        except Exception:
            continue
    return offloaded, param_dtype


def checksum(t: torch.Tensor) -> str | None:
    """A digest of the tensor's bytes (None for meta and tensors without plain storage)."""
    try:
        x = t.detach()
        if x.device.type == "meta" or x.is_sparse or x.is_quantized:
            return None
        if x.device.type != "cpu":
            x = x.cpu()
        raw = x.contiguous().reshape(-1).view(torch.uint8)
        try:
            data: Any = raw.numpy()  # hashed through the buffer protocol, no copy
        except Exception:  # no numpy: the storage's bytes
            data = bytes(raw.untyped_storage())
        h = hashlib.blake2b(data, digest_size=16)
        h.update(f"{x.dtype}{tuple(t.shape)}".encode())
        return h.hexdigest()
    except Exception:
        return None


def scan_payload(model: Any, device: Any, dtype: Any, checksums: bool, rank: int, local_rank: int,
                 strict: bool = False) -> dict[str, Any]:
    """Scan ``model`` on this rank and describe it for the cross-rank comparison (builtins only)."""
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        raise ValueError("distributed.check takes the live model of each rank; a checkpoint path is scanned once, "
                         "without the process group: torchdoctor.scan(path)")
    dev = fill_device(device, rank, local_rank)
    report = scan(model, device=dev, dtype=dtype, strict=strict)
    obj = model.obj if isinstance(model, Target) else model
    w = walk(obj)
    wrapped = type(obj).__name__ in _ROOT_WRAPPERS and isinstance(obj, nn.Module)
    internal = {e.path for e in w.entries if _internal(e)}
    offloaded, param_dtype = _fsdp2_intent(w)
    dtensor = _dtensor_type()
    expected_dt = report.expected
    problems = []
    for p in report.problems:
        if p.path in internal:
            continue
        if p.kind == "device" and p.path in offloaded and p.found == "cpu":
            continue
        if p.kind == "dtype" and p.path in param_dtype and dtype_str(param_dtype[p.path]) == p.expected:
            continue
        path = strip_wrappers(p.path, wrapped)
        mpath = strip_wrappers(p.module_path, wrapped) if p.module_path else p.module_path
        problems.append(p if path == p.path and mpath == p.module_path else
                        dataclasses.replace(p, path=path, module_path=mpath))
    tensors: dict[str, tuple[Any, ...]] = {}
    mesh: list[tuple[str, str, str]] = []
    strip = wrapped or any(seg in e.path for e in w.entries for seg in WRAPPER_SEGMENTS)
    names: dict[Any, str] = {}  # device / dtype -> its string: a 70B model has a handful of them for 725 tensors
    for e in w.entries:
        if e.alias_of is not None or e.path in internal:
            continue
        t = e.tensor
        path = strip_wrappers(e.path, wrapped) if strip else e.path
        layout, local = None, t
        if dtensor is not None and isinstance(t, dtensor):
            m = t.device_mesh
            layout = f"dtensor {m.device_type}{tuple(m.shape)} {tuple(t.placements)}"
            local = t.to_local()
            if local.device.type not in (m.device_type, "meta") and e.path not in offloaded:
                mesh.append((path, device_str(local.device), m.device_type))
        elif type(t).__name__ == "FlatParameter":
            layout = "flat"
        replicated = layout is None or all(type(pl).__name__ == "Replicate" for pl in getattr(t, "placements", ()))
        digest = checksum(local) if checksums and replicated else None
        dev_, dt_ = local.device, t.dtype
        dev_s = names.get(dev_) or names.setdefault(dev_, device_str(dev_))
        dt_s = names.get(dt_) or names.setdefault(dt_, dtype_str(dt_))
        tensors[path] = (dev_s, dt_s, tuple(t.shape), bool(t.requires_grad), layout, digest)
    comp = expected_dt.get("") or next(iter(expected_dt.values()), None) if expected_dt else None
    majority = comp.get("device") if comp else None
    judged = device_str(dev) if dev is not None else (majority if majority not in (None, "none") else None)
    return {"rank": rank, "local_rank": local_rank, "host": host(), "judged": judged, "error": None,
            "problems": [_plain(p) for p in problems], "tensors": tensors, "count": len(tensors), "mesh": mesh}


def _plain(p: Problem) -> dict[str, Any]:
    d = dict(vars(p))  # the dataclass fields (Problem keeps them in its __dict__); asdict deep-copies, 10x slower
    d["tensors"] = list(p.tensors)
    return d

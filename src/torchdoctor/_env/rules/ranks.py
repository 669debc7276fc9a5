"""Environment rules about launched ranks (torchrun, accelerate launch, SLURM): device per rank and backends.

They read the launch variables and the visible device count of the facts, as every rank of a job would see them
(``torchdoctor env`` run as one of the ranks, or its saved ``--json``).

>>> from torchdoctor._env.rules.registry import run_rules
>>> facts = {"torch": {"version": "2.13.0+cpu", "build": "cpu"}, "distributed": {"available": True, "backends": ["gloo"]},
...          "env": {"RANK": "0", "WORLD_SIZE": "2", "NCCL_DEBUG": "INFO"}}
>>> [f.code for f in run_rules(facts) if f.code.startswith("distributed")]
['distributed_backend_missing']
"""

from __future__ import annotations

from torchdoctor._env.launch import collective_vars, launch_view
from torchdoctor._env.rules.registry import (
    ERROR,
    WARNING,
    EnvFinding,
    Facts,
    env_var,
    hit,
    rule,
    torch_v,
    wheel_index,
)


def _visible(f: Facts) -> tuple[int, str, str] | None:
    """(visible devices, device type, the variable that selects them) for an accelerator build with devices."""
    build = f["torch"]["build"]
    if build in ("cuda", "rocm") and f["cuda_device_count"]:
        var = "HIP_VISIBLE_DEVICES" if build == "rocm" and env_var(f, "HIP_VISIBLE_DEVICES") else "CUDA_VISIBLE_DEVICES"
        return int(f["cuda_device_count"]), "cuda", var
    if f["xpu_device_count"]:
        return int(f["xpu_device_count"]), "xpu", "ZE_AFFINITY_MASK"
    return None


def _selected(f: Facts, var: str) -> str:
    value = env_var(f, var)
    return f" ({var}={value!r})" if value is not None else ""


@rule("local_rank_beyond_devices")
def _local_rank(f: Facts) -> list[EnvFinding]:
    v, vis = launch_view(f), _visible(f)
    if vis is None or v["local_rank"] is None or v["local_rank"] < vis[0]:
        return []
    count, kind, var = vis
    lr = v["local_rank"]
    return hit("local_rank_beyond_devices", ERROR,
               f"LOCAL_RANK={lr} but this process sees {count} {kind} device(s){_selected(f, var)}: "
               f"device='{kind}:{lr}' or torch.{kind}.set_device({lr}) fails with 'invalid device ordinal'.",
               f"torchrun --nproc-per-node {count} ...  # one rank per visible device; or, when the launcher gives each "
               f"rank its own {var}, use device=f'{kind}:{{int(os.environ[\"LOCAL_RANK\"]) % torch.{kind}.device_count()}}'")


@rule("ranks_share_device")
def _share(f: Facts) -> list[EnvFinding]:
    v, vis = launch_view(f), _visible(f)
    if vis is None or v["local_world_size"] is None or v["local_world_size"] <= vis[0]:
        return []
    count, kind, var = vis
    if env_var(f, var) is not None and count == 1:
        return []  # one device per rank chosen by the launcher: ranks see different devices under the same index
    n = v["local_world_size"]
    return hit("ranks_share_device", WARNING,
               f"{n} ranks on this node (LOCAL_WORLD_SIZE={n}) but {count} visible {kind} device(s){_selected(f, var)}: "
               "at least two ranks share one device, which splits its memory; NCCL stops with 'Duplicate GPU "
               "detected'.",
               f"torchrun --nproc-per-node {count} ...  # and torch.{kind}.set_device(int(os.environ['LOCAL_RANK'])) "
               "in every rank")


def _missing(f: Facts) -> tuple[str, str, list[str]] | None:
    """(backend, why it is wanted, variables) for a collective backend the launch points at but the build lacks."""
    d = f.get("distributed") or {}
    if d.get("available") is not True:
        return None
    backends = d.get("backends") or []
    nccl = collective_vars(f, "NCCL_", "TORCH_NCCL_")
    if nccl and "nccl" not in backends:
        return "nccl", "NCCL", nccl
    ccl = collective_vars(f, "CCL_", "ONECCL_")
    if ccl and "xccl" not in backends:
        return "xccl", "oneCCL", ccl
    return None


@rule("distributed_backend_missing")
def _backend(f: Facts) -> list[EnvFinding]:
    v, d = launch_view(f), f.get("distributed") or {}
    if not v["launched"]:
        return []
    if d.get("available") is False:
        return hit("distributed_backend_missing", ERROR,
                   f"This process was launched as a rank (RANK/WORLD_SIZE are set) but torch {torch_v(f)} was built "
                   "without torch.distributed: init_process_group does not exist in it.",
                   f"pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/{wheel_index(f)}"
                   "  # a build with distributed support (Linux wheels have it)")
    found = _missing(f)
    if found is None:
        return []
    backend, library, names = found
    have = ", ".join(d.get("backends") or []) or "none"
    shown = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
    symptom = f"Distributed package doesn't have {backend.upper()} built in"
    fix = ("pip install torch --index-url https://download.pytorch.org/whl/cu128  # a CUDA build has NCCL; on CPU use "
           "init_process_group('gloo')") if backend == "nccl" else \
        ("pip install torch --index-url https://download.pytorch.org/whl/xpu  # torch 2.8+ XPU builds have xccl; on "
         "CPU use init_process_group('gloo')")
    return hit("distributed_backend_missing", ERROR,
               f"{shown} set for {library}, but torch {torch_v(f)} has no {backend} backend (it has: {have}): "
               f"init_process_group('{backend}') fails with \"{symptom}\".", fix)


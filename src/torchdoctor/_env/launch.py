"""Rank facts: the variables a launcher (torchrun, accelerate launch, SLURM wrappers) gives each process, the
collective libraries' variables, and the backends this torch build has; plus the views the rules and the report share.

>>> launch_view({"env": {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}})["rank"]
1
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
               "TORCHELASTIC_RUN_ID")
# Collective-library variables, by prefix (NCCL_DEBUG, NCCL_SOCKET_IFNAME, CCL_ZE_IPC_EXCHANGE, ONECCL_..., GLOO_...).
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "CCL_", "ONECCL_", "GLOO_", "TORCH_DISTRIBUTED_")
BACKENDS = ("gloo", "nccl", "xccl", "mpi", "ucc")


def env_facts(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The named variables that are set, then the collective libraries' variables by prefix."""
    import os

    environ = os.environ if environ is None else environ
    found = {k: environ[k] for k in names if k in environ}
    found.update({k: environ[k] for k in sorted(environ) if k.startswith(ENV_PREFIXES) and k not in found})
    return found


def distributed_facts() -> dict[str, Any]:
    """Which collective backends this torch build has (compile-time answers: nothing is initialised)."""
    import torch

    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return {"available": False, "backends": []}
    backends = [name for name in BACKENDS if bool(getattr(dist, f"is_{name}_available", lambda: False)())]
    return {"available": True, "backends": backends}


def _int(value: Any) -> int | None:
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isdigit() else None


def launch_view(facts: Mapping[str, Any]) -> dict[str, Any]:
    """``rank``, ``local_rank``, ``world_size``, ``local_world_size`` (ints or None), ``launched`` and ``master``."""
    env = facts.get("env") or {}
    view: dict[str, Any] = {k: _int(env.get(k.upper())) for k in ("rank", "local_rank", "world_size", "local_world_size")}
    view["launched"] = view["world_size"] is not None or view["rank"] is not None or view["local_rank"] is not None
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    view["master"] = f"{addr or '?'}:{port or '?'}" if addr or port else None
    return view


def collective_vars(facts: Mapping[str, Any], *prefixes: str) -> list[str]:
    return sorted(k for k in (facts.get("env") or {}) if k.startswith(prefixes))


def describe(facts: Mapping[str, Any], *, master: bool = True) -> str:
    """One line for the report: this process's rank, the launch (``master=False`` hides the host) and the backends."""
    v, d = launch_view(facts), facts.get("distributed") or {}
    backends = ", ".join(d.get("backends") or []) or ("none" if d.get("available") is False else "unknown")
    if not v["launched"]:
        return f"not launched as a rank (no RANK / WORLD_SIZE); backends: {backends}"

    def of(a: Any, b: Any) -> str:
        return f"{'?' if a is None else a}/{'?' if b is None else b}"

    where = v["master"] if master else f"<set>:{(facts.get('env') or {}).get('MASTER_PORT') or '?'}"
    where = f", master {where}" if v["master"] else ""
    return (f"rank {of(v['rank'], v['world_size'])}, local rank {of(v['local_rank'], v['local_world_size'])}"
            f"{where}; backends: {backends}")

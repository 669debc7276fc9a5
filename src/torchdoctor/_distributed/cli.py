"""``torchrun --nproc-per-node N -m torchdoctor scan|simulate TARGET --distributed``.

Every rank resolves TARGET itself (so rank-specific code runs as it would in training), runs the verb, and joins
one gather; rank 0 prints the report (text or ``--json``) and every rank exits with the same code: 0 all clear,
1 problems or disagreements, 2 a rank could not be checked. The process group is initialised from the torchrun
environment unless TARGET's own code already did (gloo on CPU; ``cpu:gloo,cuda:nccl`` / ``cpu:gloo,xpu:xccl`` where
an accelerator and its backend exist, so the object gather stays on the CPU), and destroyed afterwards if it
is ours. ``simulate`` runs rank N on virtual ``cuda:N`` (``--device cuda``, or a template such as
``cuda:{local_rank}``) with as many virtual devices as ranks on the node, so a CPU-only machine finds the rank whose
code computes on ``cuda:0``.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from typing import Any

from torchdoctor._cli.common import (
    UsageError,
    assume_option,
    failure,
    parse_common,
    print_json,
    resolve_target,
)
from torchdoctor._distributed.check import gather, local_rank_of
from torchdoctor._distributed.compare import build_report
from torchdoctor._distributed.local import (
    error_payload,
    fill_device,
    host,
    scan_payload,
)
from torchdoctor._report.text import EXIT_USAGE

_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT = timedelta(minutes=10)


def _backend() -> str:
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl" if dist.is_gloo_available() else "nccl"
    xccl = getattr(dist, "is_xccl_available", lambda: False)()
    if hasattr(torch, "xpu") and torch.xpu.is_available() and xccl:
        return "cpu:gloo,xpu:xccl" if dist.is_gloo_available() else "xccl"
    return "gloo"


def _init() -> bool:
    """Initialise the default group from the torchrun environment; False when it already existed."""
    import torch.distributed as dist

    if not dist.is_available():
        raise UsageError("--distributed needs torch.distributed, which this torch build lacks")
    if dist.is_initialized():
        return False
    backend = _backend()
    if "nccl" in backend:
        import torch

        torch.cuda.set_device(local_rank_of(int(os.environ["RANK"])) % max(torch.cuda.device_count(), 1))
    dist.init_process_group(backend=backend, timeout=TIMEOUT)
    return True


def _device_template(value: str | None, verb: str) -> str | None:
    """``cuda`` -> ``cuda:{local_rank}``: each rank its own device; templates and explicit indices are kept."""
    if value is None:
        return "cuda:{local_rank}" if verb == "simulate" else None
    if "{" in value or ":" in value or value in ("cpu", "meta"):
        return value
    return f"{value}:{{local_rank}}"


def _simulate_payload(spec: str, args: argparse.Namespace, template: str | None, rank: int,
                      local_rank: int) -> dict[str, Any]:
    """This rank's simulation: TARGET is resolved (its file imported, its factory called) inside the virtual
    session, so rank code that places its model on ``cuda:LOCAL_RANK`` runs as it would on the GPU node."""
    from torchdoctor._placement import device_str
    from torchdoctor._rules.profile import DeviceProfile
    from torchdoctor._virtual.simulate import simulate_target

    device = fill_device(template, rank, local_rank)
    assert device is not None
    _, dtype = parse_common(argparse.Namespace(device=None, dtype=args.dtype))
    count = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
    if getattr(args, "count", None):
        count = int(args.count)
    profile = DeviceProfile.for_device(device.type).with_count(max(count, (device.index or 0) + 1))
    assume = assume_option(getattr(args, "assume_device", None))  # as ``torchdoctor simulate`` reads it
    # a real node keeps cuda:0 current in every rank until the program calls set_device: a hard-coded .cuda()
    # lands there, as simulate() and run see it
    report = simulate_target(lambda: _resolve(spec), device, dtype, profile=profile, assume_device=assume,
                             select=False)
    problems = [{**p.to_dict(), "tensors": list(p.tensors)} for p in report.problems]
    if report.stopped and not problems:
        raise RuntimeError(f"simulation stopped early: {report.stopped}")
    return {"rank": rank, "local_rank": local_rank, "host": host(), "judged": device_str(device), "error": None,
            "problems": problems, "tensors": {}, "count": sum(g.get("tensors", 0) for g in report.summary),
            "mesh": []}


def _resolve(spec: str) -> Any:
    target = resolve_target(spec)
    if isinstance(target, (str, os.PathLike)):
        raise UsageError(f"{spec!r} is a file or directory: --distributed checks the live objects of each "
                         "rank; scan a checkpoint once, without --distributed")
    return target


def command(verb: str, args: argparse.Namespace) -> int:
    """Run ``verb`` on every rank, gather, print on rank 0; the same exit code on every rank."""
    missing = [v for v in _LAUNCH_VARS if v not in os.environ]
    if missing:
        raise UsageError(f"--distributed runs under torchrun, e.g. `torchrun --nproc-per-node 2 -m torchdoctor {verb} "
                         f"TARGET --distributed` ({', '.join(missing)} not set)")
    rank = int(os.environ["RANK"])
    target: Any = None
    early: BaseException | None = None
    try:
        template = _device_template(getattr(args, "device", None), verb)
        if verb == "scan":
            parse_common(argparse.Namespace(device=None, dtype=args.dtype))
            target = _resolve(args.target)
        elif os.path.exists(args.target):  # simulate resolves TARGET in its virtual session, on each rank
            _resolve(args.target)
    except UsageError as exc:
        early = exc
    except Exception as exc:  # resolve_target turns the target's failures into UsageError; anything else too
        early = UsageError(failure(exc))
    owned = _init()
    try:
        def local(r: int, lr: int) -> dict[str, Any]:
            if early is not None:
                payload = error_payload(r, lr, early)
                payload["error"] = f"UsageError: {early}"
                return payload
            if verb == "simulate":
                try:
                    return _simulate_payload(args.target, args, template, r, lr)
                except UsageError as exc:  # TARGET could not be resolved on this rank: the same on every rank
                    payload = error_payload(r, lr, exc)
                    payload["error"] = f"UsageError: {exc}"
                    return payload
            return scan_payload(target, template, args.dtype, False, r, lr)

        payloads = gather(local)
        report = build_report(verb, payloads)
        code = report.exit_code()
        same = {(p.get("error_type"), p.get("error_message")) for p in payloads}
        if rank == 0 and len(same) == 1 and next(iter(same))[0] == "UsageError":
            print(f"torchdoctor {verb}: {next(iter(same))[1]} (on every rank)", file=sys.stderr)
        elif rank == 0:
            if getattr(args, "json", False):
                print_json(report.to_dict())
            else:
                print(report.text(limit=getattr(args, "limit", 40)))
            sys.stdout.flush()
        # torchrun stops the other ranks as soon as one exits non-zero: nobody leaves before rank 0 has printed
        import torch.distributed as dist

        dist.barrier()
        return code
    except UsageError:
        raise
    except Exception as exc:  # the gather itself failed (a rank died): say so on this rank
        print(f"torchdoctor {verb} --distributed: rank {rank}: {failure(exc)}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if owned:
            import torch.distributed as dist

            try:
                dist.destroy_process_group()
            except Exception:
                pass

"""Cross-rank comparison of the gathered per-rank payloads: pure functions of plain data, no process group.

A payload is what one rank sends (``torchdoctor._distributed.local`` builds it): builtins only, so the gather
pickles no torch object and a rank that failed sends the same shape with ``error`` set. Tensor rows are
``path -> (device, dtype, shape, requires_grad, layout, checksum)``; ``layout`` is ``None`` for a plain tensor,
``"flat"`` for an FSDP1 flat parameter and ``"dtensor <mesh type><mesh shape> <placements>"`` for a DTensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torchdoctor._distributed.report import Disagreement, DistributedReport, RankReport
from torchdoctor._report.model import Problem

DEVICE, DTYPE, SHAPE, GRAD, LAYOUT, CHECKSUM = range(6)
MAX_MISSING_PER_RANK = 200  # a rank holding a different model would otherwise list every path


def build_report(verb: str, payloads: Sequence[dict[str, Any]], checksums: bool = False) -> DistributedReport:
    ranks = tuple(_rank_report(p) for p in sorted(payloads, key=lambda p: p["rank"]))
    return DistributedReport(verb, len(payloads), ranks, tuple(disagreements(payloads)), checksums)


def _rank_report(p: dict[str, Any]) -> RankReport:
    problems = tuple(Problem(**{**d, "tensors": tuple(d.get("tensors") or ())}) for d in p.get("problems") or ())
    return RankReport(p["rank"], p.get("local_rank", p["rank"]), p.get("host") or "?", p.get("judged"), problems,
                      int(p.get("count") or 0), p.get("error"))


def _split(path: str, by_rank: dict[int, str]) -> tuple[str, tuple[int, ...], tuple[tuple[str, tuple[int, ...]], ...]]:
    """(majority value, blamed ranks, (value, ranks) pairs). A tie goes to the value of the lowest rank."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(by_rank):
        groups.setdefault(by_rank[rank], []).append(rank)
    majority = max(groups, key=lambda v: (len(groups[v]), -groups[v][0]))
    blamed = tuple(sorted(r for v, rs in groups.items() if v != majority for r in rs))
    return majority, blamed, tuple((v, tuple(rs)) for v, rs in groups.items())


def _describe(values: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    return ", ".join(f"{v} on {'rank' if len(rs) == 1 else 'ranks'} {','.join(map(str, rs))}" for v, rs in values)


def disagreements(payloads: Sequence[dict[str, Any]]) -> list[Disagreement]:
    good = [p for p in payloads if p.get("error") is None]
    out: list[Disagreement] = []
    out.extend(_shared_devices(good))
    out.extend(_rank_devices(good))
    for p in good:
        for path, local, mesh in p.get("mesh") or ():
            out.append(Disagreement("mesh", path, (p["rank"],), ((local, (p["rank"],)),), mesh,
                                    f"rank {p['rank']}: the local shard of DTensor {path} is on {local} but its "
                                    f"device mesh is '{mesh}'"))
    tables = {p["rank"]: p.get("tensors") or {} for p in good}
    if len(tables) < 2:
        return out
    paths: dict[str, None] = {}
    for table in tables.values():
        paths.update(dict.fromkeys(table))
    missing_shown: dict[int, int] = {}
    compared: list[tuple[str, int, Callable[[Any], str], str]] = [
        ("placement", LAYOUT, lambda v: v or "plain tensor", "is laid out differently across ranks"),
        ("dtype", DTYPE, str, "has a different dtype across ranks"),
        ("shape", SHAPE, lambda v: "[" + ", ".join(map(str, v)) + "]", "has a different shape across ranks"),
        ("requires_grad", GRAD, lambda v: f"requires_grad={v}", "differs in requires_grad across ranks"),
    ]
    for path in paths:
        rows = {r: t[path] for r, t in tables.items() if path in t}
        if len(rows) < len(tables):
            absent = tuple(r for r in tables if r not in rows)
            odd = tuple(rows) if len(rows) < len(absent) else absent  # an extra tensor on one rank blames that rank
            if all(missing_shown.get(r, 0) < MAX_MISSING_PER_RANK for r in odd):
                for r in odd:
                    missing_shown[r] = missing_shown.get(r, 0) + 1
                out.append(Disagreement(
                    "missing", path, odd, (("present", tuple(rows)), ("absent", absent)),
                    "absent" if odd == tuple(rows) else "present",
                    f"{path} exists on {_rank_list(tuple(rows))} but not on {_rank_list(absent)} (a rank built "
                    "or loaded a different model; pipeline stages differ on purpose: pass group= of the replicas)"))
        if len(rows) < 2:
            continue
        values_iter = iter(rows.values())
        first = next(values_iter)
        if all(row == first for row in values_iter):
            continue  # the common case: every rank holds the same tensor
        layouts = {row[LAYOUT] for row in rows.values()}
        for kind, col, show, what in compared:
            if kind == "shape" and "flat" in layouts:
                continue  # FSDP1 flat parameters pad their shards per rank
            values = {r: show(row[col]) for r, row in rows.items()}
            if len(set(values.values())) > 1:
                majority, blamed, groups = _split(path, values)
                out.append(Disagreement(kind, path, blamed, groups, majority,
                                        f"{path} {what}: {_describe(groups)}"))
        sums = {r: row[CHECKSUM] for r, row in rows.items() if row[CHECKSUM] is not None}
        if len(sums) == len(rows) and len(layouts) == 1 and len(set(sums.values())) > 1:
            majority, blamed, groups = _split(path, sums)
            labels = {v: f"checksum {v[:12]}" for v in sums.values()}
            out.append(Disagreement(
                "checksum", path, blamed, groups, majority,
                f"{path} holds different values on {_rank_list(blamed)} than on the other ranks "
                f"({_describe(tuple((labels[v], rs) for v, rs in groups))}): replicated weights are out of sync"))
    return out


def _rank_list(ranks: tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def _index(device: str | None) -> tuple[str, int | None] | None:
    if not device:
        return None
    kind, _, idx = device.partition(":")
    return kind, int(idx) if idx.isdigit() else None


def _shared_devices(good: list[dict[str, Any]]) -> list[Disagreement]:
    """Several ranks of one host judged against (or mostly on) the same accelerator."""
    by_device: dict[tuple[str, str], list[int]] = {}
    for p in good:
        dev = p.get("judged")
        parsed = _index(dev)
        if parsed is None or parsed[0] in ("cpu", "meta") or parsed[1] is None:
            continue
        by_device.setdefault((p.get("host") or "?", dev or ""), []).append(p["rank"])
    out = []
    for (host, dev), ranks in by_device.items():
        if len(ranks) > 1:
            rs = tuple(sorted(ranks))
            out.append(Disagreement(
                "shared_device", "", rs, ((dev, rs),), "one device per rank",
                f"{_rank_list(rs)} on {host} all use {dev}: each rank needs its own device "
                "(torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) and device=f'cuda:{local_rank}'); NCCL stops "
                "with 'Duplicate GPU detected'"))
    return out


def _rank_devices(good: list[dict[str, Any]]) -> list[Disagreement]:
    """Tensors on the right device type but another index than their rank's device (often another rank's)."""
    owner: dict[tuple[str, str], int] = {}
    for p in good:
        if p.get("judged"):
            owner.setdefault((p.get("host") or "?", p["judged"]), p["rank"])
    out = []
    for p in good:
        expected = _index(p.get("judged"))
        if expected is None or expected[1] is None:
            continue
        rank, host = p["rank"], p.get("host") or "?"
        for path, row in (p.get("tensors") or {}).items():
            found = _index(row[DEVICE])
            if found is None or found[0] != expected[0] or found[1] == expected[1]:
                continue
            other = owner.get((host, row[DEVICE]))
            whose = f", the device of rank {other}" if other is not None and other != rank else ""
            out.append(Disagreement(
                "rank_device", path, (rank,), ((row[DEVICE], (rank,)),), p["judged"],
                f"rank {rank} holds {path} on {row[DEVICE]}{whose}; its own device is {p['judged']}"))
    return out

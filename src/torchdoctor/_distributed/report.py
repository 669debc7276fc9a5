"""What ``torchdoctor.distributed.check`` and ``--distributed`` report: per-rank problems and cross-rank
disagreements, as frozen dataclasses with ``to_dict()`` (``torchdoctor/distributed/1``) and a text rendering.

Rendering is separate from finding: ``render`` groups disagreements that share a kind and the ranks they blame
("dtype on rank 1 for 21 tensors"), so a whole rank in the wrong dtype is one line, not one per parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchdoctor._report.model import Problem
from torchdoctor._report.text import exit_code as exit_code_of
from torchdoctor._report.text import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, render_problems

SCHEMA = "torchdoctor/distributed/1"
# Kinds of cross-rank disagreement, in the order they are shown.
DISAGREEMENT_KINDS = ("shared_device", "rank_device", "mesh", "placement", "dtype", "shape", "requires_grad", "missing",
                      "checksum")


@dataclass(frozen=True)
class RankReport:
    """One rank's local result: the problems its scan (or simulation) found, or the error it raised."""

    rank: int
    local_rank: int
    host: str
    device: str | None  # the device this rank was judged against (explicit, or its majority)
    problems: tuple[Problem, ...]
    tensors: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "host": self.host, "device": self.device,
                "ok": self.ok, "error": self.error, "tensors": self.tensors,
                "problems": [p.to_dict() for p in self.problems]}


@dataclass(frozen=True)
class Disagreement:
    """Ranks that disagree about one tensor (or, for ``shared_device``, about their devices).

    ``values`` pairs every value seen with the ranks that hold it; ``ranks`` are the ones blamed (the minority, or
    every rank but the lowest-ranked value's holders on a tie); ``expected`` is the value the other ranks hold.
    """

    kind: str
    path: str
    ranks: tuple[int, ...]
    values: tuple[tuple[str, tuple[int, ...]], ...]
    expected: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "ranks": list(self.ranks),
                "values": {value: list(ranks) for value, ranks in self.values}, "expected": self.expected,
                "message": self.message}


@dataclass(frozen=True)
class DistributedReport:
    """Every rank's placement and where ranks disagree. Every rank of the group receives the same report.

    ``ok`` is true when no rank failed, no rank has a problem and the ranks agree; ``failed`` lists the ranks whose
    check raised (their error is in ``ranks[i].error``); ``exit_code()`` is 0, 1, or 2 when a rank could not be
    checked.
    """

    verb: str
    world_size: int
    ranks: tuple[RankReport, ...]
    disagreements: tuple[Disagreement, ...]
    checksums: bool = False

    @property
    def ok(self) -> bool:
        return not self.disagreements and all(r.ok for r in self.ranks)

    def __bool__(self) -> bool:
        return self.ok

    @property
    def failed(self) -> tuple[int, ...]:
        return tuple(r.rank for r in self.ranks if r.error is not None)

    @property
    def problems(self) -> tuple[tuple[int, Problem], ...]:
        """``(rank, problem)`` for every problem of every rank."""
        return tuple((r.rank, p) for r in self.ranks for p in r.problems)

    def exit_code(self) -> int:
        if self.failed or exit_code_of(p for _, p in self.problems) == EXIT_USAGE:
            return EXIT_USAGE
        return EXIT_OK if self.ok else EXIT_PROBLEMS

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "verb": self.verb, "ok": self.ok, "world_size": self.world_size,
                "failed": list(self.failed), "checksums": self.checksums,
                "ranks": [r.to_dict() for r in self.ranks],
                "disagreements": [d.to_dict() for d in self.disagreements]}

    def text(self, limit: int = 40) -> str:
        return render(self, limit)

    def __str__(self) -> str:
        return self.text()


def _ranks(ranks: tuple[int, ...] | list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks)


def render(report: DistributedReport, limit: int = 40) -> str:
    n = report.world_size
    bad = [r for r in report.ranks if not r.ok]
    lines = [f"ok: {n} rank(s) checked, no placement problem on any rank and the ranks agree" if report.ok else
             f"{n} rank(s) checked: {len(bad)} with problems or errors, {len(report.disagreements)} cross-rank "
             "disagreement(s)"]
    for r in report.ranks:
        where = f"{r.host} local_rank {r.local_rank}, judged against {r.device or 'its majority device'}"
        if r.error is not None:
            lines.append(f"rank {r.rank} ({r.host} local_rank {r.local_rank}): FAILED: {r.error}")
        elif r.problems:
            lines.append(f"rank {r.rank} ({where}): {len(r.problems)} problem(s) in {r.tensors} tensor paths")
            lines.extend("  " + line for line in render_problems(r.problems, limit))
        else:
            lines.append(f"rank {r.rank} ({where}): ok, {r.tensors} tensor paths")
    if report.disagreements:
        lines.append("across ranks:")
        groups: dict[tuple[str, tuple[int, ...]], list[Disagreement]] = {}
        for d in report.disagreements:
            groups.setdefault((d.kind, d.ranks), []).append(d)
        order = sorted(groups, key=lambda k: (DISAGREEMENT_KINDS.index(k[0]) if k[0] in DISAGREEMENT_KINDS else 99, k[1]))
        for kind, ranks in order[:limit]:
            items = groups[(kind, ranks)]
            if len(items) == 1:
                lines.append(f"  {kind:<13} {items[0].message}")
                continue
            shown = ", ".join(d.path for d in items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")
            lines.append(f"  {kind:<13} {_ranks(ranks)}: {len(items)} tensors, e.g. {items[0].message}")
            lines.append(f"  {'':<13} paths: {shown}")
        if len(order) > limit:
            lines.append(f"  ... and {len(order) - limit} more groups (use --json for all)")
    return "\n".join(lines)

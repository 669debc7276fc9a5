"""Text every verb shares, torch-free: schema ids, exit codes, the one error / problem-list shape, byte sizes.

``torchdoctor._env`` and ``torchdoctor._explain`` import only this from the report layer, so they stay usable
when ``import torch`` itself is broken (which ``torchdoctor env`` must diagnose).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchdoctor._report.model import Problem

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2

def schema(verb: str) -> str:
    """The ``schema`` value of a verb's JSON document.

    >>> schema("scan")
    'torchdoctor/scan/1'
    """
    return f"torchdoctor/{verb}/1"


def human_bytes(n: int) -> str:
    """
    >>> human_bytes(1536)
    '1.5 KiB'
    """
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def format_error(headline: str, culprits: Iterable[str] = (), fix: str | None = None, limit: int = 20) -> str:
    """Errors have one shape: headline, culprits, then the fix as code to paste."""
    lines = [headline]
    items = list(culprits)
    for c in items[:limit]:
        lines.append(f"  {c}")
    if len(items) > limit:
        lines.append(f"  ... and {len(items) - limit} more")
    if fix:
        lines.append("Fix:")
        lines.extend(f"    {ln}" for ln in fix.splitlines())
    return "\n".join(lines)


def render_problems(problems: Sequence[Problem], limit: int = 40) -> list[str]:
    lines = []
    ordered = sorted(problems, key=lambda p: (p.kind == "truncated", p.path))
    for p in ordered[:limit]:
        lines.append(f"  {p.kind:<16} {p.path}  {p.message}")
    if len(ordered) > limit:
        lines.append(f"  ... and {len(ordered) - limit} more problems (use --json for all)")
    return lines



r"""Text form of a checkpoint report: what an untrusted file says is printed escaped.

Keys, paths and messages come from the file. A key holding ``\r\x1b[2K`` would erase the line before it on a
terminal (hiding, say, the warning about ``posix.system``), so every character that is not printable is shown
as an escape sequence. JSON output needs no such care: the encoder escapes control characters itself.
"""

from __future__ import annotations

from typing import Any

from torchdoctor._checkpoint.dtypes import clipped
from torchdoctor._checkpoint.result import Finding
from torchdoctor._report.text import escape, human_bytes, render_problems

__all__ = ["escape", "render_checkpoint"]


def _escaped(p: Any) -> Any:
    if p.path.isprintable() and p.message.isprintable() and len(p.path) <= 120 and len(p.found) <= 120:
        return p
    changes = {"path": escape(clipped(p.path)), "message": escape(p.message), "found": clipped(p.found)}
    if isinstance(p, Finding):
        return p.replace(**changes)
    import dataclasses  # a torchdoctor.Problem: the Python API's report drawn as text (it has imported torch)

    return dataclasses.replace(p, **changes)


def render_checkpoint(report: Any, limit: int = 40) -> str:
    """Text form for the CLI: one line per checkpoint group, then problems and the device/dtype summary."""
    groups = report.extra.get("groups", [])
    layout = report.extra.get("layout")
    total = sum(g["nbytes"] for g in groups)
    head = escape(clipped(f"{report.source}", 200)) + (f" ({layout} layout)" if layout else "")
    n_files = len(report.extra.get("files", []))
    lines = [f"{head}: {len(report.tensors)} tensors, {human_bytes(total)} in {n_files} file(s)"]
    for g in groups[:limit]:
        dts = ", ".join(f"{k} x{v}" for k, v in sorted(g["dtypes"].items(), key=lambda kv: -kv[1]))
        where = ", ".join(g["saved_on"]) or "-"
        size = human_bytes(g["nbytes"])
        lines.append(f"  {escape(clipped(g['group'])):<24} {g['tensors']:>6} tensors {size:>11}  saved on {where}  {dts}")
        if g.get("index_missing"):
            missing = g["index_missing"]
            lines.append(f"    index lists {len(missing)} key(s) no shard holds, e.g. {escape(clipped(missing[0]))}")
    if len(groups) > limit:
        lines.append(f"  ... and {len(groups) - limit} more groups")
    want = report.expected.get("", {})
    if want:
        lines.append("checked against: " + ", ".join(f"{k} {v}" for k, v in want.items()))
    for group, exp in report.expected.items():
        if group and "why" in exp:
            lines.append(f"expected in {escape(group)}: {exp['dtype']} ({escape(exp['why'])})")
    if report.problems:
        lines.append(f"{len(report.problems)} problem(s):")
        lines.extend(render_problems([_escaped(p) for p in report.problems], limit))
    else:
        lines.append("ok: no problems found")
    lines.append("by saved device and dtype, each storage once:")
    for s in report.summary[:limit]:
        lines.append(f"  {s['device']:<8} {s['dtype']:<14} {s['tensors']:>7} tensors  {human_bytes(s['nbytes']):>11}")
    return "\n".join(lines)


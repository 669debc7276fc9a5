"""The agreement run's markdown: the environment, then one row per case with every side in its own column.

Cells are short (the JSON beside it keeps everything): a long error text is cut with an ellipsis, and a pipe in
any text is escaped so a row never splits.
"""

from __future__ import annotations

from typing import Any

COLUMNS = ("case", "real", "simulate", "virtual_devices", "guard explain / strict / fix", "scan", "move",
           "trace", "explain", "guard cost", "verdict")


def cut(text: Any, n: int = 70) -> str:
    s = str(text).replace("|", "\\|").replace("\n", " ")
    return s if len(s) <= n else s[: n - 1] + "…"


def predicted(p: dict[str, Any]) -> str:
    if "broken" in p:
        return "BROKEN " + cut(p["broken"], 50)
    if p["ok"]:
        return "ok"
    first = p["problems"][0] if p["problems"] else None
    return f"{first['kind']} `{cut(first['path'], 50)}`" if first else cut(p.get("raised") or "problems", 50)


def real(r: dict[str, Any]) -> str:
    if r.get("not_run"):
        return "not run here"
    if not r["raises"]:
        return "runs"
    off = r.get("culprit_at") or {}
    where = f" ({off['path']} on {off.get('device')}, {off.get('dtype')})" if off.get("device") else ""
    return "raises: " + cut(r["error"], 120) + where  # the error's own words: the JSON keeps its whole first line


def guard(g: dict[str, Any]) -> str:
    cells = []
    for mode in ("explain", "strict", "fix"):
        x = g[mode]
        if "broken" in x:
            cells.append("BROKEN")
        elif x.get("not_run"):
            cells.append("—")
        elif x.get("raised"):
            named = f" `{cut(x['named'][0], 40)}`" if x.get("named") else ""
            cells.append(("named" if x["raised"] == "PlacementError" else x["raised"]) + named)
        else:
            cells.append(f"fixed {x['fixes']}" if x.get("fixes") else "ran")
    return " / ".join(cells)


def scan(s: dict[str, Any] | None) -> str:
    if not s:
        return "—"
    if "broken" in s:
        return "BROKEN"
    return "clean" if s["ok"] else f"{s['count']}: `{cut(s['named'][0], 40)}`" if s["named"] else f"{s['count']}"


def move(m: dict[str, Any] | None) -> str:
    if not m:
        return "—"
    if "broken" in m:
        return "BROKEN"
    head = f"refused: {cut(m['refused'], 40)}" if m.get("refused") else f"moved {m['moved']}"
    return f"{head}, then {scan(m['after'])}"


def trace(t: dict[str, Any] | None) -> str:
    if not t:
        return "—"
    if "broken" in t:
        return "BROKEN"
    hist = t.get("culprit_history")
    return f"{t['records']} records" + ("" if hist is None else f", culprit moved {len(hist)}x")


def cost(o: dict[str, Any] | None) -> str:
    if not o:
        return "—"
    if "broken" in o:
        return "BROKEN"
    same = "same output" if o["same_output"] else "OUTPUT DIFFERS"
    return f"{o['added_ms']:+.3f} ms on {o['plain_ms']} ms, {same}"


def markdown(result: dict[str, Any]) -> str:
    env = result["env"]
    lines = [f"# gpu_agreement: {result['mode']} run, {env['date']}", "",
             ", ".join(f"{k} {v}" for k, v in env.items() if k != "date"), "",
             f"{len(result['cases'])} cases, {result['disagreements']} disagreeing, {result['seconds']} s.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in result["cases"]:
        if r.get("not_run"):
            lines.append(f"| `{r['case']}` | not run: {r['not_run']} |" + " |" * (len(COLUMNS) - 2))
            continue
        explain = (r.get("explain") or {}).get("category") or "—"
        verdict = "agrees" if not r["disagreements"] else "**" + cut("; ".join(r["disagreements"]), 160) + "**"
        if r.get("note"):
            verdict += f" ({cut(r['note'], 80)})"
        cells = [f"`{r['case']}`", real(r["real"]), predicted(r["simulate"]), predicted(r["virtual_devices"]),
                 guard(r["guard"]), scan(r["scan"]), move(r["move"]), trace(r["trace"]), explain,
                 cost(r["overhead"]), verdict]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Mechanisms:", ""]
    for r in result["cases"]:
        why = r.get("expected_policy_only")
        lines.append(f"- `{r['case']}`: {r['mechanism']}" + (f" (policy: {why})" if why else ""))
    return "\n".join(lines) + "\n"

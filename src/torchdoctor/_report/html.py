"""The HTML device map: one self-contained page (no network, works from ``file://``) built from a report's
``to_dict()``, so scan, move and simulate reports share it.

The page leads with what to act on, so the first culprit is on the first screen: one card per problem or per
group of alike problems (path, found, expected, why, where it surfaced, the fix with a copy button; after
:data:`OPEN_CARDS` the rest fold under one line), then one card per component not yet on the device asked for.
The overview follows: a legend (a colour per device and per dtype), totals by device x dtype with bytes, the
module outline, and the module tree. The tree is rendered lazily from JSON embedded in the page: only opened
nodes get DOM, siblings come in chunks, so a 70B-shaped model stays responsive. Text from the report (paths can
hold anything) reaches the page escaped (cards) or through ``textContent`` (tree). The stylesheet is scoped under
the map's own id, so a notebook's output CSS cannot re-lay it out (``html_assets``).

>>> doc = {"schema": "torchdoctor/scan/1", "ok": True, "source": "<m>", "problems": [],
...        "tensors": [{"path": "w", "role": "parameter", "device": "cpu", "dtype": "float32", "shape": [2],
...                     "nbytes": 8, "alias_of": None}]}
>>> page = render_html(doc)
>>> page.startswith("<!DOCTYPE html>") and "&lt;m&gt;" in page and "<m>" not in page
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torchdoctor._report.text import by_urgency, group_fix, group_problems, human_bytes, reason

if TYPE_CHECKING:
    from torchdoctor._report.order import Relocation

# The standard library's ``html`` (its entity table), ``hashlib``, ``secrets``, ``json``, the page's CSS/JS, the
# outline and the relocations (``order``, a dataclass) are imported by the functions that draw a page: every scan
# and move imports this module through the result types, and only a page needs them (issue 28: the first call of a
# verb pays its imports).

MAX_TENSORS = 200_000  # rows embedded in one page (a 70B Llama has about 720); more are counted, not drawn
MAX_CARDS = 300  # problem cards (groups of alike problems count once)
MISSED_SHOWN = 40  # lines of what Module.to would miss before "... and N more"
OPEN_CARDS = 10  # cards shown before "N more": the relocations and the overview stay near the top

_DEVICE_COLORS = {"cpu": "#6b7a8f", "meta": "#9c6b3c", "mps": "#b0459b", "xpu": "#2f6fd6", "disk": "#8a8a2e",
                  "hpu": "#7a4fd0", "npu": "#c4572a"}
_CUDA = ["#2e9e44", "#0f8a83", "#7cb82f", "#116149", "#4fc08d", "#1f6f5c", "#98c13d", "#2b8c6b"]
_DTYPE_COLORS = {"float32": "#3a78d8", "bfloat16": "#f08a24", "float16": "#f2c12e", "float64": "#8e44ad",
                 "complex64": "#00a7c4", "complex128": "#00788c", "int8": "#7d8a96", "uint8": "#5f6b75",
                 "int32": "#a0a8b0", "int64": "#8c949c", "int16": "#b4bbc2", "bool": "#cfd4d9",
                 "float8_e4m3fn": "#e0457b", "float8_e5m2": "#c2185b", "mixed": "#ffffff"}


def _escape(text: str) -> str:
    from html import escape

    return escape(text)


def _hashed(name: str) -> str:
    import colorsys
    import hashlib

    h = int(hashlib.sha1(name.encode("utf-8", "replace")).hexdigest()[:6], 16)
    r, g, b = colorsys.hls_to_rgb((h % 360) / 360, 0.5, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def device_color(name: str) -> str:
    """A stable colour for a device (``cuda:N`` take greens by index; unknown names a hashed hue).

    >>> device_color("cuda:0"), device_color("cpu")
    ('#2e9e44', '#6b7a8f')
    """
    if name in _DEVICE_COLORS:
        return _DEVICE_COLORS[name]
    kind, _, index = name.partition(":")
    if kind == "cuda":
        return _CUDA[int(index) % len(_CUDA)] if index.isdigit() else _CUDA[0]
    if kind in _DEVICE_COLORS and index.isdigit() and index == "0":
        return _DEVICE_COLORS[kind]
    return "#9e9e9e" if name == "mixed" else _hashed(name)


def dtype_color(name: str) -> str:
    return _DTYPE_COLORS.get(name) or _hashed("dtype:" + name)


def _script_json(value: Any) -> str:
    """JSON safe inside ``<script>``: no ``</script>``, no ``<!--``, no HTML-significant characters."""
    import json

    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def dtype_name(text: str) -> str:
    """One name per dtype on every map: a compact form's ``bf16`` is ``bfloat16`` (so it gets bfloat16's colour).
    Needs torchdoctor's dtype table, loaded whenever a report holds compact forms (move, simulate)."""
    import sys

    placement = sys.modules.get("torchdoctor._placement")
    if placement is None:
        return text
    try:
        return str(placement.dtype_str(placement.parse_dtype(text)))
    except Exception:  # not a dtype torch knows here: keep the text
        return text


def _compact_device(text: str) -> tuple[str, str]:
    """``bf16[4]@cuda:0`` -> (``cuda:0``, ``bfloat16``): move reports carry compact forms."""
    dtype, _, rest = text.partition("[")
    return rest.rpartition("@")[2] or "?", dtype_name(dtype) if dtype else "?"


def _rows(doc: Mapping[str, Any]) -> tuple[list[list[Any]], list[str], list[str], list[str], int]:
    devices: dict[str, int] = {}
    dtypes: dict[str, int] = {}
    roles: dict[str, int] = {}
    rows: list[list[Any]] = []

    def idx(table: dict[str, int], key: Any) -> int:
        return table.setdefault(str(key), len(table))

    tensors = doc.get("tensors") or []
    total = len(tensors)
    for t in tensors[:MAX_TENSORS]:
        rows.append([str(t.get("path", "")), idx(devices, t.get("device")), idx(dtypes, t.get("dtype")),
                     idx(roles, t.get("role", "")), list(t.get("shape") or []), int(t.get("nbytes") or 0),
                     t.get("alias_of") or 0])
    for m in (doc.get("moved") or [])[:MAX_TENSORS]:  # a move report: where each tensor went
        dev, dt = _compact_device(str(m.get("to", "")))
        rows.append([str(m.get("path", "")), idx(devices, dev), idx(dtypes, dt), idx(roles, "moved"), [],
                     int(m.get("nbytes") or 0), 0, f"{m.get('from')} -> {m.get('to')}"])
        total += 1
    return rows, list(devices), list(dtypes), list(roles), total


def _totals(doc: Mapping[str, Any], rows: list[list[Any]], devices: list[str], dtypes: list[str]) -> list[dict[str, Any]]:
    summary = [dict(g) for g in doc.get("summary") or [] if isinstance(g, Mapping) and "device" in g and "dtype" in g]
    if summary:
        return summary
    acc: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if r[6]:
            continue
        key = (devices[r[1]], dtypes[r[2]])
        g = acc.setdefault(key, {"device": key[0], "dtype": key[1], "tensors": 0, "nbytes": 0})
        g["tensors"] += 1
        g["nbytes"] += r[5]
    return list(acc.values())


def _totals_table(groups: list[dict[str, Any]]) -> str:
    e = _escape
    devs = list(dict.fromkeys(str(g["device"]) for g in groups))
    dts = list(dict.fromkeys(str(g["dtype"]) for g in groups))
    cell = {(str(g["device"]), str(g["dtype"])): g for g in groups}
    head = "".join(f'<th><span class="sw" style="background:{dtype_color(d)}"></span>{e(d)}</th>' for d in dts)
    out = [f'<table class="totals"><tr><th>device \\ dtype</th>{head}<th>total</th></tr>']
    col_bytes = dict.fromkeys(dts, 0)
    for dev in devs:
        tds, row_bytes = [], 0
        for d in dts:
            g = cell.get((dev, d))
            if g is None:
                tds.append("<td></td>")
                continue
            nbytes = int(g.get("nbytes") or 0)
            row_bytes += nbytes
            col_bytes[d] += nbytes
            tds.append(f'<td data-device="{e(dev)}" data-dtype="{e(d)}">{int(g.get("tensors") or 0)} tensors<br>'
                       f"{e(human_bytes(nbytes))}</td>")
        out.append(f'<tr><th><span class="sw" style="background:{device_color(dev)}"></span>{e(dev)}</th>'
                   f'{"".join(tds)}<td>{e(human_bytes(row_bytes))}</td></tr>')
    foot = "".join(f"<td>{e(human_bytes(col_bytes[d]))}</td>" for d in dts)
    out.append(f"<tr><th>total</th>{foot}<td>{e(human_bytes(sum(col_bytes.values())))}</td></tr></table>")
    return "".join(out)


def _cards(problems: list[Mapping[str, Any]], source: str | None) -> str:
    e = _escape
    groups = by_urgency(group_problems(problems))
    out = []
    for g in groups[:MAX_CARDS]:
        p = g.first
        path = str(p.get("path", ""))
        title = f"{len(g.members)} tensors under {g.under}" if g.under is not None else path
        rows = [("found", p.get("found")), ("expected", p.get("expected")),
                ("why", reason(p) if g.under is not None else p.get("message"))]
        if p.get("op"):  # simulate: the op and module where the problem surfaced
            where = f"op {p.get('op')}"
            if p.get("module_path") is not None:
                where += f" in module {p.get('module_path') or '<root>'}"
                where += f" ({p.get('module_type')})" if p.get("module_type") else ""
            rows.append(("surfaced", where))
        dl = "".join(f"<dt>{e(k)}</dt><dd>{e(str(v))}</dd>" for k, v in rows if v not in (None, ""))
        members = ""
        if g.under is not None:
            items = "".join(f'<li><code>{e(str(m.get("path")))}</code></li>' for m in g.members[:500])
            more = f"<li>... and {len(g.members) - 500} more</li>" if len(g.members) > 500 else ""
            members = f'<details class="members"><summary>all {len(g.members)} paths</summary><ul>{items}{more}</ul></details>'
        fix = group_fix(g, source)
        fix_html = (f'<div class="fix"><pre><code>{e(fix)}</code></pre><button class="copy" type="button">copy</button>'
                    "</div>") if fix else ""
        out.append(f'<div class="card" data-kind="{e(g.kind)}" data-path="{e(path)}"><div>'
                   f'<span class="kind">{e(g.kind)}</span><code class="path">{e(title)}</code> '
                   f'<button class="goto" type="button" data-path="{e(path)}">show in tree</button></div>'
                   f"<dl>{dl}</dl>{members}{fix_html}</div>")
    if len(out) > OPEN_CARDS:
        folded = sum(len(g.members) for g in groups[OPEN_CARDS:MAX_CARDS])
        out[OPEN_CARDS:] = [f'<details class="rest"><summary>{folded} more problem(s) in {len(out) - OPEN_CARDS} '
                            f'card(s)</summary><div class="cards">{"".join(out[OPEN_CARDS:])}</div></details>']
    if len(groups) > MAX_CARDS:
        rest = sum(len(g.members) for g in groups[MAX_CARDS:])
        out.append(f'<p class="note">... and {rest} more problems (all are marked in the tree)</p>')
    return '<div class="cards">' + "".join(out) + "</div>"


def _outline_table(rows: list[list[Any]], devices: list[str], dtypes: list[str]) -> str:
    """Modules with their sizes, repeated blocks as one range row, bars proportional to bytes."""
    e = _escape
    from torchdoctor._report.layout import outline

    blocks = outline(rows, devices, dtypes)
    if not blocks:
        return ""
    biggest = max(b.nbytes for b in blocks) or 1
    out = ['<table class="outline">']
    for b in blocks:
        each = f"{b.count} \u00d7 {human_bytes(b.nbytes // b.count)} = " if b.count > 1 else ""
        sw = "".join(f'<span class="sw" style="background:{device_color(d)}" title="{e(d)}"></span>' for d in b.devices)
        st = "".join(f'<span class="sw" style="background:{dtype_color(d)}" title="{e(d)}"></span>' for d in b.dtypes)
        width = max(0.5, 100.0 * b.nbytes / biggest)
        out.append(f'<tr data-path="{e(b.label)}" data-count="{b.count}" data-bytes="{b.nbytes}">'
                   f'<td style="padding-left:{6 + 14 * b.depth}px"><code>{e(b.label)}</code></td>'
                   f'<td class="num">{e(each + human_bytes(b.nbytes))}</td>'
                   f'<td>{sw} {e(", ".join(b.devices))}</td><td>{st} {e(", ".join(b.dtypes))}</td>'
                   f'<td class="barcell"><span class="size" style="width:{width:.1f}%"></span></td></tr>')
    out.append("</table>")
    return "".join(out)


def _relocation_cards(moves: list[Relocation]) -> str:
    """One card per component not yet on the device asked for, with the one move that fixes it."""
    e = _escape
    out = []
    for m in sorted(moves, key=lambda m: m.component):
        name = m.component or "<root>"
        items = "".join(f'<li><code>{e(str(p.get("path")))}</code></li>' for p in m.members[:500])
        more = f"<li>... and {len(m.members) - 500} more</li>" if len(m.members) > 500 else ""
        out.append(f'<div class="card move" data-kind="relocation" data-path="{e(m.component)}"><div>'
                   f'<span class="kind">not yet moved</span><code class="path">{e(name)}: {len(m.members)} tensors '
                   f'on {e(m.found)}, {e(m.expected)} asked for</code></div>'
                   f'<details class="members"><summary>all {len(m.members)} paths</summary><ul>{items}{more}</ul>'
                   f'</details><div class="fix"><pre><code>{e(m.fix())}</code></pre>'
                   '<button class="copy" type="button">copy</button></div></div>')
    return '<div class="cards">' + "".join(out) + "</div>"


def _missed(doc: Mapping[str, Any]) -> str:
    """What ``Module.to`` would miss (a move's or a plan's ``missed_by_module_to``): the reason to use ``move``,
    one line each, before the overview."""
    paths = [str(p) for p in doc.get("missed_by_module_to") or []]
    if not paths:
        return ""
    rows = {str(m.get("path")): (m.get("from"), m.get("to")) for m in doc.get("moved") or [] if isinstance(m, Mapping)}
    rows.update({str(m.get("path")): (m.get("found"), m.get("expected")) for m in doc.get("plan") or []
                 if isinstance(m, Mapping)})
    e = _escape
    items = "".join(f'<li data-path="{e(p)}"><code>{e(p)}</code> {e(" -> ".join(str(x) for x in rows.get(p, ()) if x))}'
                    "</li>" for p in paths[:MISSED_SHOWN])
    more = (f"<li>... and {len(paths) - MISSED_SHOWN} more (use --json for all)</li>" if len(paths) > MISSED_SHOWN
            else "")
    verb = "would have missed" if doc.get("moved") is not None else "would miss"
    return f'<h2>What Module.to {verb} ({len(paths)})</h2><ul class="missed">{items}{more}</ul>'


def _heading(doc: Mapping[str, Any], n_problems: int, n_real: int, n_moved: int) -> str:
    e = _escape
    verb = str(doc.get("schema", "torchdoctor/scan/1")).split("/")[1:2] or ["scan"]
    bits = [f"{verb[0]} of {doc.get('source') or doc.get('device') or 'an object'}"]
    if doc.get("device") and verb[0] != "scan":
        bits.append(f"on {'virtual ' if verb[0] == 'simulate' else ''}{doc.get('device')}"
                    + (f" in {doc.get('dtype')}" if doc.get("dtype") else ""))
    if doc.get("ops"):
        bits.append(f"{doc.get('ops')} ops")
    if doc.get("stopped"):
        bits.append(f"stopped early: {doc.get('stopped')}")
    status = ('<span class="ok">ok: no placement problems</span>' if not n_problems
              else f'<span class="bad-count">{n_problems} problem(s)</span>')
    if n_moved:  # the text report's split: what to fix, then what one move per component fixes
        status += f": {n_real} to fix, {n_moved} not yet on the device asked for"
    return f'<div class="meta">{e(" · ".join(str(b) for b in bits))} — {status}</div>'


def render_html(doc: Mapping[str, Any], *, title: str | None = None, full: bool = True) -> str:
    """The device map of a report document (``report.to_dict()``): a whole page, or (``full=False``) a
    fragment for a notebook cell. Self-contained and escaped."""
    import json
    import secrets

    from torchdoctor._report.html_assets import CSS, JS
    from torchdoctor._report.order import split_relocations

    e = _escape
    problems = [p for p in doc.get("problems") or [] if isinstance(p, Mapping)]
    rows, devices, dtypes, roles, total = _rows(doc)
    totals = _totals(doc, rows, devices, dtypes)
    for g in totals:  # the legend and colours also cover what only the totals name
        if str(g["device"]) not in devices:
            devices.append(str(g["device"]))
        if str(g["dtype"]) not in dtypes:
            dtypes.append(str(g["dtype"]))
    payload = {
        "tensors": rows, "devices": devices, "dtypes": dtypes, "roles": roles,
        "problems": [{k: p.get(k) for k in ("kind", "path", "message", "found", "expected")} for p in problems],
        "colors": {"device": {d: device_color(d) for d in [*devices, "mixed"]},
                   "dtype": {d: dtype_color(d) for d in [*dtypes, "mixed"]}},
    }
    source = doc.get("source")
    expected = doc.get("expected")
    real, moves = split_relocations(problems, expected if isinstance(expected, Mapping) else None,
                                    doc.get("tensors") or ())
    root_id = "tdm-" + secrets.token_hex(6)
    legend = ('<div class="legend"><b>devices</b> ' + "".join(
        f'<span class="item" data-device="{e(d)}"><span class="sw" style="background:{device_color(d)}"></span>{e(d)}</span>'
        for d in devices) + " <b>dtypes</b> " + "".join(
        f'<span class="item" data-dtype="{e(d)}"><span class="sw" style="background:{dtype_color(d)}"></span>{e(d)}</span>'
        for d in dtypes) + "</div>")
    cut = (f'<p class="note">{total - len(rows)} more tensors are counted in the totals but not drawn '
           "(use --json for all)</p>") if total > len(rows) else ""
    # the rules are written under .tdmap; under this map's id they outrank a notebook's own table rules
    css = CSS.replace(".tdmap", "#" + root_id)
    outline_table = _outline_table(rows, devices, dtypes)
    # what to act on comes first, so the first culprit is on the first screen; the overview and the tree follow
    body = (
        f'<div class="tdmap" id="{root_id}"><style>{css}</style>'
        f"<h1>torchdoctor device map</h1>{_heading(doc, len(problems), len(real), sum(len(m.members) for m in moves))}"
        + (f"<h2>Problems to fix ({len(real)})</h2>{_cards(real, str(source) if source else None)}" if real else "")
        + (f"<h2>Not yet on the device asked for</h2>{_relocation_cards(moves)}" if moves else "")
        + _missed(doc)
        + f"{legend}<h2>Totals by device and dtype</h2>"
        + (_totals_table(totals) if totals else '<p class="note">no tensors</p>')
        + (f'<h2>Modules</h2><div class="outline-box">{outline_table}</div>' if outline_table else "")
        + f'<h2>Tensors by path ({total})</h2><div class="searchbar"><input class="q" type="search" '
        f'placeholder="search paths, e.g. layers.3.mlp" aria-label="search paths"><span class="hitcount"></span></div>'
        f'<div class="hits"></div>{cut}<div class="tree"></div>'
        '<noscript><p class="note">The tree needs JavaScript; totals and problems above are complete.</p></noscript>'
        f'<script type="application/json" class="td-data">{_script_json(payload)}</script>'
        f"<script>{JS.replace('ROOT_ID', json.dumps(root_id))}</script></div>"
    )
    if not full:
        return body
    head_title = e(title or f"torchdoctor map: {source or doc.get('schema', '')}")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
            f"<meta name=\"viewport\" content=\"width=device-width\"><title>{head_title}</title></head>"
            f"<body>{body}</body></html>\n")


__all__ = ["device_color", "dtype_color", "dtype_name", "render_html"]

"""Environment doctor: judge the facts of this machine (or saved ones) and say which device to use, and why.

``env_report()`` collects the facts (``torchdoctor._env.facts``), runs the rules (``torchdoctor._env.rules``), lets
``torchdoctor._env.devices`` choose a device and probe its dtypes, and returns an ``EnvReport`` that renders as text
or as JSON (``torchdoctor/env/1``); ``torchdoctor env`` is its command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchdoctor._env.complete import complete_facts
from torchdoctor._env.facts import collect_facts
from torchdoctor._env.launch import describe
from torchdoctor._report.text import public_types
from torchdoctor._report.views import ResultViews

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._env.devices import DeviceChoice
    from torchdoctor._env.rules.registry import EnvFinding

ENV_SCHEMA = "torchdoctor/env/1"
SHOWN_PACKAGES = (
    "intel-extension-for-pytorch", "ipex-llm", "bitsandbytes", "xformers", "triton", "transformers", "diffusers", "peft",
    "accelerate", "torchvision", "torchaudio", "torchao", "optimum-quanto", "safetensors", "numpy", "huggingface-hub",
)


def _recorded(caps: Any) -> dict[str, Any] | None:
    """Capabilities saved with ``env --json``, if they have the shape ``render`` reads (a table of dicts)."""
    if not isinstance(caps, dict) or not caps.get("probed"):
        return caps if isinstance(caps, dict) else None
    rows = caps.get("dtypes")
    keys = {"device", "recommended", "recommended_reason"} <= caps.keys()
    if not keys or not isinstance(rows, dict) or not all(
            isinstance(r, dict) and all(isinstance(k, str) for k in r) for r in rows.values()):
        return None
    return caps


# --- the report ------------------------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class EnvReport(ResultViews):
    """What ``torchdoctor env`` says: ``.facts``, ``.findings``, ``.device`` (a ``DeviceChoice`` or None),
    ``.choice`` (the device decision as JSON), ``.capabilities``, ``.ok`` (no warning or error), ``.to_dict()``."""

    facts: dict[str, Any]
    findings: tuple[EnvFinding, ...]
    device: DeviceChoice | None
    choice: dict[str, Any]
    capabilities: dict[str, Any]
    source: str = "this machine"

    @property
    def ok(self) -> bool:
        return not any(f.severity in ("warning", "error") for f in self.findings)

    def __bool__(self) -> bool:
        return self.ok

    def to_dict(self) -> dict[str, Any]:
        return {"schema": ENV_SCHEMA, "facts": self.facts, "findings": [f.to_dict() for f in self.findings],
                "device": self.choice, "capabilities": self.capabilities}

    def text(self) -> str:
        return render(self)

    def markdown(self) -> str:
        """A block to paste into a bug report (``torchdoctor env --markdown``)."""
        return render_markdown(self)

    def __str__(self) -> str:
        return self.text()


public_types(EnvReport)


def env_report(facts: dict[str, Any] | None = None, *, probe: bool = False) -> EnvReport:
    """Diagnose this machine (``facts=None``) or saved facts: findings, device choice and dtype capabilities.

    ``facts`` may be the ``facts`` part of ``torchdoctor env --json`` or the whole document (its recorded
    capabilities are kept: they cannot be probed away from the machine).

    >>> report = env_report({"torch": {"version": "2.13.0+cpu", "build": "cpu"}})
    >>> report.ok, report.choice["device"], [f.code for f in report.findings]
    (True, 'cpu', ['cpu_only_build'])
    """
    from torchdoctor._env import devices as _devices
    from torchdoctor._env.rules.registry import run_rules

    recorded: dict[str, Any] | None = None
    if facts is None:
        full, source = complete_facts(collect_facts(probe=probe)), "this machine"
        here = _devices.virtual_view()
        if here is not None:  # inside virtual_devices / run --device: the device choice follows the virtual world
            full = complete_facts({**full, **here.get("facts", {})})
            source = f"this machine, as the virtual {here.get('type', 'device')} run sees it"
    else:
        if isinstance(facts, dict) and str(facts.get("schema", "")).startswith("torchdoctor/env/") and "facts" in facts:
            recorded = _recorded(facts.get("capabilities"))
            facts = facts["facts"]
        full, source = complete_facts(facts), "saved facts"
    findings = run_rules(full)
    choice = _devices.decide_safely(full)
    device: DeviceChoice | None = None
    if choice["device"] is not None and full["torch"]["importable"]:
        try:
            device = _devices.DeviceChoice.from_doc(choice)
        except Exception:  # torch unusable here although the facts say it works (saved facts)
            device = None
    if recorded is not None:
        caps = recorded
    elif choice["device"] is None:
        caps = {"device": None, "probed": False, "note": "no device chosen"}
    elif facts is not None:
        note = "facts from another run: capabilities are probed on the machine itself"
        caps = {"device": choice["device"], "probed": False, "note": note}
    elif choice["device"] == "cpu" or probe:
        try:
            caps = _devices.capabilities(choice["device"])
        except Exception as exc:
            caps = {"device": choice["device"], "probed": False, "note": f"probe failed: {type(exc).__name__}: {exc}"[:300]}
    else:
        caps = {"device": choice["device"], "probed": False,
                "note": f"not probed: `torchdoctor env --probe` runs small ops on {choice['device']}"}
    return EnvReport(full, findings, device, choice, caps, source)


def _yes(value: Any) -> str:
    return "yes" if value is True else "no" if value is False else "-"


def render(report: EnvReport) -> str:
    f, lines = report.facts, []
    t, p = f["torch"], f["platform"]
    lines.append(f"torchdoctor env ({report.source}; availability {f['availability_source']})")
    lines.append(f"  python        {f['python']['version']}  {f['python']['executable'] or ''}".rstrip())
    flags = f" ({', '.join(p['cpu_flags'])})" if p["cpu_flags"] else ""
    lines.append(f"  platform      {p['system']} {p['machine']}, {p['cpu'] or 'CPU'}{flags}")
    lines.append(f"  os            {_os_ram(f)}")
    if t["importable"]:
        extra = ", ".join(f"{k} {t[k]}" for k in ("cuda", "hip", "xpu") if t[k]) + (", mps built" if t["mps_built"] else "")
        lines.append(f"  torch         {t['version']}  build: {t['build']}{' (' + extra + ')' if extra else ''}")
    else:
        lines.append(f"  torch         {t['version'] or 'not installed'}  does not import: {t['error']}")
    devs = [f"{d['vendor']} {d.get('name') or '?'}" + (f" ({d['memory_mib']} MiB)" if d.get("memory_mib") else "")
            + (f" capability {d['capability']}" if d.get("capability") else "") for d in f["devices"]]
    lines.append(f"  accelerators  {'; '.join(devs) if devs else 'none found'}")
    drivers = ", ".join(f"{k} {v}" for k, v in f["drivers"].items() if v)
    lines.append(f"  drivers       {drivers or 'none (NVIDIA, Intel, AMD)'}")
    avail = ", ".join(k for k in ("cuda", "xpu", "mps") if f[f"{k}_available"])
    lines.append(f"  available     {avail or 'no accelerator'}")
    c = report.choice
    lines.append(f"  device        {c['device'] or 'none'}: {c['reason']}")
    shown = [f"{n} {f['packages'][n]}" for n in SHOWN_PACKAGES if n in f["packages"]]
    lines.append(f"  packages      {', '.join(shown) if shown else 'none of the packages that matter'}")
    lines.append(f"  environment   {', '.join(f'{k}={v!r}' for k, v in f['env'].items()) or 'no device variable set'}")
    lines.append(f"  distributed   {describe(f)}")
    lines.extend(_capability_lines(report))
    counts = {s: sum(1 for x in report.findings if x.severity == s) for s in ("error", "warning", "info")}
    lines.append(f"findings: {counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info")
    for x in report.findings:
        lines.append(f"  [{x.severity}] {x.code}: {x.message}")
        if x.fix:
            lines.append(f"      Fix: {x.fix}")
    return "\n".join(lines)



_PRIVATE_VARS = frozenset({"MASTER_ADDR"})  # a host name or address: not for a public issue


def _md(text: Any) -> str:
    return str(text).replace("`", "'")


def _os_ram(f: dict[str, Any]) -> str:
    host, p = f.get("host") or {}, f["platform"]
    name = host.get("os") or " ".join(x for x in (p["system"], p["release"]) if x) or "?"
    ram = host.get("memory_mib")
    return f"{name}, RAM {ram / 1024:.1f} GiB" if ram else f"{name}, RAM unknown"


def _capability_lines(report: EnvReport) -> list[str]:
    """The dtype capability table of the chosen device (text and Markdown print the same lines)."""
    caps, lines = report.capabilities, []
    if caps.get("probed"):
        fams = list(dict.fromkeys(k for row in caps["dtypes"].values() for k in row))
        origin = "small real ops run here" if report.source == "this machine" else "recorded with the saved facts"
        lines.append(f"capabilities of {caps['device']} ({origin}):")
        lines.append(("  " + "dtype".ljust(15) + "".join(fam.ljust(12) for fam in fams)).rstrip())
        for name, row in caps["dtypes"].items():
            lines.append(("  " + name.ljust(15) + "".join(_yes(row.get(fam)).ljust(12) for fam in fams)).rstrip())
        lines.append(f"  recommended dtype: {caps['recommended']} ({caps['recommended_reason']})")
    else:
        lines.append(f"capabilities: {caps.get('note', 'not probed')}")
    return lines


def render_markdown(report: EnvReport) -> str:
    """Key facts in a fenced block, then the findings as a list: what ``accelerate env`` / ``diffusers-cli env``
    print for issues. Paths (the Python executable, torch's directory) and MASTER_ADDR are left out."""
    import torchdoctor

    f, c = report.facts, report.choice
    t, p = f["torch"], f["platform"]
    build = t["build"] or "?"
    extra = ", ".join(f"{k} {t[k]}" for k in ("cuda", "hip", "xpu") if t[k])
    torch_line = (f"{t['version']} (build {build}{', ' + extra if extra else ''})" if t["importable"]
                  else f"{t['version'] or 'not installed'} (does not import: {t['error']})")
    devs = "; ".join(f"{d['vendor']} {d.get('name') or '?'}" + (f" ({d['memory_mib']} MiB)" if d.get("memory_mib") else "")
                     + (f" capability {d['capability']}" if d.get("capability") else "") for d in f["devices"])
    rows = [
        ("torchdoctor", torchdoctor.__version__),
        ("Python", f["python"]["version"]),
        ("Platform", f"{p['system']} {p['machine']} {p['release'] or ''}".strip() + (f", {p['cpu']}" if p["cpu"] else "")
         + (f" ({', '.join(p['cpu_flags'])})" if p["cpu_flags"] else "")),
        ("OS", _os_ram(f)),
        ("torch", torch_line),
        ("Accelerators", devs or "none found"),
        ("Drivers", ", ".join(f"{k} {v}" for k, v in f["drivers"].items() if v) or "none"),
        ("Available", ", ".join(k for k in ("cuda", "xpu", "mps") if f[f"{k}_available"]) or "no accelerator"),
        ("Device choice", f"{c['device'] or 'none'} ({c['reason']})"),
        ("Distributed", describe(f, master=False)),
        ("Packages", ", ".join(f"{n} {f['packages'][n]}" for n in SHOWN_PACKAGES if n in f["packages"]) or "none"),
        ("Variables", ", ".join(f"{k}={'<set>' if k in _PRIVATE_VARS else v}" for k, v in f["env"].items()) or "none"),
    ]
    width = max(len(k) for k, _ in rows)
    counts = {s: sum(1 for x in report.findings if x.severity == s) for s in ("error", "warning", "info")}
    lines = ["### Environment (`torchdoctor env --markdown`)", "", "```text"]
    lines.extend(f"{k + ':':<{width + 1}} {v}" for k, v in rows)
    lines += ["", *_capability_lines(report)]
    lines += ["```", "", f"**Findings**: {counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info"]
    if not report.findings:
        lines.append("- none")
    for x in report.findings:
        lines.append(f"- **{x.severity}** `{x.code}`: {_md(x.message)}")
        if x.fix:
            lines.append(f"  - fix: `{_md(x.fix)}`")
    return "\n".join(lines)

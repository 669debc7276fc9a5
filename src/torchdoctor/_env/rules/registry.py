"""Environment rules: pure functions of the facts dict (see ``torchdoctor._env.facts``) that return findings.

Rules are data: ``@rule("code")`` registers a function in ``RULES`` and refuses a duplicate code. A rule reads
facts only (never the live machine), so a user's ``torchdoctor env --json`` can be diagnosed anywhere.
Package names in ``facts["packages"]`` are PEP 503-normalised (``intel-extension-for-pytorch``); ``pkg()``
normalises the name it is asked for, so rules may spell it either way. This module holds the registry and the
small views of the facts that rules share; the rules are in ``builds`` (torch builds, drivers, devices, device
variables) and ``packages`` (package conflicts). Importing ``torchdoctor._env.rules`` registers all of them.

>>> codes = [f.code for f in run_rules({"torch": {"version": "2.13.0+cpu", "build": "cpu"}})]
>>> codes
['cpu_only_build']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torchdoctor._env.complete import complete_facts
from torchdoctor._env.versions import local, normalize_name, tag_family
from torchdoctor._report.text import public_types

INFO, WARNING, ERROR = "info", "warning", "error"
SEVERITIES = (ERROR, WARNING, INFO)

Facts = Mapping[str, Any]


@dataclass(frozen=True)
class EnvFinding:
    """One thing the environment doctor found: a stable ``code``, a ``severity``, what is wrong, how to fix it."""

    code: str
    severity: str
    message: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "message": self.message, "fix": self.fix}


Rule = Callable[[Facts], "list[EnvFinding]"]
RULES: dict[str, Rule] = {}


def rule(code: str) -> Callable[[Rule], Rule]:
    """Register a rule under ``code``; a second rule with the same code is a programming error."""

    def register(fn: Rule) -> Rule:
        if code in RULES:
            raise ValueError(f"duplicate environment rule code {code!r}")
        RULES[code] = fn
        return fn

    return register


def run_rules(facts: Facts, rules: Mapping[str, Rule] | None = None) -> tuple[EnvFinding, ...]:
    """All findings for ``facts`` (partial facts are completed with defaults), errors first.

    A rule that breaks on odd facts becomes an ``internal_rule_error`` info finding instead of an exception.
    """
    full = complete_facts(facts)
    out: list[EnvFinding] = []
    for code, fn in (RULES if rules is None else rules).items():
        try:
            found = fn(full)
        except Exception as exc:  # a diagnostic must not break on a user's odd facts file
            found = [EnvFinding("internal_rule_error", INFO, f"rule {code} failed: {type(exc).__name__}: {exc}")]
        out.extend(found)
    return tuple(sorted(out, key=lambda f: (SEVERITIES.index(f.severity), f.code)))


# --- small views of the facts ----------------------------------------------------------------------------


def pkg(facts: Facts, name: str) -> str | None:
    return facts["packages"].get(normalize_name(name))


def torch_v(facts: Facts) -> str:
    return facts["torch"]["version"] or pkg(facts, "torch") or "?"


def gpus(facts: Facts, vendor: str) -> list[dict[str, Any]]:
    return [d for d in facts["devices"] if d.get("vendor") == vendor]


def has_nvidia(facts: Facts) -> bool:
    return bool(facts["drivers"].get("nvidia")) or bool(gpus(facts, "nvidia"))


def has_amd_compute(facts: Facts) -> bool:
    return bool(facts["drivers"].get("rocm")) and bool(gpus(facts, "amd") or facts["drivers"].get("amdgpu"))


def has_intel_gpu(facts: Facts) -> bool:
    return bool(gpus(facts, "intel")) and bool(facts["drivers"].get("intel"))


def apple_silicon(facts: Facts) -> bool:
    p = facts["platform"]
    return p["system"] == "Darwin" and (p["machine"] == "arm64" or bool(p["rosetta"]))


def xpu_capable(facts: Facts) -> bool:
    """XPU comes from torch itself (2.4+) or from an IPEX ``+xpu`` wheel beside an older torch."""
    return facts["torch"]["build"] == "xpu" or tag_family(local(pkg(facts, "intel-extension-for-pytorch"))) == "xpu"


def wheel_index(facts: Facts) -> str:
    """The download.pytorch.org index matching this torch build: ``cpu``, ``cu128``, ``rocm6.1``, ``xpu``."""
    t = facts["torch"]
    tag = local(t["version"] or pkg(facts, "torch"))
    if tag_family(tag) in ("cuda", "rocm") and not (t["cuda"] or t["hip"]):
        return tag  # torch does not import, but its wheel tag says which index it came from
    if t["build"] == "cuda" and t["cuda"]:
        return "cu" + "".join(t["cuda"].split(".")[:2])
    if t["build"] == "rocm" and t["hip"]:
        return "rocm" + ".".join(t["hip"].split(".")[:2])
    return "xpu" if t["build"] == "xpu" else "cpu"


def hit(code: str, severity: str, message: str, fix: str | None = None) -> list[EnvFinding]:
    return [EnvFinding(code, severity, message, fix)]


def env_var(facts: Facts, name: str) -> str | None:
    value = facts["env"].get(name)
    return None if value is None else str(value)

public_types(EnvFinding)

"""Saved or partial facts made whole: every key present, package names normalised, so the rules and the device
chooser never meet a missing key.

>>> full = complete_facts({"torch": {"version": "2.5.1"}, "packages": {"Intel_Extension_For_PyTorch": "2.5.10+xpu"}})
>>> full["packages"], full["torch"]["importable"], full["drivers"]["nvidia"]
({'intel-extension-for-pytorch': '2.5.10+xpu'}, True, None)
"""

from __future__ import annotations

import copy
from typing import Any

from torchdoctor._env.facts import blank_facts
from torchdoctor._env.versions import normalize_name


def _merge(default: Any, given: Any) -> Any:
    if isinstance(default, dict):
        if not isinstance(given, dict):
            return copy.deepcopy(default)
        out = {k: _merge(v, given[k]) if k in given else copy.deepcopy(v) for k, v in default.items()}
        out.update({k: copy.deepcopy(v) for k, v in given.items() if k not in default})
        return out
    if isinstance(default, list) and not isinstance(given, list):
        return copy.deepcopy(default)
    return copy.deepcopy(given)


def complete_facts(facts: Any) -> dict[str, Any]:
    """A copy of (possibly partial) facts with every key present; package names normalised. Never mutates."""
    full: dict[str, Any] = _merge(blank_facts(), facts if isinstance(facts, dict) else {})
    for key in ("packages", "requires", "duplicates"):
        full[key] = {normalize_name(str(k)): v for k, v in full[key].items()}
    full["env"] = {str(k): str(v) for k, v in full["env"].items() if v is not None}
    full["devices"] = [d for d in full["devices"] if isinstance(d, dict)]
    flags = full["platform"]["cpu_flags"]
    full["platform"]["cpu_flags"] = [str(x) for x in flags if isinstance(x, (str, int))] if isinstance(flags, list) else []
    return full

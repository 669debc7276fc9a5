"""Every environment rule, from facts only: a positive and a negative fixture each (tests/fixtures/env/rules.json)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from torchdoctor._env.rules.registry import RULES, EnvFinding as Finding, rule, run_rules
from torchdoctor._env import versions as _env_versions
from torchdoctor._env.versions import release, satisfies

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "rules.json").read_text())
BASE = FIXTURES["base"]
CASES = FIXTURES["rules"]


def merged(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = merged(base.get(k), v) if k in base else v
        return out
    return over


def facts_for(case: dict[str, Any]) -> dict[str, Any]:
    return merged(copy.deepcopy(BASE), case)


def codes(facts: dict[str, Any]) -> list[str]:
    return [f.code for f in run_rules(facts)]


def test_at_least_twenty_rules_and_every_rule_has_fixtures() -> None:
    assert len(RULES) >= 20
    assert set(CASES) == set(RULES), "a rule without fixtures, or fixtures without a rule"
    for code, case in CASES.items():
        assert case["positive"] and case["negative"], code


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_fires_on_its_positive_fixtures(code: str) -> None:
    case = CASES[code]
    for i, positive in enumerate(case["positive"]):
        found = [f for f in run_rules(facts_for(positive)) if f.code == code]
        assert len(found) == 1, f"{code} positive #{i}: {codes(facts_for(positive))}"
        finding = found[0]
        assert finding.severity == case["severity"], (code, i)
        assert finding.message.endswith("."), finding.message  # one or two full sentences
        if finding.severity != "info":
            assert finding.fix, f"{code} must say how to fix it"
    # fragments are pinned on the first positive fixture (others may phrase the same problem differently)
    text = " ".join(f"{f.message} {f.fix}" for f in run_rules(facts_for(case["positive"][0])) if f.code == code)
    for fragment in case["contains"]:
        assert fragment in text, f"{code}: {fragment!r} not in {text!r}"


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_is_quiet_on_its_negative_fixtures(code: str) -> None:
    for i, negative in enumerate(CASES[code]["negative"]):
        assert code not in codes(facts_for(negative)), f"{code} negative #{i}"


@pytest.mark.parametrize("code", sorted(CASES))
def test_rules_are_pure_and_do_not_change_the_facts(code: str) -> None:
    facts = facts_for(CASES[code]["positive"][0])
    before = copy.deepcopy(facts)
    first = run_rules(facts)
    assert facts == before
    assert run_rules(facts) == first
    assert json.loads(json.dumps([f.to_dict() for f in first])) == [f.to_dict() for f in first]


def test_cpu_only_build_without_accelerator_is_info_and_alone() -> None:
    findings = run_rules(BASE)
    assert [(f.code, f.severity) for f in findings] == [("cpu_only_build", "info")]


def test_findings_are_sorted_errors_first() -> None:
    facts = facts_for({"torch": {"version": "2.8.0+cu128", "build": "cuda", "cuda": "12.8"}, "drivers": {"nvidia": "470.57.02"},
                       "devices": [{"vendor": "nvidia", "name": "Tesla T4", "capability": "7.5"}],
                       "env": {"CUDA_LAUNCH_BLOCKING": "1", "CUDA_VISIBLE_DEVICES": ""}})
    severities = [f.severity for f in run_rules(facts)]
    assert severities == sorted(severities, key=("error", "warning", "info").index)
    assert {"nvidia_driver_too_old", "cuda_visible_devices_hides_all", "cuda_launch_blocking"} <= set(codes(facts))


def test_duplicate_rule_code_is_refused() -> None:
    with pytest.raises(ValueError, match="duplicate environment rule code 'cpu_only_build'"):
        rule("cpu_only_build")(lambda f: [])
    assert len(RULES) == len(CASES)


def test_a_broken_rule_becomes_an_info_finding_not_an_exception() -> None:
    def boom(facts: Any) -> list[Finding]:
        raise KeyError("nope")

    findings = run_rules(BASE, {"boom": boom})
    assert [(f.code, f.severity) for f in findings] == [("internal_rule_error", "info")]
    assert "rule boom failed: KeyError" in findings[0].message


@pytest.mark.parametrize("junk", [
    {},
    {"torch": "garbage", "devices": "x", "env": None},
    {"devices": [1, None, {"vendor": "nvidia", "capability": "junk", "name": None}], "drivers": {"nvidia": "weird"}},
    {"torch": {"version": "not a version", "build": "cuda", "cuda": "x"}, "packages": {"torchvision": "??", "xformers": "1"},
     "requires": {"torchvision": ["torch==", ";;", ""], "xformers": ["torch (==2.5.1)"]}, "env": {"CUDA_VISIBLE_DEVICES": 7}},
])
def test_odd_facts_never_raise(junk: dict[str, Any]) -> None:
    findings = run_rules(junk)
    assert all(isinstance(f, Finding) for f in findings)
    assert not [f for f in findings if f.code == "internal_rule_error"], findings


def test_package_names_are_normalised_either_spelling() -> None:
    for name in ("intel_extension_for_pytorch", "Intel-Extension-For-PyTorch", "intel.extension.for.pytorch"):
        facts = facts_for({"torch": {"version": "2.3.0+cpu"}, "packages": {name: "2.1.100+cpu"}})
        assert "ipex_torch_mismatch" in codes(facts)


def test_version_helpers() -> None:
    assert release("0.45.3.dev0") == (0, 45, 3)
    assert release("0.0.28.post3") == (0, 0, 28)
    assert satisfies("2.5.1+cu121", "==2.5.1") and not satisfies("2.6.0", "==2.5.1")
    assert satisfies("2.1.10+xpu", "==2.1.10+xpu") and not satisfies("2.1.30+cpu", "==2.1.10+xpu")
    assert satisfies("1.4.2", "~=1.4") and not satisfies("2.0", "~=1.4")
    assert satisfies("2.5.1", "(>=2.4,<3)") and not satisfies("3.0", ">=2.4,<3")
    assert _env_versions.requirement('Triton==3.4.0; platform_system == "Linux"') == ("triton", "==3.4.0", 'platform_system == "Linux"')
    assert _env_versions.cuda_index_for_driver("570.133.20") == "cu128"
    assert _env_versions.cuda_index_for_driver("400.1") is None

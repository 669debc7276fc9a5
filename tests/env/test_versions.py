"""Version checks follow PEP 440, with ``packaging`` and with the fallback used when it is not importable."""

from __future__ import annotations

import builtins
import itertools
from typing import Any

import pytest

from torchdoctor._env import versions
from torchdoctor._env.rules.registry import run_rules

packaging_specifiers = pytest.importorskip("packaging.specifiers")
packaging_version = pytest.importorskip("packaging.version")

# (installed version, specifier, PEP 440's answer)
CASES = [
    ("2.5.0rc1", ">=2.5", False),  # a release candidate comes before its release
    ("2.7.0a0+git1e2f3a4", "==2.7.0", False),  # a nightly is a pre-release, whatever its local tag
    ("2.6.0.dev20241112", "==2.6.0", False),
    ("2.0.0", "===2.0", False),  # arbitrary equality compares strings
    ("2.0", "===2.0", True),
    ("2.13.0+cpu", "==2.13.0", True),  # a local tag does not matter to a public pin
    ("2.13.0+cpu", "==2.13.0+cu128", False),
    ("2.13.0+cpu", ">2.13.0", False),  # nor makes the version greater
    ("2.5.0rc1", "<2.5", False),  # ``<V`` excludes V's own pre-releases
    ("2.4.1", "<2.5", True),
    ("2.5.0.post1", ">2.5", False),  # ``>V`` excludes V's post-releases
    ("2.5.1", ">2.5", True),
    ("2.1.0rc1", "==2.1.*", True),
    ("2.10.0", "==2.1.*", False),
    ("1.4.5", "~=1.4.2", True),
    ("1.5.0", "~=1.4.2", False),
    ("2.5.1", ">=2.4,<3", True),
    ("1!1.0", ">=2.0", True),  # an epoch outranks every release
]


@pytest.mark.parametrize(("version", "spec", "expected"), CASES)
def test_satisfies_follows_pep440(version: str, spec: str, expected: bool) -> None:
    assert versions.satisfies(version, spec) is expected
    assert versions.pep440_satisfies(version, spec) is expected


def test_the_four_reported_disagreements_are_fixed_with_and_without_packaging(monkeypatch: pytest.MonkeyPatch) -> None:
    reported = [("2.5.0rc1", ">=2.5"), ("2.7.0a0+git5f3a1c", "==2.7.0"), ("2.6.0.dev20250101", "==2.6.0"),
                ("2.0.0", "===2.0")]
    assert [versions.satisfies(v, s) for v, s in reported] == [False] * 4
    real_import = builtins.__import__

    def no_packaging(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("packaging"):
            raise ImportError("no packaging here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_packaging)
    assert [versions.satisfies(v, s) for v, s in reported] == [False] * 4
    assert versions.satisfies("2.13.0+cpu", "==2.13.0") is True


VERSIONS = ["2.5", "2.5.0", "2.5.0rc1", "2.5.0a2", "2.5.0b1", "2.5.0.dev3", "2.5.0rc1.dev1", "2.5.0.post1",
            "2.5.0+cpu", "2.5.0+cu128", "2.5.1", "2.4.9", "2.6.0.dev20250101", "1!2.0", "2.5.0.post1.dev2", "3.0",
            "2.5rc1.post1", "2.5.0rc1+local.7", "2.5.0.dev0", "2.5.1.dev0", "2.5.0b2.post3.dev1"]
SPECS = ["==2.5", ">=2.5", "<=2.5", "<2.5", ">2.5", "!=2.5.0", "==2.5.*", "!=2.5.*", "~=2.5", "~=2.5.0",
         ">=2.5.0rc1", "<2.5.0rc1", ">2.5.0.dev3", "==2.5.0+cpu", "===2.5.0", ">=2.4,<2.6", ">2.5rc1", "<=2.5rc1", "~=2.5.0rc1", ">2.5.0.post1", "==1!2.5.*"]


def test_fallback_agrees_with_packaging_everywhere() -> None:
    mismatches = []
    for v, s in itertools.product(VERSIONS, SPECS):
        want = packaging_specifiers.SpecifierSet(s).contains(packaging_version.Version(v), prereleases=True)
        if versions.pep440_satisfies(v, s) is not want:
            mismatches.append((v, s, want))
    assert not mismatches


def test_version_order_matches_packaging() -> None:
    keyed = sorted(VERSIONS, key=lambda v: versions.pep440_key(v))  # type: ignore[arg-type, return-value]
    assert keyed == sorted(VERSIONS, key=packaging_version.Version)


def test_a_nightly_torch_does_not_meet_a_companions_exact_pin() -> None:
    facts = {"torch": {"version": "2.7.0a0+git5f3a1c", "build": "cpu"},
             "packages": {"torch": "2.7.0a0+git5f3a1c", "torchvision": "0.22.0+cpu"},
             "requires": {"torchvision": ["torch==2.7.0"]}}
    assert "torchvision_torch_mismatch" in [f.code for f in run_rules(facts)]

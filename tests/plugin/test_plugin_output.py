"""The marker's help line is exact (what a failing test shows is checked in test_plugin_shared.py, from one shared
pytest run)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_marker_help_is_exact(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--markers", timeout=300)
    line = next(ln for ln in result.stdout.lines if ln.startswith("@pytest.mark.simulate("))
    assert line.startswith("@pytest.mark.simulate(device, dtype=None, profile=None, count=None, data='cpu'): ")
    assert "device='cuda:1'" in line and "'cuda: 1'" not in line

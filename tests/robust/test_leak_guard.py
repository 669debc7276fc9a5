"""The suite's state guard (``tests/conftest.py``, ``support.state.guard``): a test that leaves process-wide state
changed fails at teardown, naming what it changed, and the next test runs on the state as it was."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["pytester"]

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where support/ lives

CONFTEST = f"""
import sys
sys.path.insert(0, {TESTS!r})
import pytest
from support import state

@pytest.fixture(autouse=True)
def _test_guard():
    yield from state.guard("this test")

@pytest.fixture(autouse=True, scope="module")
def _module_guard():
    yield from state.guard("this module (its module-scoped fixtures)")
"""

SUITE = """
import logging, logging.config, os
import pytest, torch

def test_dictconfig_disables_every_logger():
    logging.getLogger("diffusers.models.modeling_utils")
    logging.config.dictConfig({"version": 1})

def test_after_it_the_logger_is_enabled_again():
    assert not logging.getLogger("diffusers.models.modeling_utils").disabled

def test_env_and_dtype():
    os.environ["TD_LEAK_CHECK"] = "1"
    torch.set_default_dtype(torch.float64)

def test_after_it_env_and_dtype_are_back():
    assert "TD_LEAK_CHECK" not in os.environ and torch.get_default_dtype() == torch.float32

def test_patched_cuda():
    torch.cuda.is_available = lambda: True

def test_monkeypatch_restores(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TD_LEAK_CHECK", "1")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.NOTSET)
    assert not torch.cuda.is_available.__module__.startswith("torch")

@pytest.fixture(scope="module")
def quiet():
    logging.disable(logging.WARNING)
    yield

def test_module_fixture(quiet):
    pass
"""


def test_a_leaking_test_fails_at_teardown_and_the_next_one_runs_on_clean_state(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_leaks=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-q", "-rE",
                                           timeout=600)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 7 and outcomes.get("errors") == 4, result.stdout.str()[-3000:]
    said = _teardown_errors(result.stdout.lines)
    assert set(said) == {"test_dictconfig_disables_every_logger", "test_env_and_dtype", "test_patched_cuda",
                         "test_module_fixture"}, said
    assert "logger 'diffusers.models.modeling_utils' disabled: False -> True" in said[
        "test_dictconfig_disables_every_logger"]
    assert "torch default dtype: torch.float32 -> torch.float64" in said["test_env_and_dtype"]
    assert "environment TD_LEAK_CHECK: None -> '1'" in said["test_env_and_dtype"]
    assert "torch.cuda.is_available: <function is_available" in said["test_patched_cuda"]
    assert said["test_module_fixture"].startswith("this module (its module-scoped fixtures) left")
    assert "logging.disable: 0 -> 30" in said["test_module_fixture"]


def _teardown_errors(lines: list[str]) -> dict[str, str]:
    """The message of each "ERROR at teardown of <test>" section of pytest's output."""
    said, name = {}, None
    for line in lines:
        if " ERROR at teardown of " in line:
            name = line.split(" ERROR at teardown of ")[1].strip(" _")
        elif name is not None:
            said[name], name = line, None
    return said

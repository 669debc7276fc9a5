"""Shared test setup: offline Hugging Face libraries. ``tests/`` is on ``sys.path`` through pytest's ``pythonpath``
setting (pyproject.toml), so tests import the zoo and helpers as ``from support import zoo, helpers``."""

import os
from collections.abc import Iterator

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "DIFFUSERS_OFFLINE",
             "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# bitsandbytes takes a CPU branch at import and per layer (tests/support/hardware.py): pinned here before anything
# imports it, so the suite runs the same on every CPU; tests that depend on the branch ask for ``bnb_cpu_branch``
# and run both. ``TD_TEST_BNB_AVX512BF16=1`` runs the whole suite on the AVX512-BF16 import branch (``host``: the
# CPU's own answer).
import pytest  # noqa: E402

from support import hardware, state  # noqa: E402

hardware.pin_from_env()
# Every child Python the suite starts (CLI runs, torchrun ranks, scripts) takes the same branch: the pin travels
# through PYTHONPATH's sitecustomize. A test that wants the other branch in a child passes hardware.child_env().
_answer = hardware.forced_answer(os.environ.get(hardware.ENV))
if _answer is not None:  # "host": children ask the CPU too
    os.environ.update(hardware.child_env("avx512bf16" if _answer else "portable"))
collect_ignore = ["support/site"]  # a sitecustomize for child processes, not a test module


@pytest.fixture(params=hardware.BRANCHES)
def bnb_cpu_branch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Both branches of bitsandbytes' per-layer CPU check, on every machine (``support.hardware.Branch``)."""
    yield from hardware.branch_fixture(request, monkeypatch)


@pytest.fixture(autouse=True)
def _leaves_state_as_found() -> Iterator[None]:
    """Fails a test that leaves shared state changed (``support.state``): loggers, torch settings, environment,
    patched torch attributes, library modules. Such a leak makes a later test's outcome depend on the order."""
    yield from state.guard("this test", full=False)


@pytest.fixture(autouse=True, scope="module")
def _module_leaves_state_as_found() -> Iterator[None]:
    """The same for a module's own module-scoped fixtures, read when the module's last test is done, and for what
    is read per module only (the libraries' cached answers, fakes left in sys.modules)."""
    yield from state.guard("this module (its module-scoped fixtures)")

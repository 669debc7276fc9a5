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

# Under pytest-xdist (``-n N``, the Makefile's run) the workers share the cores: each computes on one thread, and so
# do the processes it starts (CLI runs, scripts), else N workers each spinning up a thread per core oversubscribe
# the machine. A worker also starts with COLUMNS=80 and LINES=24 in its environment, which a one-process run from a
# pipe (CI) never has: every CLI child would wrap its report at 80 columns. Both are taken out. Set before any test
# runs: the state guard reads it as the worker's own setting.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for _var in ("COLUMNS", "LINES"):
        os.environ.pop(_var, None)
    import torch  # noqa: E402

    torch.set_num_threads(1)


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


_SHARED_SCOPES = ("module", "class", "package")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``-n 2 --dist loadgroup`` (the Makefile's run) a module whose tests share a module-scoped fixture (a
    launch, a built model, a browser) runs in one worker, so the fixture is built once; other tests are spread one
    by one. An explicit ``xdist_group`` mark wins (tests/distributed: two modules share one launch)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.items() if info is not None else ()
        if any(name != "_module_leaves_state_as_found" and d and d[-1].scope in _SHARED_SCOPES for name, d in defs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))

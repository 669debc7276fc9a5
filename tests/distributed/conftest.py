"""One 2-rank launch shared by ``test_check.py`` (its ``small`` scenarios) and ``test_cli.py`` (its command lines
on the portable bitsandbytes branch): a launch costs seconds, most of it starting the ranks. Both modules are in
one xdist group, so a parallel run (``-n 2``) launches it once too."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed.launch import WORKERS, assert_launched, torchrun


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OUT: ``cli/rank<R>.json`` and ``cli/rank<R>.branch`` (``workers/cli_runs.py``), then ``rank<R>.json`` (the
    ``small`` scenarios of ``workers/check_scenarios.py``), on the portable branch."""
    out = tmp_path_factory.mktemp("two-ranks")
    assert_launched(torchrun(2, str(WORKERS / "check_scenarios.py"), str(out), "cli+small", branch="portable"))
    return out

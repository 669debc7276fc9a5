"""The CLI's ``--color never|always`` sets ``NO_COLOR`` / ``FORCE_COLOR`` for the whole process, as a command
should (the libraries it calls and the programs it starts read them); a test that calls ``main()`` in-process gets
them put back as they were."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _colour_environment_put_back(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("NO_COLOR", "FORCE_COLOR"):
        old = os.environ.get(name)
        monkeypatch.setenv(name, old if old is not None else "")  # recorded: put back (or removed) after the test
        if old is None:
            monkeypatch.delenv(name)
    yield

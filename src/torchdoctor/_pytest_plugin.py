"""pytest plugin (registered through the ``pytest11`` entry point). Imports nothing heavy at collection."""

from __future__ import annotations

from typing import Any


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("torchdoctor", "device and dtype placement checks")
    group.addoption("--torchdoctor", action="store", default="off", choices=("off", "explain", "strict"),
                    help="wrap every test in torchdoctor.guard with this mode (default: off)")

"""A library's cached ``is_*_available`` answers (accelerate's ``is_xpu_available`` is an ``lru_cache``) are asked
again as a run starts and as it ends, so the program sees the run's device and, after it, the real machine; the
checks are listed once per module and listed again when the module gains or replaces one."""

from __future__ import annotations

import functools

import pytest

import torchdoctor


def test_a_cached_availability_check_follows_the_run_and_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    imports = pytest.importorskip("accelerate.utils.imports")
    assert not imports.is_xpu_available()  # this machine: no XPU (cached now)
    with torchdoctor.virtual_devices("xpu", raise_on_exit=False):
        assert imports.is_xpu_available()
    assert not imports.is_xpu_available()

    calls: list[int] = []

    @functools.lru_cache
    def is_fake_available() -> bool:  # a check added (or replaced) after the module was first listed
        calls.append(1)
        return True

    monkeypatch.setattr(imports, "is_xpu_available", is_fake_available)
    is_fake_available()
    with torchdoctor.virtual_devices("xpu", raise_on_exit=False):
        is_fake_available()
    assert len(calls) == 2  # its cache was cleared as the run started

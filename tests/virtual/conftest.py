"""Shared fixtures of the virtual-device tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def old_quant_state_to(monkeypatch: pytest.MonkeyPatch) -> None:
    from bitsandbytes.functional import QuantState

    real_to = QuantState.to

    def old_to(self: Any, device: Any) -> None:  # bitsandbytes < 0.45.3 did not move the code
        code = self.code
        real_to(self, device)
        self.code = code

    monkeypatch.setattr(QuantState, "to", old_to)

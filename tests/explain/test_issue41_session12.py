"""Issue 41 point 7, twelfth session's hunt (E2): MPS's float8 refusal in its short wording."""

from __future__ import annotations

import json

import pytest

from torchdoctor import explain

SHORT = "RuntimeError: MPS does not support float8_e4m3fn"


@pytest.mark.parametrize("text", [
    SHORT,
    "> " + SHORT,  # quoted in an issue
    "    " + SHORT + "\n",  # indented in a log
    json.dumps({"error": SHORT + "\n"}),  # inside a JSON record
    "\x1b[31m" + SHORT + "\x1b[0m",  # coloured
    "2025-05-28T10:00:01 - ERROR - " + SHORT,  # a logger's line
    "RuntimeError: MPS backend does not support Float8_e4m3fn dtype",
])
def test_mps_float8_short_wording_is_the_float8_answer(text: str) -> None:
    found = explain(text)
    assert found, text
    d = found[0]
    assert (d.signature, d.category) == ("unsupported.mps_fp8", "unsupported_dtype_on_device")
    assert "A float8_e4m3fn tensor" in d.what_happened
    assert "no float8 type on any macOS" in d.what_happened


def test_another_backend_without_float8_is_not_read_as_mps() -> None:
    found = explain("RuntimeError: this GPU does not support float8_e4m3fn")
    assert all(d.signature != "unsupported.mps_fp8" for d in found)

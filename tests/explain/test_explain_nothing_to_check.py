"""An empty text is "nothing to check" for explain as for scan: the API and the CLI say it alike (exit 2), and a
text with no known error stays "nothing found" (exit 0)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

import torchdoctor
from torchdoctor._explain.api import explain_stream


@pytest.mark.parametrize("text", ["", "   \n\t\n", b""])
def test_an_empty_text_is_nothing_to_check(text: str | bytes) -> None:
    report = torchdoctor.explain(text)
    assert report.nothing_to_check and report.exit_code() == 2
    assert report.to_dict()["nothing_to_check"] is True
    assert "nothing to check: the text was empty" in str(report)


def test_a_text_without_a_known_error_is_nothing_found_not_nothing_to_check() -> None:
    report = torchdoctor.explain("all fine, 3 steps done")
    assert not report.nothing_to_check and report.exit_code() == 0
    assert str(report) == "torchdoctor explain: no known device/dtype error found"
    assert torchdoctor.explain("RuntimeError: Expected all tensors to be on the same device, but found at least two "
                               "devices, cuda:0 and cpu!").exit_code() == 1


def test_a_stream_that_holds_only_blanks_is_nothing_to_check() -> None:
    assert explain_stream(io.StringIO("\n\n  \n"), "log.txt").nothing_to_check
    assert not explain_stream(io.StringIO("\nstep 1\n"), "log.txt").nothing_to_check


@pytest.mark.parametrize("stdin, code, fragment", [("", 2, "nothing to check"),
                                                   ("step 1 ok\n", 0, "no known device/dtype error found")])
def test_the_cli_agrees_with_the_api(stdin: str, code: int, fragment: str) -> None:
    out = subprocess.run([sys.executable, "-m", "torchdoctor", "explain", "-"], input=stdin, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == code, out.stderr
    assert fragment in out.stdout
    js = subprocess.run([sys.executable, "-m", "torchdoctor", "explain", "--json", "-"], input=stdin,
                        capture_output=True, text=True, timeout=120)
    assert js.returncode == code and json.loads(js.stdout)["nothing_to_check"] is (code == 2)

"""``torchdoctor run`` never sums up a program that raised as "no placement error": the error is said with the
program's line and its side — the program's own or the virtual devices' limit ("could not check"). And the legacy ONNX exporter of a CPU model runs to its end under a virtual device (it
places nothing: the run steps aside), where it died before (``basic_string: construction from null is not valid``)."""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
from pathlib import Path

import pytest

from torchdoctor._run.program import run


def _run(tmp_path: Path, source: str, device: str | None = None):  # type: ignore[no-untyped-def]
    (tmp_path / "app.py").write_text(textwrap.dedent(source))
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        return run(str(tmp_path / "app.py"), device=device)
    finally:
        os.chdir(cwd)
        sys.modules.pop("__mp_main__", None)


OWN = '''
    import torch
    weights = {"encoder": torch.ones(2)}
    head = weights["decoder"]
'''


@pytest.mark.parametrize("device", [None, "cuda"])
def test_a_program_that_raised_its_own_error_is_said_so_with_its_line(tmp_path: Path, device: str | None) -> None:
    report = _run(tmp_path, OWN, device)
    text = report.text()
    assert report.exit_code == 1 and "no placement error" not in text
    assert "the program raised KeyError: 'decoder' at app.py:4" in text
    assert "not a placement error torchdoctor recognised" in text and "could not check" not in text
    assert report.to_dict()["raised"]["virtual_limit"] is False


ONNX_CPU = '''
    import io, torch
    buf = io.BytesIO()
    torch.onnx.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),), buf, dynamo=False)
    print("exported", len(buf.getvalue()))
'''
ONNX_ON_DEVICE = '''
    import io, torch
    model = torch.nn.Linear(4, 4).to("cuda")
    buf = io.BytesIO()
    torch.onnx.export(model, (torch.randn(2, 4, device="cuda"),), buf, dynamo=False)
'''


def test_the_legacy_onnx_exporter_of_a_cpu_model_runs_as_plain_python_on_a_virtual_device(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With onnx installed it exports to its end; without, it stops where plain python stops (the exporter needs
    onnx to write the file), never inside the tracer on the run's tensors."""
    report = _run(tmp_path, ONNX_CPU, "cuda")
    if importlib.util.find_spec("onnx") is not None:
        assert report.exit_code == 0 and report.raised is None and report.ok
        assert "exported" in capsys.readouterr().out
        return
    raised = report.to_dict()["raised"]
    assert raised["kind"] == "OnnxExporterError" and raised["message"] == "Module onnx is not installed!"
    assert raised["virtual_limit"] is False and "basic_string" not in capsys.readouterr().err


def test_an_export_of_a_model_on_the_virtual_device_says_it_could_not_check(tmp_path: Path) -> None:
    """The exporter reads the weights' values in C++: a virtual run holds none. Said as the run's own limit."""
    report = _run(tmp_path, ONNX_ON_DEVICE, "cuda")
    text = report.text()
    assert report.exit_code == 1 and "no placement error" not in text
    assert "could not check: the virtual cuda:0 run could not carry the program past app.py:5" in text
    assert "torchdoctor's own limit, not the program's error" in text
    assert report.to_dict()["raised"]["virtual_limit"] is True

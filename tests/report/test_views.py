"""How results show themselves (issue 27, point 4): ``repr()`` one short line with counts, ``str()`` the report,
``to_html(path)`` returns the path (not the page a REPL would print), a rich notebook view for every result."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchdoctor
from support import zoo
from torchdoctor._env.report import env_report
from torchdoctor._report.views import ResultViews, one_line


@pytest.fixture(scope="module")
def pipe_report() -> torchdoctor.ScanReport:
    pipe = zoo.tiny_sd_pipeline(torch.bfloat16)
    pipe.unet.conv_in.weight.data = pipe.unet.conv_in.weight.data.float()
    return torchdoctor.scan(pipe, "cuda:0", torch.bfloat16)


def test_scan_repr_is_one_short_line_with_counts(pipe_report: torchdoctor.ScanReport) -> None:
    text = repr(pipe_report)
    assert len(text) < 300 and "\n" not in text
    assert text == (f"<ScanReport of 'StableDiffusionPipeline': {len(pipe_report.problems)} problems, "
                    f"{len(pipe_report.tensors)} tensors>")
    assert str(pipe_report) == pipe_report.text() and str(pipe_report).startswith(f"{len(pipe_report.problems)} problem")


def test_to_html_with_a_path_writes_and_returns_the_path(pipe_report: torchdoctor.ScanReport, tmp_path: Path) -> None:
    page = tmp_path / "map.html"
    assert pipe_report.to_html(page) == str(page)
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert pipe_report.to_html().startswith("<!DOCTYPE html>")  # no path: the page itself


def test_scan_notebook_views(pipe_report: torchdoctor.ScanReport) -> None:
    assert pipe_report._repr_html_().startswith('<div class="tdmap"')
    md = pipe_report._repr_markdown_()
    assert md.startswith("```text\n") and str(pipe_report) in md


def test_env_report_views() -> None:
    facts = {"python": "3.11.7", "platform": "Linux", "torch": {"version": "2.13.0+cpu", "cuda": None}}
    report = env_report(facts=facts)
    text = repr(report)
    assert len(text) < 300 and text.startswith("<EnvReport of 'saved facts': ") and "findings" in text
    html = report._repr_html_()
    assert html.startswith('<pre class="torchdoctor"') and "torch" in html and "{'" not in html


def test_repr_never_raises_and_is_bounded() -> None:
    class Odd(ResultViews):
        @property
        def problems(self) -> list[int]:
            raise RuntimeError("broken property")

        source = "x" * 10_000

    text = repr(Odd())
    assert len(text) <= 240 and text.startswith("<Odd of 'xxx")
    assert one_line(Odd(), extra="y" * 1000).endswith("...>")

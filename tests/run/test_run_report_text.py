"""``RunReport.text``: each problem's "recorded at" line said once, a group's taken from its first member only when
the group itself has none."""

from __future__ import annotations

from torchdoctor._report.model import Problem
from torchdoctor._run.runreport import RunReport


def _group(path: str) -> Problem:
    return Problem("device", path, "parameter", "cpu", "cuda:0", "2 tensors of the model are on cpu",
                   tensors=("0.weight", "0.bias"))


def test_a_group_recorded_at_its_own_line_says_it_once() -> None:
    report = RunReport(["app.py"], 0, problems=[_group("0.weight")], device="cuda:0",
                       where={("device", "0.weight"): "app.py:15 in <module>"})
    assert report.text().count("recorded at app.py:15") == 1


def test_a_group_without_a_line_of_its_own_says_its_first_members() -> None:
    report = RunReport(["app.py"], 0, problems=[_group("model")], device="cuda:0",
                       where={("device", "0.weight"): "app.py:9 in main"})
    assert report.text().count("recorded at app.py:9 in main") == 1

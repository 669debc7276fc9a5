"""An op the device has no kernel for (``missing_kernel``, MPS's ``aten::_int_mm``) is a problem the user acts on:
exit 1 as a placement problem (never the "could not check" 2), ordered with the dtype problems, coloured as one."""

from __future__ import annotations

import re

from torchdoctor._report.model import KINDS
from torchdoctor._report.terminal import _STYLES
from torchdoctor._report.text import ProblemGroup, by_urgency, exit_code


def test_missing_kernel_is_a_problem_not_a_cannot_check() -> None:
    assert "missing_kernel" in KINDS
    assert exit_code([{"kind": "missing_kernel"}]) == 1
    assert exit_code([{"kind": "missing_kernel"}, {"kind": "unsupported"}]) == 2  # a "could not check" still wins


def test_missing_kernel_comes_before_what_could_not_be_checked_and_is_coloured() -> None:
    groups = [ProblemGroup("unsupported", None, ({"kind": "unsupported", "path": "a"},)),
              ProblemGroup("missing_kernel", None, ({"kind": "missing_kernel", "path": "b"},)),
              ProblemGroup("truncated", None, ({"kind": "truncated", "path": "c"},))]
    assert [g.kind for g in by_urgency(groups)] == ["missing_kernel", "unsupported", "truncated"]
    line = "  missing_kernel quant  aten::_int_mm has no mps kernel"
    assert any(re.search(pattern, line) for pattern, _ in _STYLES)

"""``torchdoctor._walk`` loads its names on first use: a program's start under ``run`` imports ``_trace``, which
reads only ``_walk.kinds``, and must not pay for the walker and the report types (issue 43 point 4)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_trace_at_start_loads_no_walker_and_the_names_still_resolve() -> None:
    code = ("import sys, torchdoctor._trace.api\n"
            "print(sorted(m for m in ('torchdoctor._walk.walker', 'torchdoctor._walk.entry', 'torchdoctor._report.model')"
            " if m in sys.modules))\n"
            "import torchdoctor._walk as w\n"
            "from torchdoctor._walk import Entry, walk\n"
            "print(w.MAX_DEPTH, w._is_quant_type is w.is_quant_type, Entry.__name__, walk.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.splitlines() == ["[]", "64 True Entry torchdoctor._walk.walker"], out.stderr[-2000:]


def test_an_unknown_name_is_an_attribute_error() -> None:
    import torchdoctor._walk as w

    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        w.nope  # noqa: B018

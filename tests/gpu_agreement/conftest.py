"""The agreement script lives in bench/ (it must run from a bare checkout on the GPU machine) and its modules import
each other by their own names. They are imported here once with bench/ on ``sys.path``, which is then put back:
bench/ also holds ``guard.py``, ``move.py`` and ``scan.py``, which would shadow the suite's own test folders of
those names (``from guard.test_evidence import ...``) for every test collected after this one."""

from __future__ import annotations

import importlib
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
_saved = list(sys.path)
sys.path.insert(0, str(BENCH))
try:
    for _name in ("gpu_agreement_cases", "gpu_agreement_models", "gpu_agreement_tools", "gpu_agreement_table",
                  "gpu_agreement"):
        importlib.import_module(_name)
finally:
    sys.path[:] = _saved

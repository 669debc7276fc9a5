"""The agreement script lives in bench/ (it must run from a bare checkout on the GPU machine): its folder is put on
``sys.path`` once here, as the script itself does, so the tests import its modules by their own names."""

from __future__ import annotations

import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

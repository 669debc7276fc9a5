"""Loaded by a child Python process whose PYTHONPATH starts with this folder (``support.hardware.child_env``): pins
bitsandbytes' CPU branch from ``TD_TEST_BNB_AVX512BF16`` before anything imports it, as ``tests/conftest.py`` does
in the test process."""

import os
import sys

_TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _TESTS not in sys.path:
    sys.path.append(_TESTS)  # appended: the child's own imports come first

from support import hardware  # noqa: E402  (sys.path first)

hardware.pin_from_env()

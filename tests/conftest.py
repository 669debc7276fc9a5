"""Shared test setup: offline Hugging Face libraries. ``tests/`` is on ``sys.path`` through pytest's ``pythonpath``
setting (pyproject.toml), so tests import the zoo and helpers as ``from support import zoo, helpers``."""

import os

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "DIFFUSERS_OFFLINE",
             "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

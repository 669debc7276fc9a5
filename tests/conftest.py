"""Shared test setup: offline Hugging Face libraries, and ``tests/`` importable (``import zoo``, ``import helpers``)."""

import os
import sys

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "DIFFUSERS_OFFLINE",
             "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# --import-mode=importlib does not put test directories on sys.path
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

"""A user's app file for a CLI TARGET test: written into the test's folder, which becomes the working directory
and the first entry of ``sys.path`` (as ``torchdoctor scan app.py:model`` run from that folder would have it)."""

from __future__ import annotations

from pathlib import Path

import pytest


def app_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> Path:
    (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path

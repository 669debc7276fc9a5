"""A fix's diff outside any git work tree names the file relative to the current directory (the app's root, where the
user ran torchdoctor and runs ``git apply``), so the patch applies there as printed."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

from torchdoctor._report.diff import line_patch, repo_path


def test_outside_a_repo_the_path_is_relative_to_the_current_directory(tmp_path: pathlib.Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    app = tmp_path / "app"
    target = app / "custom_nodes" / "masknodes" / "__init__.py"
    target.parent.mkdir(parents=True)
    target.write_text("import torch\nmask = torch.zeros(4)\n")
    if any((p / ".git").exists() for p in target.parents):
        pytest.skip("the temporary folder lies inside a git work tree")
    monkeypatch.chdir(app)
    assert repo_path(str(target)) == "custom_nodes/masknodes/__init__.py"
    diff = line_patch(str(target), 2, "mask = torch.zeros(4, device='cuda')")
    assert diff is not None and diff.startswith("--- a/custom_nodes/masknodes/__init__.py\n")
    (app / "fix.patch").write_text(diff)
    done = subprocess.run(["git", "apply", "fix.patch"], cwd=app, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert target.read_text() == "import torch\nmask = torch.zeros(4, device='cuda')\n"
    monkeypatch.chdir(tmp_path / "app" / "custom_nodes")  # a file outside the current directory: its bare name
    assert repo_path(str(app / "other.py")) == "other.py"

"""``_report.diff.line_patch``: the diff guard prints for a line of the user's file applies with the real ``git apply``
and ``patch -p1``, and is None where no honest diff can be written."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from torchdoctor._report.diff import line_patch, repo_path

SOURCE = (
    "import torch\n"
    "\n"
    "\n"
    "class Dequant(torch.nn.Module):\n"
    "    compute_dtype = torch.bfloat16\n"
    "\n"
    "    def forward(self, x):\n"
    "        return x * self.scale\n"
)


def _git(repo: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture()
def repo(tmp_path: pathlib.Path) -> pathlib.Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    assert _git(root, "init", "-q").returncode == 0
    (root / "pkg" / "layers.py").write_text(SOURCE)
    return root


def test_diff_names_the_file_from_the_repo_root_and_keeps_indentation(repo: pathlib.Path) -> None:
    diff = line_patch(str(repo / "pkg" / "layers.py"), 5, "compute_dtype = torch.float16")
    assert diff is not None
    assert diff.startswith("--- a/pkg/layers.py\n+++ b/pkg/layers.py\n@@ -2,7 +2,7 @@\n")
    assert "-    compute_dtype = torch.bfloat16\n+    compute_dtype = torch.float16\n" in diff


def test_git_apply_and_patch_take_the_diff(repo: pathlib.Path) -> None:
    target = repo / "pkg" / "layers.py"
    diff = line_patch(str(target), 5, "compute_dtype = torch.float16")
    assert diff is not None
    (repo / "fix.patch").write_text(diff)
    check = _git(repo, "apply", "--check", "fix.patch")
    assert check.returncode == 0, check.stderr
    assert target.read_text() == SOURCE  # reading is all line_patch does
    if shutil.which("patch") is None:
        pytest.skip("patch is not installed")
    done = subprocess.run(["patch", "-p1", "-i", "fix.patch"], cwd=repo, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert target.read_text() == SOURCE.replace("torch.bfloat16", "torch.float16")


def test_given_indentation_is_kept_and_several_lines_replace_one(repo: pathlib.Path) -> None:
    target = repo / "pkg" / "layers.py"
    diff = line_patch(str(target), 8, "x = x.to(self.scale.dtype)\nreturn x * self.scale")
    assert diff is not None
    assert "@@ -5,4 +5,5 @@" in diff
    assert "+        x = x.to(self.scale.dtype)\n+        return x * self.scale\n" in diff
    (repo / "fix.patch").write_text(diff)
    assert _git(repo, "apply", "fix.patch").returncode == 0
    assert target.read_text().endswith("        x = x.to(self.scale.dtype)\n        return x * self.scale\n")
    own = line_patch(str(target), 5, "  compute_dtype = None")
    assert own is not None and "+  compute_dtype = None\n" in own


def test_a_last_line_without_newline_and_crlf_files_apply(repo: pathlib.Path) -> None:
    target = repo / "pkg" / "layers.py"
    target.write_text(SOURCE.rstrip("\n"))
    diff = line_patch(str(target), 8, "return x * self.scale.to(x.dtype)")
    assert diff is not None and diff.endswith("\\ No newline at end of file\n")
    (repo / "fix.patch").write_text(diff)
    assert _git(repo, "apply", "fix.patch").returncode == 0, diff
    assert target.read_text().endswith("self.scale.to(x.dtype)")
    target.write_bytes(SOURCE.replace("\n", "\r\n").encode())
    diff = line_patch(str(target), 5, "compute_dtype = torch.float16")
    assert diff is not None and "+    compute_dtype = torch.float16\r\n" in diff
    (repo / "fix.patch").write_bytes(diff.encode())
    done = _git(repo, "apply", "fix.patch")
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == SOURCE.replace("torch.bfloat16", "torch.float16").replace("\n", "\r\n").encode()


def test_outside_a_repo_the_bare_name_is_used(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "loose" / "train.py"
    path.parent.mkdir()
    path.write_text("x = 1\n")
    if any((p / ".git").exists() for p in path.parents):
        pytest.skip("the temporary folder lies inside a git work tree")
    assert repo_path(str(path)) == "train.py"
    assert line_patch(str(path), 1, "x = 2") == "--- a/train.py\n+++ b/train.py\n@@ -1,1 +1,1 @@\n-x = 1\n+x = 2\n"


def test_none_where_no_honest_diff_exists(repo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    target = repo / "pkg" / "layers.py"
    assert line_patch(str(target), 0, "x") is None
    assert line_patch(str(target), 9, "x") is None
    assert line_patch(str(target), 5, "compute_dtype = torch.bfloat16") is None  # a no-op
    assert line_patch(str(tmp_path / "missing.py"), 1, "x") is None
    assert line_patch(str(repo), 1, "x") is None  # a folder
    blob = tmp_path / "weights.bin"
    blob.write_bytes(b"\x00\x01abc\n")
    assert line_patch(str(blob), 1, "x") is None
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"name = '\xe9'\n")
    assert line_patch(str(latin), 1, "x") is None

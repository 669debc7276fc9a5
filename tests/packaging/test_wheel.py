"""The wheel the repository builds (issue 27, point 1): built from a clean export of the tree (``git archive``, as
a fresh clone has it) with ``python -m build`` when installed, else ``pip wheel --no-deps --no-build-isolation``
(offline, no new packages); its metadata checked; installed with ``pip --target`` (no dependencies: the test
venv's torch serves) and run from there: ``--version``, ``demo`` with torch alone, one scan of a file TARGET and
one of a checkpoint. ``.ci/wheel-check.sh`` does the same in a fresh venv with torch installed first."""

from __future__ import annotations

import email.parser
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import torchdoctor

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PIP_NO_INDEX": "1"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout (the wheel is built from `git archive HEAD`)")
    work = tmp_path_factory.mktemp("build")
    tree = work / "src-tree"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"], capture_output=True,
                             check=True, timeout=120).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tf:
        tf.extractall(tree, filter="data")
    dist = work / "dist"
    try:
        import build  # noqa: F401

        cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(tree)]
    except ImportError:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(tree)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    wheels = sorted(dist.glob("torchdoctor-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_metadata(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(info).decode())
        entry_points = zf.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert meta["Name"] == "torchdoctor" and meta["Version"] == torchdoctor.__version__
    assert meta["Requires-Python"] == ">=3.10"
    requires = meta.get_all("Requires-Dist") or []
    assert "torch>=2.4" in requires and not [r for r in requires if "extra ==" not in r and r != "torch>=2.4"]
    assert {"rich", "test"} <= set(meta.get_all("Provides-Extra") or [])
    assert meta["Description-Content-Type"] == "text/markdown" and "torchdoctor" in meta.get_payload()
    assert "torchdoctor = torchdoctor._cli.main:main" in entry_points
    assert "[pytest11]" in entry_points and "torchdoctor = torchdoctor._pytest_plugin" in entry_points
    assert "torchdoctor/py.typed" in names and "torchdoctor/__main__.py" in names
    # every subpackage of the tree is in the wheel, and nothing that is not the package
    packages = {str(p.parent.relative_to(ROOT / "src")) for p in (ROOT / "src" / "torchdoctor").rglob("__init__.py")
                if not any(part.startswith(".") for part in p.parts)}
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "src/torchdoctor"], capture_output=True, text=True,
                             check=True).stdout.split()
    packages = {p for p in packages if f"src/{p}/__init__.py" in tracked}
    assert {f"{p}/__init__.py" for p in packages} <= set(names)
    assert not [n for n in names if n.startswith(("tests/", "bench/", "docs/")) or "__pycache__" in n]


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target),
                          str(wheel)], capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return target


def _run(installed: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``torchdoctor ARGV`` from the installed wheel (first on sys.path), never from the source tree."""
    boot = (f"import sys; sys.path.insert(0, {str(installed)!r}); import torchdoctor; "
            f"assert torchdoctor.__file__.startswith({str(installed)!r}), torchdoctor.__file__; "
            "from torchdoctor._cli.main import main; sys.argv[0] = 'torchdoctor'; sys.exit(main())")
    return subprocess.run([sys.executable, "-c", boot, *argv], capture_output=True, text=True, cwd=cwd, env=ENV,
                          timeout=600)


def test_installed_wheel_runs(installed: Path, tmp_path: Path) -> None:
    out = _run(installed, tmp_path, "--version")
    assert out.returncode == 0 and out.stdout.startswith(f"torchdoctor {torchdoctor.__version__} (torch ")

    app = tmp_path / "app.py"
    app.write_text("import torch\nfrom torch import nn\n\ndef model():\n    m = nn.Sequential(nn.Linear(2, 2))\n"
                   "    m[0].bias.data = m[0].bias.data.double()\n    return m\n")
    out = _run(installed, tmp_path, "scan", "app.py:model", "--json")
    assert out.returncode == 1, out.stderr
    assert [p["path"] for p in json.loads(out.stdout)["problems"]] == ["0.bias"]

    import torch

    torch.save({"w": torch.ones(2, dtype=torch.bfloat16)}, tmp_path / "ckpt.pt")
    out = _run(installed, tmp_path, "scan", "ckpt.pt", "--dtype", "bfloat16")
    assert out.returncode == 0, out.stdout + out.stderr


def test_installed_wheel_demo_with_torch_alone(installed: Path, tmp_path: Path) -> None:
    out = _run(installed, tmp_path, "demo", "--plain", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["ok"] is True and doc["model"] == "torch" and doc["culprit"] == "attn.to_q.lora_B.default.weight"

"""The one install route (issue 42, point 1): the README's two lines, read from the README and run as written in a
fresh export of the tree (``git archive HEAD``, what a clone holds), pin the torch that is installed and install
torchdoctor alone: pip's own report of what it would install names torchdoctor and nothing else, offline. Every
other page (docs/, the integrations' docstrings) says the same route, never ``pip install torchdoctor`` (it is not
on PyPI), ``python -m build`` (``build`` is never installed) or the test stack's ``constraints.txt``."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from support.doc_examples import blocks, bash_commands

ROOT = Path(__file__).resolve().parents[2]
PIN_LINE = "python -c \"import torch; print('torch==' + torch.__version__)\" > torch-pin.txt"
INSTALL_LINE = "python -m pip install -c torch-pin.txt ."


def _route() -> list[str]:
    found = [b for b in blocks("README.md") if b.lang == "bash" and "torch-pin.txt" in b.text]
    assert len(found) == 1, "the README holds the install route once"
    return [c.split(" #")[0].strip() for c, _ in bash_commands(found[0])]


def test_the_readme_holds_the_route_once_as_two_lines() -> None:
    assert _route() == [PIN_LINE, INSTALL_LINE]


def test_the_route_as_written_installs_torchdoctor_and_keeps_the_torch_there_is(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout (the clone is `git archive HEAD`)")
    tree = tmp_path / "torchdoctor"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"], capture_output=True,
                             check=True, timeout=120).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tf:
        tf.extractall(tree, filter="data")
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
           "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pin, install = _route()
    out = subprocess.run(["bash", "-c", pin], cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tree / "torch-pin.txt").read_text().strip() == f"torch=={torch.__version__}"
    # the second line as written, told only not to change anything (a dry run, offline, reporting what it would do)
    report = tmp_path / "report.json"
    out = subprocess.run(["bash", "-c", f"{install} --dry-run --no-build-isolation --report {report}"], cwd=tree,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    wanted = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert wanted == ["torchdoctor"], wanted  # torch is not touched: the pin is the torch installed


def _pages() -> dict[str, str]:
    pages = {"README.md": (ROOT / "README.md").read_text(encoding="utf-8")}
    pages.update({f"docs/{p.name}": p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))})
    pages.update({str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
                  for p in sorted((ROOT / "integrations").rglob("*")) if p.suffix in (".py", ".md", ".txt")})
    return pages


def test_every_page_says_the_same_route() -> None:
    pages = _pages()
    assert len(pages) > 10 and any(k.startswith("integrations/") for k in pages)
    readme_dev = pages["README.md"].split("## Development", 1)
    assert len(readme_dev) == 2
    pages["README.md"] = readme_dev[0]  # the contributors' section installs the test stack under constraints.txt
    wrong = []
    for name, text in pages.items():
        flat = re.sub(r"\s+", " ", text)
        for bad in ("pip install torchdoctor", "python -m build", "-c constraints.txt", "git clone <"):
            if bad in flat:
                wrong.append(f"{name}: {bad!r}")
        for m in re.finditer(r"pip install -c (\S+)", flat):
            if m.group(1) != "torch-pin.txt":
                wrong.append(f"{name}: pip install -c {m.group(1)}")
    assert not wrong, wrong
    # the app pages show the README's own two lines (the app's interpreter in place of `python`)
    for name in ("integrations/comfyui/torchdoctor_nodes/__init__.py",
                 "integrations/sdnext/torchdoctor-check/scripts/torchdoctor_check.py"):
        assert PIN_LINE in pages[name] and "python -m pip install -c torch-pin.txt /path/to/torchdoctor" in pages[name]

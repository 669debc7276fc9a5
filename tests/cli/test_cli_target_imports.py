"""A TARGET's file may import its siblings where its code runs, as under ``python app.py``: at the top, inside its
factory (``def target(): from models import build``), and inside a forward that imports lazily. In-process the
folder is importable only while the TARGET is loaded (sys.path is left as it was); in the CLI's child, whose
whole process is the user's run, it stays for the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor._cli.main import main

SIBLING = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.id_embeds = torch.randn(1, 8)  # a plain attribute: Module.to leaves it behind

    def forward(self, x):
        from {helper} import shift  # imported lazily, inside the forward
        return self.b(shift(self.a(x + self.id_embeds)))

def build():
    return Net(), (torch.randn(2, 8),)
"""

HELPER = """
def shift(x):
    return x + 1
"""

APP = """
import torchdoctor

def target():
    from {sibling} import build  # imported inside the factory, not at the top
    model, args = build()
    return torchdoctor.Target(model, args)

def half():
    from {sibling} import build
    model, _ = build()
    model.b.half()
    return model
"""


def _project(tmp_path: Path, tag: str) -> tuple[Path, str, str]:
    sibling, helper = f"h6_sibling_{tag}", f"h6_helper_{tag}"
    (tmp_path / f"{sibling}.py").write_text(SIBLING.format(helper=helper), encoding="utf-8")
    (tmp_path / f"{helper}.py").write_text(HELPER, encoding="utf-8")
    app = tmp_path / "app.py"
    app.write_text(APP.format(sibling=sibling), encoding="utf-8")
    return app, sibling, helper


def test_a_factory_that_imports_a_sibling_loads_in_process_and_leaves_sys_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    app, sibling, helper = _project(tmp_path, "inproc")
    path_before = list(sys.path)
    try:
        assert main(["scan", f"{app}:half", "--json"]) == 1  # before: "calling ... failed: ModuleNotFoundError"
        doc = json.loads(capsys.readouterr().out)
        assert {p["path"] for p in doc["problems"]} == {"b.weight", "b.bias"}
        assert sys.path == path_before
    finally:
        for name in (sibling, helper, "_torchdoctor_target_app"):
            sys.modules.pop(name, None)


def test_the_cli_child_imports_siblings_in_the_factory_and_in_the_forward(tmp_path: Path) -> None:
    app, _, _ = _project(tmp_path, "child")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "simulate", f"{app}:target", "--device", "cuda:0",
                           "--json", "-q"], cwd=tmp_path.parent, env=env, capture_output=True, text=True, timeout=300)
    assert "ModuleNotFoundError" not in proc.stdout + proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr
    assert [(p["path"], p["kind"]) for p in doc["problems"]] == [("id_embeds", "device")]
    assert doc["forward"] is True

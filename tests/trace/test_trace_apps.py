"""trace in an app's tree: a move made by the app's own helper package for a plugin (ComfyUI's ``comfy.utils``
helper called by a custom node) is credited to the plugin's line, not to the helper. The tree is re-created in a
few lines: ``comfy/utils.py`` (the helper), ``custom_nodes/pack/node.py`` (the plugin), ``main.py``."""

from __future__ import annotations

import json
from pathlib import Path

from torchdoctor._cli.main import main

HELPER = """\
def cast_module(module, dtype):
    return module.to(dtype)  # the helper's line: every node's cast goes through it
"""

NODE = """\
import torch
from comfy.utils import cast_module


def apply(model):
    cast_module(model[0], torch.float16)  # the plugin's line
"""

MAIN = """\
import sys
import torch
sys.path.insert(0, "custom_nodes/pack")
import node

model = torch.nn.Sequential(torch.nn.Linear(2, 2))
node.apply(model)
"""


def _tree(root: Path) -> Path:
    (root / "comfy").mkdir()
    (root / "comfy" / "__init__.py").write_text("")
    (root / "comfy" / "utils.py").write_text(HELPER)
    (root / "custom_nodes" / "pack").mkdir(parents=True)
    (root / "custom_nodes" / "pack" / "node.py").write_text(NODE)
    (root / "main.py").write_text(MAIN)
    return root / "main.py"


def test_a_move_by_the_apps_helper_is_credited_to_the_plugin_that_called_it(tmp_path: Path, monkeypatch) -> None:
    script = _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "moves.jsonl"
    assert main(["trace", "--file", str(out), str(script)]) == 0
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    bias = [d for d in docs if d["path"] == "bias"]
    assert bias, docs
    assert bias[-1]["file"].endswith("node.py") and bias[-1]["line"] == 6, bias[-1]

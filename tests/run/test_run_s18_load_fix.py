"""A checkpoint saved on a GPU index the machine lacks (``cuda:3``), loaded without ``map_location``
(DESOBAv2 #18): run aims the fix at the program's own ``torch.load`` line, ``map_location="cpu"``, with a patch that
applied lets the program run clean; a ``map_location`` already on the line has its value replaced."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.serialization as ser

from support.apps import run_json
from torchdoctor._run.loadfix import _mapped

APP = '''import torch, torch.nn as nn
net = nn.Linear(4, 2).to("cuda")
ckpt = torch.load("ckpt.pt")
net.load_state_dict(ckpt["net"])
print(net(torch.randn(1, 4, device="cuda")).shape, ckpt["step"])
'''


def test_a_load_of_a_missing_gpu_index_is_fixed_at_the_load_line(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:  # a file as a machine with cuda:3 writes it
        m.setattr(ser, "location_tag", lambda storage: "cuda:3")
        torch.save({"net": {"weight": torch.ones(2, 4), "bias": torch.zeros(2)}, "step": 7}, tmp_path / "ckpt.pt")
    app = tmp_path / "app.py"
    app.write_text(APP)
    doc = run_json(app, "cuda")
    [f] = doc["findings"]
    assert f["category"] == "deserialize_device" and f["fix_from"] == "run"
    assert f["fix"].startswith('ckpt = torch.load("ckpt.pt", map_location="cpu")  # the file\'s storages name a '
                               "device this machine lacks")
    # the patched load re-run on the file by the virtual run's own torch.load (a load changes nothing): proven
    assert '(proven: the same file loaded with map_location="cpu"' in f["fix"], f["fix"]
    assert '+ckpt = torch.load("ckpt.pt", map_location="cpu")' in doc["patch"]
    subprocess.run(["git", "apply", "-"], input=doc["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    again = run_json(app, "cuda")
    assert again["ok"] and again["exit_code"] == 0


def test_a_map_location_already_there_has_its_value_replaced() -> None:
    assert _mapped('    sd = torch.load(p, map_location="cuda:3")["model"]') == \
        '    sd = torch.load(p, map_location="cpu")["model"]'
    assert _mapped("x = torch.load(p, weights_only=True)") == 'x = torch.load(p, weights_only=True, map_location="cpu")'
    assert _mapped("x = torch.load(*a)") is None and _mapped("x = load(p)") is None



def test_a_plain_run_proves_the_fix_by_loading_the_file_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On this machine's own devices (no --device): torch refuses the cuda storages itself, and run's own re-load of
    the file with the fix proves it; a file given as an open file object is not read a second time."""
    with monkeypatch.context() as m:
        m.setattr(ser, "location_tag", lambda storage: "cuda:3")
        torch.save({"net": {"weight": torch.ones(2, 4), "bias": torch.zeros(2)}, "step": 7}, tmp_path / "ckpt.pt")
    plain = APP.replace('.to("cuda")', "").replace(', device="cuda"', "")
    for name, text, said in (("app.py", plain, "(proven: the patched load read the same file onto the cpu)"),
                             ("opened.py", plain.replace('torch.load("ckpt.pt")', 'torch.load(open("ckpt.pt", "rb"))'),
                              "(unproven: the patched load was not re-run (torch.load was given no file path))")):
        (tmp_path / name).write_text(text)
        proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--json", name], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        [f] = json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])["findings"]
        assert f["category"] == "deserialize_device" and f["fix"].endswith(said), f["fix"]


def test_a_load_from_an_open_file_is_proven_by_the_virtual_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(ser, "location_tag", lambda storage: "cuda:3")
        torch.save({"net": {"weight": torch.ones(2, 4), "bias": torch.zeros(2)}, "step": 7}, tmp_path / "ckpt.pt")
    app = tmp_path / "app.py"
    app.write_text(APP.replace('torch.load("ckpt.pt")', 'torch.load(open("ckpt.pt", "rb"))'))
    [f] = run_json(app, "cuda")["findings"]
    assert f["fix"].startswith('ckpt = torch.load(open("ckpt.pt", "rb"), map_location="cpu")')
    assert '(proven: the same file loaded with map_location="cpu"' in f["fix"], f["fix"]

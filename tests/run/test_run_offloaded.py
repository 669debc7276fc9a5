"""A weight accelerate's offload keeps on meta, read outside its module's forward (diffusers #10869: a parent's forward
reads a sequentially offloaded child's parameter with ``.item()``). The message alone ("Tensor.item() cannot be
called on meta tensors") reads like a model never loaded, and explain's catalogue answers ``to_empty`` +
``load_state_dict``; ``run`` reads the failing line's objects instead: the culprit is the offloaded parameter, the
module whose hook keeps it, and the fix reads it inside that module's call or takes the hook's own copy on that line.
Real accelerate hooks (``cpu_offload``, ``disk_offload``) on CPU, and a whole ``torchdoctor run --device cuda`` whose
printed patch, applied, runs clean.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

accelerate = pytest.importorskip("accelerate")

from torchdoctor._run.offloaded import offloaded_read  # noqa: E402


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(0.5))
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = Gate()
        self.out = nn.Linear(8, 2)


def test_an_offloaded_parameter_read_with_item_is_named_with_the_module_whose_hook_keeps_it() -> None:
    net = Net()
    accelerate.cpu_offload(net.gate, execution_device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="meta tensors") as info:
        a = net.gate.alpha.item()  # noqa: F841 - the read outside gate's forward
    culprit, fix, patch = offloaded_read(info.value) or ("", "", None)
    assert culprit.startswith("culprit `net.gate.alpha` f32[]@meta: offloaded by accelerate's hook on `net.gate` "
                              "(Gate), which keeps its weights in the hook's map and loads them only while "
                              "`net.gate(...)` runs; test_run_offloaded.py:")
    lines = fix.splitlines()
    assert lines[0].startswith("# `net.gate.alpha` has its values only while `net.gate(...)` runs: read it there "
                               "(in Gate.forward), or, on this line, the hook's own copy (f32[]@cpu)")
    # cpu_offload adds its own hook first, then the offloading one: the copy is in the second
    assert lines[1].startswith("a = net.gate._hf_hook.hooks[1].weights_map['alpha'].item()")
    assert lines[2].startswith("# ^ unproven (the line was not re-run)")
    assert "to_empty" not in fix.replace("not to_empty()", "")
    assert eval(lines[1].split("=", 1)[1].split("#")[0], {"net": net}) == 0.5  # the rewritten read gives the value
    assert patch is not None and "+        a = net.gate._hf_hook.hooks[1].weights_map['alpha'].item()" in patch


def test_a_disk_offloaded_bias_copied_off_meta_is_read_from_the_offload_folder(tmp_path: Path) -> None:
    net = Net()
    bias = net.out.bias.tolist()
    accelerate.disk_offload(net.out, str(tmp_path), execution_device=torch.device("cpu"))
    with pytest.raises(NotImplementedError, match="meta") as info:
        shift = net.out.bias.tolist()  # noqa: F841
    culprit, fix, _ = offloaded_read(info.value) or ("", "", None)
    assert culprit.startswith("culprit `net.out.bias` f32[2]@meta: offloaded by accelerate's hook on `net.out` "
                              "(Linear)")
    lines = fix.splitlines()
    assert "(in Linear.forward)" not in lines[0]  # torch's own class: the program cannot edit its forward
    assert lines[1].startswith("shift = net.out._hf_hook")  # a value read (.tolist()): no move to a device
    assert ".to(" not in lines[1]
    assert eval(lines[1].split("=", 1)[1].split("#")[0], {"net": net}) == pytest.approx(bias)  # read from disk


def test_a_meta_tensor_without_an_offload_hook_is_not_taken_for_one() -> None:
    lin = nn.Linear(2, 2, device="meta")  # built on meta, never loaded: explain's to_empty advice stands
    with pytest.raises(RuntimeError, match="meta tensors") as info:
        lin.weight[0, 0].item()
    assert offloaded_read(info.value) is None


APP = '''import torch, torch.nn as nn
from accelerate import cpu_offload
class Gate(nn.Module):
    def __init__(s):
        super().__init__(); s.alpha = nn.Parameter(torch.tensor(0.5)); s.lin = nn.Linear(8, 8)
    def forward(s, x): return s.lin(x)
class Net(nn.Module):
    def __init__(s):
        super().__init__(); s.gate = Gate(); s.out = nn.Linear(8, 2)
    def forward(s, x):
        a = s.gate.alpha.item()
        return s.out(s.gate(x) * a)
net = Net()
cpu_offload(net.gate, execution_device=torch.device("cuda"))
cpu_offload(net.out, execution_device=torch.device("cuda"))
print(net(torch.randn(2, 8, device="cuda")).shape)
'''


def _run(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "--json", "app.py"],
                          cwd=folder, capture_output=True, text=True, timeout=300)


def test_run_names_the_offloaded_parameter_and_its_patch_applied_runs_clean(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    proc = _run(tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    doc = json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])
    [finding] = doc["findings"]
    assert finding["error"] == "RuntimeError: Tensor.item() cannot be called on meta tensors"
    assert finding["fix_from"] == "run"
    assert finding["culprit"].startswith("culprit `s.gate.alpha` f32[]@meta: offloaded by accelerate's hook on "
                                         "`s.gate` (Gate)")
    assert "input 0" not in finding["culprit"] and "to_empty" not in finding["fix"].replace("not to_empty()", "")
    subprocess.run(["git", "init", "-q", "."], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=finding["diff"], text=True, check=True)
    assert "a = s.gate._hf_hook.hooks[1].weights_map['alpha'].item()" in (tmp_path / "app.py").read_text()
    again = _run(tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout[again.stdout.index('{\n  "schema"'):])["findings"] == []

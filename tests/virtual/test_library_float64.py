"""A library's own float64 on a device that cannot compute in it (intel/torch-xpu-ops #1742: torch's
``GradScaler.unscale_`` computes ``self._scale.double().reciprocal()`` on an Arc card, which has no float64 kernels;
peft's ``IncrementalPCA`` sums in float64 on the data's device, which MPS cannot hold): the problem names the
library's line and the program's line that reached it; the fix is what the program can change, never a cast before a
move (nothing moved) nor ``dtype=`` at a library's line. Written as said, the program runs clean. A float64 the
program makes itself stays the program's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

SCALER = '''import torch, torch.nn as nn
model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 3)).to("xpu")
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(device="xpu")
data, target = torch.randn(2, 3, 8, 8).to("xpu"), torch.randint(0, 3, (2,)).to("xpu")
with torch.autocast(device_type="xpu", dtype=torch.float16):
    loss = nn.functional.cross_entropy(model(data), target)
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
print(float(loss))
'''
BF16 = '''with torch.autocast(device_type="xpu", dtype=torch.bfloat16):
    loss = nn.functional.cross_entropy(model(data), target)
loss.backward()
optimizer.step()
'''
PCA = '''import torch
from peft.utils.incremental_pca import IncrementalPCA
x = torch.randn(16, 6).to("mps")
ipca = IncrementalPCA(n_components=2)
ipca.partial_fit(x)
print(ipca.components_.shape)
'''


def _run(app: Path, *args: str) -> Any:
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", *args, "--json", app.name], cwd=app.parent,
                          capture_output=True, text=True, timeout=300)
    return json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])


def test_gradscaler_float64_on_arc_names_torch_line_and_trains_without_a_scaler(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(SCALER)
    doc = _run(app, "--device", "xpu", "--profile", "arc")
    assert not doc["ok"]
    [p] = doc["problems"]
    assert "xpu cannot compute in float64" in p["message"]
    assert "torch/amp/grad_scaler.py:" in p["message"] and "in GradScaler.unscale_" in p["message"]
    assert "reached from app.py:9" in p["message"], p["message"]
    [fix] = doc["fixes"]
    code = fix["code"]
    assert "GradScaler.unscale_, torch's own code, reached from your line app.py:9 (`scaler.step(optimizer)`)" in code
    assert "torch.autocast(device_type='xpu', dtype=torch.bfloat16)" in code and "no loss scaling" in code
    assert "before mov" not in code and "cannot hold" not in code and "pass dtype=" not in code
    assert fix["proven"] is False and fix["tried"].startswith("not re-run: the change is to the program's training")
    # the fix as written: bfloat16 autocast, no scaler
    app.write_text(SCALER.replace(SCALER[SCALER.index("with torch.autocast"):SCALER.index("print(")], BF16))
    again = _run(app, "--device", "xpu", "--profile", "arc")
    assert again["ok"] and not again["fixes"], again["problems"]


def test_peft_float64_on_mps_names_peft_lines_once_and_the_call(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(PCA)
    doc = _run(app, "--device", "mps")
    assert not doc["ok"] and all("peft/utils/incremental_pca.py:" in p["message"] for p in doc["problems"])
    [fix] = doc["fixes"]  # one fix for the call, however many of peft's lines compute in float64
    code = fix["code"]
    assert code.startswith("# peft/utils/incremental_pca.py:") and "reached from your line app.py:5" in code
    assert "more of its line(s)" in code and "x.cpu()" in code and "pass dtype=" not in code, code
    assert fix["proven"] is False
    app.write_text(PCA.replace("ipca.partial_fit(x)", "ipca.partial_fit(x.cpu())"))
    assert _run(app, "--device", "mps")["ok"]


def test_a_float64_the_program_computes_itself_is_not_a_library_s() -> None:
    import torch

    import torchdoctor

    with torchdoctor.virtual_devices("xpu", profile="arc", raise_on_exit=False) as sim:
        x = torch.ones(3, device="xpu").double()
        (x * 2).sum()
    assert sim.problems and not any("library's own code" in p.message for p in sim.problems)


def test_a_library_line_under_the_default_device_is_the_library_s_not_torch_s_mode() -> None:
    import torch
    from torch.utils.data import WeightedRandomSampler

    import torchdoctor

    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        with torch.device("mps"):
            list(WeightedRandomSampler([1.0, 2.0, 3.0], 2))
    said = [p.message for p in sim.problems]
    assert said and all("torch/utils/data/sampler.py:" in m for m in said), said
    # torch's mode (torch.set_default_device's DeviceContext) is a hop, never the library line: the sampler's own
    # line is named (its float64 as_tensor in __init__, the cause; the multinomial in __iter__ that reads that tensor
    # is the same cause, said once)
    assert not any("_device.py" in m for m in said), said
    assert any("in WeightedRandomSampler.__init__ (`weights_tensor = torch.as_tensor(weights, dtype=torch.double)`)"
               in m for m in said), said
    assert not any("WeightedRandomSampler.__iter__" in m for m in said), said


def test_simulate_proves_training_without_a_scaler_by_a_re_run() -> None:
    import torch
    from torch import nn

    import torchdoctor

    seen: list[torch.dtype] = []

    def step(m: nn.Module) -> None:
        m = m.to("xpu")
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler(device="xpu")
        with torch.autocast("xpu", dtype=torch.float16):
            out = m(torch.randn(2, 4, device="xpu"))
        seen.append(out.dtype)
        scaler.scale(out.float().sum()).backward()
        scaler.step(opt)
        scaler.update()

    report = torchdoctor.simulate(nn.Linear(4, 2), device="xpu", profile="arc", call=step)
    [fix] = report.fixes
    assert "GradScaler.unscale_, torch's own code" in fix.code and "dtype=torch.bfloat16" in fix.code
    assert fix.proven and fix.tried == "applied in a virtual re-run: no problem left", fix.tried
    assert seen == [torch.float16, torch.bfloat16], seen  # the re-run trained as the fix says: bfloat16 autocast
    assert torch.amp.GradScaler.step.__qualname__ == "GradScaler.step"  # the scaler is put back after the re-run


def test_a_scheduler_s_own_float64_on_arc_names_diffusers_line() -> None:
    import torch
    from diffusers import FlowMapEulerDiscreteScheduler

    import torchdoctor

    with torchdoctor.virtual_devices("xpu", profile="arc", raise_on_exit=False) as sim:
        scheduler = FlowMapEulerDiscreteScheduler()
        scheduler.set_timesteps(4, device="xpu")  # float64 sigmas on an xpu, as diffusers keeps them off mps/npu
    assert scheduler.sigmas.dtype == torch.float64
    [p] = sim.problems
    assert "diffusers/schedulers/scheduling_flow_map_euler_discrete.py:" in p.message
    assert "in FlowMapEulerDiscreteScheduler.set_timesteps" in p.message and "xpu cannot compute in float64" in p.message
    [fix] = sim.fixes
    assert "diffusers' own code, reached from your line " in fix.code, fix.code
    assert re.search(r'test_library_float64\.py:\d+ \(`scheduler\.set_timesteps\(4, device="xpu"\)`\)', fix.code)
    assert 'device="cpu" at your line' in fix.code and not fix.proven and "pass dtype=" not in fix.code

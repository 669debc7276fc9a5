"""An in-place op whose self the program keeps on the cpu on purpose (an EMA of a cuda model's weights pinned on the
cpu, SimpleTuner's ``ema[n].lerp_(p.detach(), 0.01)`` missing its ``.to(ema[n].device)``): the fix moves what the
op reads to self's device at the op's line, a patch proven at every call of that line; never a move of self there (the
op would update a copy) and never the program's cpu placement undone. The patch applied leaves the run clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.apps import run_json

EMA = '''import torch, torch.nn as nn
net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).to("cuda")
ema = {n: p.detach().to("cpu", copy=True) for n, p in net.named_parameters()}
for step in range(2):
    net(torch.randn(3, 4, device="cuda")).sum().backward()
    with torch.no_grad():
        for n, p in net.named_parameters():
            ema[n].lerp_(p.detach(), 0.01)
print(sorted(ema)[0], ema["0.weight"].device)
'''
TOTAL = '''import torch
def running_sum(batches):
    total = torch.zeros(8)  # kept on the cpu: the host-side statistics
    for b in batches:
        total.add_(b * 2, alpha=0.5)
    return total
print(running_sum([torch.randn(8, device="cuda") for _ in range(3)]).device)
'''
DECAY = """import copy, torch, torch.nn as nn
class ModelEma(nn.Module):
    def __init__(self, model, decay=0.99):
        super().__init__()
        self.module, self.decay = copy.deepcopy(model), decay
        self.module.to(device="cpu")  # kept on the cpu on purpose
    @torch.no_grad()
    def update(self, model):
        ema_values, model_values = [], []
        for e, m in zip(self.module.state_dict().values(), model.state_dict().values()):
            ema_values.append(e)
            model_values.append(m)
        for e, m in zip(ema_values, model_values):
            e.lerp_(m, 1. - self.decay)
net = nn.Linear(4, 4).to("cuda")
ema = ModelEma(net)
ema.update(net)
print(ema.module.weight.device)
"""
FOREACH = """import copy, torch, torch.nn as nn

class ModelEmaV3(nn.Module):
    def __init__(self, model, decay=0.999, device=None):
        super().__init__()
        self.module = copy.deepcopy(model)
        self.module.eval()
        self.decay = decay
        self.device = device
        if self.device is not None:
            self.module.to(device=device)

    @torch.no_grad()
    def update(self, model):
        ema_lerp_values = []
        model_lerp_values = []
        for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values()):
            if ema_v.is_floating_point():
                ema_lerp_values.append(ema_v)
                model_lerp_values.append(model_v)
            else:
                ema_v.copy_(model_v)
        torch._foreach_lerp_(ema_lerp_values, model_lerp_values, weight=1. - self.decay)

device = "cuda:0"
model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Linear(32, 4)).to(device)
ema = ModelEmaV3(model, decay=0.99, device="cpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x = torch.randn(8, 16, device=device)
    loss = model(x).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    ema.update(model)
print("done")
"""
# the weight ``1. - decay`` is a Python float the line computes: no ``.to`` of it (pytorch-image-models#2127, hunt)
CASES = {"ema lerp_ of a model's parameters": (EMA, "ema[n].lerp_(p.detach().to(ema[n].device), 0.01)"),
         "ema lerp_ with a weight computed from a float": (DECAY, "e.lerp_(m.to(e.device), 1. - self.decay)"),
         "timm's _foreach_lerp_ of a cpu ema (pytorch-image-models#2127)": (FOREACH, "torch._foreach_lerp_(ema_lerp_values, "
                                                                               "[t.to(ema_lerp_values[0].device) for t "
                                                                               "in model_lerp_values], weight=1. - "
                                                                               "self.decay)"),
         "a running sum's add_ in a function": (TOTAL, "total.add_((b * 2).to(total.device), alpha=0.5)")}


@pytest.mark.parametrize("case", CASES)
def test_in_place_op_reads_at_its_self_device(tmp_path: Path, case: str) -> None:
    text, line = CASES[case]
    app = tmp_path / "app.py"
    app.write_text(text)
    doc = run_json(app, "cuda")
    assert not doc["ok"]
    [fix] = doc["fixes"]
    assert fix["code"].startswith(line)
    assert "writes into its self on cpu" in fix["code"] or "float" in case  # (there: the operand's own fix, alike)
    assert fix["proven"] is True
    codes = fix["code"] + doc["patch"]
    assert '"cpu"' not in doc["patch"].split("+", 1)[-1] and "inside the forward" not in codes
    subprocess.run(["git", "apply", "-"], input=doc["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    assert line in app.read_text()
    again = run_json(app, "cuda")
    assert again["ok"] and not again["fixes"], again


def test_only_the_operands_received_on_another_device_are_moved_never_a_number_the_line_computes() -> None:
    from torchdoctor._virtual.inplacefix import _moved_args

    # pytorch-image-models#2127's ``e.lerp_(m, 1. - self.decay)``: the weight is a float (no ``.to``)
    assert _moved_args("        e.lerp_(m, 1. - self.decay)", "lerp_", {0}) == \
        "        e.lerp_(m.to(e.device), 1. - self.decay)"
    assert _moved_args("total.add_(b * 2, alpha=w)", "add_", {0, "alpha"}) == \
        "total.add_((b * 2).to(total.device), alpha=w.to(total.device))"
    assert _moved_args("total.add_(b * 2, alpha=w)", "add_", set()) is None



EMA_BF16 = '''import copy, torch, torch.nn as nn

def inplace_lerp(tgt, src, weight):
    tgt.lerp_(src, weight)

class EMA:
    def __init__(self, model, beta=0.99):
        self.ema_model = copy.deepcopy(model)  # kept in float32 on purpose
        self.beta = beta
    @torch.no_grad()
    def update(self, model):
        for tgt, src in zip(self.ema_model.parameters(), model.parameters()):
            inplace_lerp(tgt, src, 1. - self.beta)

device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 4))
ema = EMA(model)
ema.ema_model.to(device)
model.to(device, torch.bfloat16)
for step in range(2):
    model(torch.randn(4, 16, device=device, dtype=torch.bfloat16)).float().square().mean().backward()
    ema.update(model)
print("done")
'''


def test_a_float32_ema_of_a_bfloat16_model_casts_what_it_reads_never_the_model(tmp_path: Path) -> None:
    """lucidrains/ema-pytorch#36: on a virtual device as on this CPU, the EMA keeps its float32 (the written self)
    and reads the bf16 model cast to it at the lerp_'s line; never ``model[0].weight.data.to(torch.float32)``."""
    app = tmp_path / "app.py"
    app.write_text(EMA_BF16)
    doc = run_json(app, "cuda:0")
    [fix] = doc["fixes"]
    assert fix["code"].startswith("tgt.lerp_(src.to(tgt.dtype), weight)"), fix
    assert "writes into its self in float32" in fix["code"] and fix["proven"] is True, fix
    assert "model[0]" not in doc["patch"]
    subprocess.run(["git", "apply", "-"], input=doc["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    again = run_json(app, "cuda:0")
    assert again["ok"] and not again["fixes"], again

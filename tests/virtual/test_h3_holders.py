"""A copy of a module's parameter that an object of the program keeps (an EMA's shadow, cloned before the model's
move) is named as the program holds it and fixed by moving that holder, never by building the model on the device;
a holder without ``.to`` is never told to call it."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.apps import run_json

DIFFUSERS_EMA = '''import torch, torch.nn as nn
from diffusers.training_utils import EMAModel
net = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 4))
ema = EMAModel(net.parameters(), decay=0.9, foreach=False)
net.to("cuda")
opt = torch.optim.SGD(net.parameters(), lr=0.1)
net(torch.randn(2, 4, device="cuda")).sum().backward(); opt.step()
ema.step(net.parameters())
print("stepped")
'''

OWN_EMA = '''import torch, torch.nn as nn
class Shadow:
    def __init__(self, params):
        self.copies = [p.detach().clone() for p in params]
    @torch.no_grad()
    def update(self, params):
        for s, p in zip(self.copies, params):
            s.sub_((s - p) * 0.1)
net = nn.Linear(4, 4)
avg = Shadow(net.parameters())
net.to("cuda")
avg.update(net.parameters())
print("updated")
'''


def test_an_ema_copy_made_before_the_move_is_named_and_its_holder_moved(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    (tmp_path / "app.py").write_text(DIFFUSERS_EMA)
    doc = run_json(tmp_path / "app.py", "cuda")
    assert doc["problems"], doc
    first = doc["problems"][0]
    assert first["path"] == "ema.shadow_params[0]" and first["message"].startswith(
        "ema.shadow_params[0] f32[8,4]@cpu is on cpu while aten."), first["message"]
    assert "torch.nn.Linear" not in " ".join(p["message"] for p in doc["problems"])
    codes = [f["code"] for f in doc["fixes"]]
    assert codes[0].startswith("ema.to('cuda:0')  # ema.shadow_params[0] is on cpu"), codes
    assert doc["fixes"][0]["proven"]
    assert not any("nn.Linear(" in c or ".to('cpu')" in c for c in codes), codes  # the model stays on the device


def test_a_holder_without_to_is_never_told_to_call_it(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(OWN_EMA)
    doc = run_json(tmp_path / "app.py", "cuda")
    assert doc["problems"]
    assert not any(f["code"].startswith("avg.to(") for f in doc["fixes"]), doc["fixes"]


OFFLOADED_STATE = '''import torch, torch.nn as nn
def place(opt, device):
    for st in opt.state.values():
        for k, v in st.items():
            if torch.is_tensor(v) and k != "step":
                st[k] = v.to(device)
net = nn.Linear(4, 4).to("cuda")
opt = torch.optim.Adam(net.parameters())
for _ in range(2):
    net(torch.randn(2, 4, device="cuda")).sum().backward()
    {back}
    opt.step(); opt.zero_grad()
    place(opt, "cpu")
print("done")
'''


def test_an_optimizer_state_the_program_offloaded_is_named_by_that_line_not_as_loaded(tmp_path: Path) -> None:
    src = OFFLOADED_STATE.replace("{back}", "pass")
    (tmp_path / "app.py").write_text(src)
    doc = run_json(tmp_path / "app.py", "cuda")
    [p] = doc["problems"]
    moved = next(i for i, ln in enumerate(src.splitlines(), 1) if "st[k] = v.to(device)" in ln)
    step = next(i for i, ln in enumerate(src.splitlines(), 1) if "opt.step()" in ln)
    assert f"optimizer state on cpu (taken to cpu by `.to()` at app.py:{moved}) while its parameter is on cuda:0 " \
        f"when opt.step() at app.py:{step} runs" in p["message"], p["message"]
    assert "load_state_dict" not in p["message"]
    [f] = doc["fixes"]
    assert f["code"].startswith(f"# opt's state was moved to cpu at app.py:{moved} and not moved back before "
                                f"opt.step() at app.py:{step}"), f["code"]
    assert not f["proven"] and "load_state_dict" not in f["code"]


def test_an_optimizer_state_moved_back_before_the_step_is_quiet(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(OFFLOADED_STATE.replace("{back}", 'place(opt, "cuda")'))
    assert run_json(tmp_path / "app.py", "cuda")["ok"]

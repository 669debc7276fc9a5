"""A tensor ``torch.load`` made at the program's line is made by that call (with its ``map_location``), never by the
``torch.empty`` torch's unpickler builds it with; the program's objects name it (an optimizer's param_group value:
``Optimizer.load_state_dict`` moves per-parameter state only), and its fix is ``map_location=`` the device at the
load, a diff that applied lets the program run clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.apps import run_json

pytest_plugins = ["pytester"]

# an optimizer keeping a tensor in its param_groups (D-Adaptation's ``d``), resumed from a cpu-mapped load
RESUME = '''import os, tempfile, torch, torch.nn as nn

class Scaled(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, dict(lr=0.1, d=None))
    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            if g["d"] is None:
                g["d"] = torch.ones(1, device=g["params"][0].device)
            for p in g["params"]:
                p.sub_(p.grad * g["d"] * g["lr"])

def fit(net, opt):
    net(torch.randn(2, 4, device="cuda")).sum().backward(); opt.step(); opt.zero_grad()

path = os.path.join(tempfile.mkdtemp(), "s.pt")
net = nn.Linear(4, 4).to("cuda"); opt = Scaled(net.parameters())
fit(net, opt)
torch.save({"opt": opt.state_dict()}, path)
net = nn.Linear(4, 4).to("cuda"); opt = Scaled(net.parameters())
state = torch.load(path, map_location="cpu", weights_only=True)
opt.load_state_dict(state["opt"])
fit(net, opt)
print("resumed")
'''

# a plain tensor saved on the cpu and loaded without map_location, used beside a moved model
PLAIN = '''import os, tempfile, torch, torch.nn as nn
path = os.path.join(tempfile.mkdtemp(), "t.pt")
torch.save({"scale": torch.ones(4)}, path)
net = nn.Linear(4, 4).to("cuda")
tables = torch.load(path)
print((net(torch.randn(2, 4, device="cuda")) * tables["scale"]).shape)
'''


def _line(src: str, text: str) -> int:
    return next(i for i, ln in enumerate(src.splitlines(), 1) if text in ln)


def test_a_param_group_tensor_of_a_resume_is_named_with_its_load(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(RESUME)
    doc = run_json(app, "cuda")
    load, state = _line(RESUME, "torch.load("), _line(RESUME, "opt.load_state_dict(")
    [p] = doc["problems"]
    assert p["message"].startswith(
        f"opt.param_groups[0]['d'] (an optimizer's param_group value, loaded by torch.load at app.py:{load} with "
        f"map_location='cpu'; Scaled.load_state_dict at app.py:{state} moves per-parameter state to each "
        "parameter's device and leaves param_group values as loaded) f32[1]@cpu is on cpu"), p["message"]
    assert "torch.empty" not in p["message"]
    [f] = doc["fixes"]
    assert f["code"].startswith("state = torch.load(path, map_location='cuda:0', weights_only=True)  # the load put "
                                "what it read where map_location='cpu' says and nothing moves opt.param_groups[0]['d'] "
                                "to 'cuda:0' after (an optimizer's load_state_dict moves per-parameter state only"), f
    assert f["proven"] and "device=" not in doc["patch"]
    assert "+state = torch.load(path, map_location='cuda:0', weights_only=True)" in doc["patch"]
    subprocess.run(["git", "apply", "-"], input=doc["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    again = run_json(app, "cuda")
    assert again["ok"] and again["problems"] == []


def test_a_tensor_loaded_without_map_location_is_named_as_the_program_holds_it(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(PLAIN)
    doc = run_json(app, "cuda")
    load = _line(PLAIN, "torch.load(")
    [p] = doc["problems"]
    assert p["message"].startswith(f"tables['scale'] (loaded by torch.load at app.py:{load} with no map_location) "
                                   "f32[4]@cpu is on cpu while aten.mul.Tensor runs on cuda:0"), p["message"]
    assert "+tables = torch.load(path, map_location='cuda:0')" in doc["patch"]
    subprocess.run(["git", "apply", "-"], input=doc["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    assert run_json(app, "cuda")["ok"]


def test_the_map_location_diff_replaces_or_adds_the_argument(tmp_path: Path) -> None:
    import torch

    from torchdoctor._virtual.loaded import map_diff
    from torchdoctor._virtual.origin import LINES

    src = tmp_path / "load_app.py"
    src.write_text('sd = torch.load(p, map_location="cpu")\nsd = torch.load(p)\nsd = torch.load(p, "cpu")\n'
                   'sd = torch.load(p, **kw)\n')
    cuda = torch.device("cuda", 0)
    for n in range(1, 5):
        LINES[f"load_app.py:{n}"] = (str(src), n)
    try:
        assert map_diff("load_app.py:1", cuda)[0] == "sd = torch.load(p, map_location='cuda:0')"  # type: ignore[index]
        assert map_diff("load_app.py:2", cuda)[0] == "sd = torch.load(p, map_location='cuda:0')"  # type: ignore[index]
        assert map_diff("load_app.py:3", cuda) is None  # by position: no one place to write it
        assert map_diff("load_app.py:4", cuda) is None
        assert map_diff("load_app.py:1", torch.float16) is None  # a dtype is no map_location
    finally:
        for n in range(1, 5):
            LINES.pop(f"load_app.py:{n}", None)


# safetensors' load_file makes its tensors with torch's host-data factories inside the library: the call at the
# program's line is their maker, and its own device= the fix
SAFETENSORS = '''import os, tempfile, torch, torch.nn as nn
from safetensors.torch import save_file, load_file
path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
save_file({"scale": torch.ones(4)}, path)
net = nn.Linear(4, 4).to("cuda")
weights = load_file(path, device="cpu")
print((net(torch.randn(2, 4, device="cuda")) * weights["scale"]).shape)
'''


def test_a_library_loader_is_the_maker_of_what_it_returns(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(SAFETENSORS)
    doc = run_json(app, "cuda")
    load = _line(SAFETENSORS, "load_file(path")
    [p] = doc["problems"]
    assert p["message"].startswith(f"weights['scale'] (loaded by safetensors.torch.load_file at app.py:{load} with "
                                   "device='cpu') f32[4]@cpu is on cpu"), p["message"]
    assert "torch.asarray" not in p["message"] and "safetensors/torch.py" not in p["message"]
    [f] = doc["fixes"]
    assert f["code"].startswith("weights = load_file(path, device='cuda:0')  # the load put what it read where "
                                "device='cpu' says and nothing moves weights['scale'] to 'cuda:0' after"), f
    assert f["proven"] and "move what that call returns" not in f["code"]
    assert "+weights = load_file(path, device='cuda:0')" in doc["patch"]
    subprocess.run(["git", "apply", "-"], input=doc["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    assert run_json(app, "cuda")["ok"]


SIMULATED = '''import torch, torch.nn as nn
def build():
    return nn.Linear(4, 4)
def app(m, path):
    m.to("cuda")
    tables = torch.load(path, map_location="cpu")
    return m(torch.randn(2, 4, device="cuda")) * tables["scale"]
'''


def test_simulate_proves_the_map_location_fix_by_a_re_run_that_loads_so(tmp_path: Path) -> None:
    import importlib.util
    import sys

    import torch

    import torchdoctor

    torch.save({"scale": torch.ones(4)}, tmp_path / "t.pt")
    (tmp_path / "sim_loaded_app.py").write_text(SIMULATED)
    spec = importlib.util.spec_from_file_location("sim_loaded_app", tmp_path / "sim_loaded_app.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = torchdoctor.simulate(mod.build(), device="cuda:0", call=lambda m: mod.app(m, str(tmp_path / "t.pt")))
    assert [p.path for p in r.problems] == ["<top level>"] and "tables['scale'] (loaded by torch.load at " in \
        r.problems[0].message
    [fix] = r.fixes
    assert fix.code.startswith("tables = torch.load(path, map_location='cuda:0')  # the load put what it read where "
                               "map_location='cpu' says"), fix.code
    assert fix.proven and "re-run with it applied still found" not in fix.tried, fix.tried
    assert "sim_loaded_app" not in sys.modules


def test_the_marker_names_the_load_and_fixes_its_map_location(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_marker_load='''
        import os, tempfile, pytest, torch
        from torch import nn

        @pytest.mark.simulate(device="cuda:0")
        def test_scaled():
            path = os.path.join(tempfile.mkdtemp(), "t.pt")
            torch.save({"scale": torch.ones(4)}, path)
            net = nn.Linear(4, 4).to("cuda")
            tables = torch.load(path, map_location="cpu")
            net(torch.randn(2, 4, device="cuda")) * tables["scale"]
    ''')
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore", timeout=300)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "tables['scale'] (loaded by torch.load at test_marker_load.py:9 with map_location='cpu') f32[4]@cpu" in out
    assert "tables = torch.load(path, map_location='cuda:0')  # the load put what it read" in out
    assert "torch.empty" not in out


HELD_BY_OBJECT = '''import os, tempfile, torch, torch.nn as nn
class Averager:
    def __init__(self, net):
        self.shadow = [p.detach().clone() for p in net.parameters()]
    def blend(self, net):
        return [p * 0.5 + s * 0.5 for p, s in zip(net.parameters(), self.shadow)]
path = os.path.join(tempfile.mkdtemp(), "avg.pt")
net = nn.Linear(4, 4).to("cuda")
avg = Averager(net)
torch.save(avg.shadow, path)
avg.shadow = torch.load(path, map_location="cpu")  # resume
print(len(avg.blend(net)))
'''


def test_a_loaded_tensor_an_object_keeps_is_named_by_that_object(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(HELD_BY_OBJECT)
    doc = run_json(app, "cuda")
    load = _line(HELD_BY_OBJECT, "torch.load(")
    assert doc["problems"]
    p = doc["problems"][0]
    assert p["message"].startswith(f"avg.shadow[0] (loaded by torch.load at app.py:{load} with map_location='cpu') "
                                   "f32[4,4]@cpu is on cpu"), p["message"]
    f = doc["fixes"][0]
    assert f["code"].startswith("avg.shadow = torch.load(path, map_location='cuda:0')  # the load put"), f["code"]
    assert "# resume  #" not in f["code"]  # the line's own comment stays in the diff, not in the code shown
    assert "+avg.shadow = torch.load(path, map_location='cuda:0')  # resume" in doc["patch"]
    subprocess.run(["git", "apply", "-"], input=doc["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    assert run_json(app, "cuda")["ok"]

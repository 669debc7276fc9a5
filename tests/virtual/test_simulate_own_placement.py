"""``simulate`` of a model that hooks place layer by layer: the program's own forward pre-hooks (a sequential offload,
a block swap), accelerate's CPU offload, diffusers' group offloading. Such a model is never moved whole by the
program that runs it (it does not fit), so simulate checks it as its hooks place it — no ``model.to(device)`` — and
fixes what the hooks never move (a Parameter of a module above the layers they place) where the forward uses it,
proven, as ``torchdoctor run`` does; never a move of the whole model, never a ``.data`` move of one weight."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._cli.main import main

APP = """
    import torch
    import torch.nn as nn
    import torchdoctor


    def sequential_offload(model, device):
        for m in model.modules():
            if not list(m.children()) and list(m.parameters(recurse=False)):
                m.register_forward_pre_hook(lambda mod, args: mod.to(device) and None)
                m.register_forward_hook(lambda mod, args, out: mod.to("cpu") and None)
        return model


    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.norm, self.fc = nn.LayerNorm(d), nn.Linear(d, d)
            self.gate = nn.Parameter(torch.full((d,), 0.5))

        def forward(self, x):
            return x + self.gate * self.fc(self.norm(x))


    class Net(nn.Module):
        def __init__(self, d=8, n=6):
            super().__init__()
            self.inp = nn.Linear(4, d)
            self.pos = nn.Parameter(torch.zeros(1, n, d))
            self.blocks = nn.ModuleList(Block(d) for _ in range(2))

        def forward(self, z):
            x = self.inp(z) + self.pos
            for b in self.blocks:
                x = b(x)
            return x


    def build():
        device = torch.device("cuda")
        return torchdoctor.Target(sequential_offload(Net(), device), (torch.randn(1, 6, 4, device=device),))
"""


@pytest.fixture()
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    (tmp_path / "offapp.py").write_text(textwrap.dedent(APP))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    import offapp  # type: ignore[import-not-found]

    return importlib.reload(offapp)


def _at_uses(fixes: str) -> None:
    assert "x = self.inp(z) + self.pos.to(z.device)  # at offapp.py:" in fixes, fixes
    assert "return x + self.gate.to(x.device) * self.fc(self.norm(x))  # at offapp.py:" in fixes, fixes
    assert "forward pre-hooks (offapp.py:" in fixes and "place 5 of its layers per call" in fixes, fixes
    assert "torchdoctor.move(" not in fixes and ".data = " not in fixes and "model.to(" not in fixes, fixes


def test_the_api_checks_a_model_its_pre_hooks_offload_as_they_place_it(app: object) -> None:
    net = app.sequential_offload(app.Net(), torch.device("cuda"))  # type: ignore[attr-defined]
    report = torchdoctor.simulate(net, (torch.randn(1, 6, 4),), device="cuda")
    assert {p.path for p in report.problems} == {"pos", "blocks.0.gate", "blocks.1.gate"}, report
    _at_uses(report.fix or "")
    assert all(f.proven for f in report.fixes), report.fixes
    assert next(p for p in net.parameters()).device.type == "cpu"  # the user's model untouched


def test_the_api_with_call_fixes_at_the_uses_too(app: object) -> None:
    def run(m: nn.Module) -> None:
        app.sequential_offload(m, torch.device("cuda"))  # type: ignore[attr-defined]
        m(torch.randn(1, 6, 4, device="cuda"))

    report = torchdoctor.simulate(app.Net(), device="cuda", call=run)  # type: ignore[attr-defined]
    _at_uses(report.fix or "")
    assert all(f.proven for f in report.fixes), report.fixes


def test_the_cli_target_is_not_moved_whole(app: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "offapp.py:build", "--device", "cuda", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    fixes = "\n".join(f["code"] for f in doc["fixes"])
    _at_uses(fixes)
    assert all(f["proven"] for f in doc["fixes"]), doc["fixes"]


def test_a_pre_hook_that_places_nothing_leaves_the_move_to_simulate(app: object) -> None:
    net = app.Net()  # type: ignore[attr-defined]
    for m in net.modules():
        if isinstance(m, nn.Linear):  # a shape check: no move in it
            m.register_forward_pre_hook(lambda mod, args: None if args[0].shape[-1] == mod.in_features else 1 / 0)
    report = torchdoctor.simulate(net, (torch.randn(1, 6, 4),), device="cuda")
    assert report.ok, report  # moved whole as a user would: the hooks place nothing


class _Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(4, 8), nn.Linear(8, 4)
        self.pos = nn.Parameter(torch.zeros(1, 6, 8))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.out(self.inp(z) + self.pos)


def test_accelerate_cpu_offload_runs_as_its_hooks_place_it() -> None:
    accelerate = pytest.importorskip("accelerate")
    net = _Plain()
    accelerate.cpu_offload(net, execution_device=torch.device("cuda"))  # weights on meta, held by the hooks
    report = torchdoctor.simulate(net, (torch.randn(1, 6, 4),), device="cuda")
    assert report.ok, report  # never 'holds no data (meta)': the hooks load each layer's weights per call
    net, _ = accelerate.cpu_offload_with_hook(_Plain(), torch.device("cuda"))
    assert torchdoctor.simulate(net, (torch.randn(1, 6, 4),), device="cuda").ok


def test_diffusers_group_offloading_runs_as_its_hooks_place_it() -> None:
    hooks = pytest.importorskip("diffusers.hooks")
    net = _Plain()
    hooks.apply_group_offloading(net, onload_device=torch.device("cuda"), offload_type="leaf_level")
    report = torchdoctor.simulate(net, (torch.randn(1, 6, 4),), device="cuda")
    assert report.ok, report  # diffusers onloads the root's own Parameter with the leaf groups
    assert {t.device.type for t in net.parameters()} == {"cpu"}

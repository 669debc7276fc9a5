"""A model built on meta (weights not loaded), simulated as a new user would (issue 27, points 2 and 9): the API's
``simulate`` and the CLI's in-session ``torchdoctor simulate TARGET`` agree — the weights are assumed on the device,
the report says so with the way out, and what else is wrong is still named; the fixes never contradict each
other or the profile's memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._cli.main import main
from support.apps import app_folder

APP = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        with torch.device("meta"):  # built without weights
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 4)
        self.mask = torch.ones(4)  # a plain attribute on cpu: Module.to never moves it (the planted bug)

    def forward(self, x):
        return self.b(self.a(x)) * self.mask


def target():
    return Net(), (torch.ones(2, 8),)


def on_meta():
    with torch.device("meta"):  # the inputs too
        return nn.Linear(4, 4), (torch.ones(1, 4),)


def built_on_cuda():  # the TARGET's own code needs the virtual devices: only the in-session path can load it
    with torch.device("meta"):
        m = nn.Linear(4, 4)
    return m, (torch.ones(1, 4, device="cuda:1"),)
'''


@pytest.fixture()
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return app_folder(tmp_path, monkeypatch, "metaapp.py", APP)


def _api(name: str, **kw: object) -> torchdoctor.SimulationReport:
    import importlib

    obj, inputs = getattr(importlib.import_module("metaapp"), name)()
    return torchdoctor.simulate(obj, inputs, **kw)  # type: ignore[arg-type]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["simulate", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_cli_and_api_assume_meta_weights_loaded_and_still_name_the_planted_bug(
        app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api = _api("target", device="cuda:1", dtype="bfloat16")
    code, doc = _cli(capsys, "metaapp.py:target", "--device", "cuda:1", "--dtype", "bfloat16")
    assert code == api.exit_code() == 1
    assert sorted((p["kind"], p["path"]) for p in doc["problems"]) == \
        sorted((p.kind, p.path) for p in api.problems) == [("device", "mask"), ("dtype", "mask")]  # not masked by
    # meta; the fp32 mask also promotes the bf16 run silently (issue 42): one fix moves and casts it
    for assumed in (api.assumed, doc["assumed"]):
        assert assumed is not None and assumed.startswith("weights not loaded: assumed on cuda:1")
        assert "assume_device=False" in assumed and "--assume-device off" in assumed  # the way out
    text = str(api)
    assert text.splitlines()[1].startswith("weights not loaded: assumed on cuda:1")
    assert doc["fix"] == api.fix and "model.mask.data = model.mask.data.to('cuda:1', torch.bfloat16)" in (api.fix or "")
    assert main(["simulate", "metaapp.py:target", "--device", "cuda:1", "--dtype", "bfloat16"]) == 1
    assert "weights not loaded: assumed on cuda:1" in capsys.readouterr().out


def test_assume_off_checks_the_weights_as_missing_on_both_paths(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api = _api("target", device="cuda:1", dtype="bfloat16", assume_device=False)
    code, doc = _cli(capsys, "metaapp.py:target", "--device", "cuda:1", "--dtype", "bfloat16",
                     "--assume-device", "off")
    want = [("device", "mask"), ("dtype", "mask"), ("meta", "a.bias"), ("meta", "a.weight"), ("meta", "b.bias"),
            ("meta", "b.weight")]
    assert code == 1 and doc["assumed"] is None and api.assumed is None
    assert sorted((p["kind"], p["path"]) for p in doc["problems"]) == sorted((p.kind, p.path) for p in api.problems) \
        == want  # the in-session path names paths as the copy does, not "<top level>"
    # the fix loads the weights before anything is moved (moving a meta tensor raises)
    lines = (api.fix or "").splitlines()
    assert lines[0].startswith("# 4 tensors are on meta") and "load_state_dict" in lines[0]
    assert doc["fix"] == api.fix


def test_meta_inputs_follow_the_weights(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _api("on_meta", device="mps").ok
    code, doc = _cli(capsys, "metaapp.py:on_meta", "--device", "mps")
    assert code == 0 and doc["assumed"].startswith("weights not loaded: assumed on mps:0")
    assert _cli(capsys, "metaapp.py:on_meta", "--device", "mps", "--assume-device", "cpu")[0] == 0
    off = _api("on_meta", device="mps", assume_device=False)
    code, doc = _cli(capsys, "metaapp.py:on_meta", "--device", "mps", "--assume-device", "off")
    assert code == 1 and sorted(p["path"] for p in doc["problems"]) == sorted(p.path for p in off.problems) == \
        ["bias", "input 0", "weight"]  # a meta input holds no data either when nothing is assumed


def test_a_target_that_needs_the_virtual_devices_is_assumed_too(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _cli(capsys, "metaapp.py:built_on_cuda", "--device", "cuda:1")
    assert code == 0 and doc["assumed"].startswith("weights not loaded: assumed on cuda:1"), doc
    assert main(["simulate", "metaapp.py:target", "--device", "cuda:1", "--assume-device", "gpu"]) == 2
    assert "--assume-device gpu" in capsys.readouterr().err


def _big() -> nn.Module:
    with torch.device("meta"):  # 3 x 8 GiB in bfloat16: more than a T4's 16 GiB; a T4 has no bf16 convolution
        return nn.Sequential(*[nn.Conv2d(65536, 65536, 1, bias=False) for _ in range(3)])


@pytest.mark.parametrize("cast_first", [False, True])
def test_t4_fix_never_contradicts_its_memory(cast_first: bool) -> None:
    model = _big()
    x = torch.ones(1, 65536, 1, 1)
    if cast_first:  # already in the dtype asked for: no move counts it, what sits on the device must
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    report = torchdoctor.simulate(model, (x,), device="cuda:0", dtype="bfloat16", profile="t4")
    kinds = sorted(p.kind for p in report.problems)
    assert kinds == ["memory", "unsupported_dtype"], report
    memory = next(p for p in report.problems if p.kind == "memory")
    assert memory.found == "24 GiB" and "16 GiB" in memory.expected
    fix = report.fix or ""
    assert "float32" not in fix  # float32 would double a model that already does not fit
    assert "model.to(torch.float16)" in fix and "# still too large: it needs 24 GiB on cuda:0" in fix


def test_meta_fix_loads_before_it_moves() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            with torch.device("meta"):
                self.a = nn.Linear(8, 8)  # a leftover on meta among real weights: no assumption
            self.b = nn.Linear(8, 4)
            self.m = [torch.ones(4) for _ in range(5)]  # five plain tensors Module.to never moves

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.b(self.a(x))
            for t in self.m:
                y = y * t
            return y

    report = torchdoctor.simulate(Net(), (torch.ones(2, 8),), device="cuda:1", dtype="bfloat16")
    assert report.assumed is None and {p.kind for p in report.problems} == {"meta", "device", "dtype"}
    # the plain fp32 tensors promote the bf16 output silently (issue 42): one fix moves and casts them
    assert sorted(p.path for p in report.problems if p.kind == "dtype") == [f"m.{i}" for i in range(5)]
    lines = (report.fix or "").splitlines()
    load = next(i for i, line in enumerate(lines) if "load the weights" in line)
    move = next(i for i, line in enumerate(lines) if line.startswith("torchdoctor.move("))
    assert load < move and lines[move - 1] == "# then, with the weights loaded:"

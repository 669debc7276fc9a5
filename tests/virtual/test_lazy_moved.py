"""A lazy module built on the cpu and moved before its first call (``nn.LazyLinear(2).to("cuda")``): torch's move keeps
its parameters and buffers uninitialized, on the device, and the first call materializes them there. A virtual run
does the same: the module runs, its parameters and buffers end on the virtual device in the shape its input gave,
gradients and an optimizer step follow, and the program's own lazy module given to ``simulate`` is left lazy."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import torch
from torch import nn

import torchdoctor
from tests.support.apps import run_json


def _net() -> nn.Sequential:
    return nn.Sequential(nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))


def test_moved_lazy_layers_materialize_on_the_device() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        net = _net().to("cuda", torch.float16)
        assert isinstance(net[0].weight, nn.UninitializedParameter)  # still lazy, as torch's move leaves it
        assert isinstance(net[1].running_mean, nn.UninitializedBuffer)
        y = net(torch.randn(2, 3, 8, 8, device="cuda", dtype=torch.float16))
        assert y.shape == (2, 2) and y.device == torch.device("cuda:0") and y.dtype == torch.float16
        for t in (net[0].weight, net[1].running_mean, net[4].weight):
            assert not isinstance(t, nn.parameter.UninitializedTensorMixin)
            assert t.device == torch.device("cuda:0") and t.dtype == torch.float16
        assert net[0].weight.shape == (4, 3, 3, 3) and net[1].running_mean.shape == (4,)
        assert net[4].weight.shape == (2, 4 * 6 * 6)
        y.float().sum().backward()
        assert net[4].weight.grad is not None and net[4].weight.grad.device == torch.device("cuda:0")
        torch.optim.SGD(net.parameters(), lr=0.1).step()
    assert sim.ok and not sim.problems, sim.problems


def test_simulate_of_a_lazy_model_leaves_the_program_s_model_lazy() -> None:
    net = _net()
    report = torchdoctor.simulate(net, (torch.randn(2, 3, 8, 8),), device="cuda")
    assert report.ok, report.problems
    assert isinstance(net[0].weight, nn.UninitializedParameter) and isinstance(net[4].weight, nn.UninitializedParameter)


def test_run_of_a_program_moving_a_lazy_linear(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text('import torch, torch.nn as nn\nm = nn.LazyLinear(2).to("cuda")\n'
                   'y = m(torch.randn(3, 5, device="cuda"))\nprint(tuple(m.weight.shape), m.weight.device)\n')
    doc = run_json(app, "cuda")
    assert doc["ok"] and doc["exit_code"] == 0 and not doc["problems"], doc
    assert not doc.get("internal"), doc["internal"]  # the trace of the move read the lazy parameters without a note



def test_trace_records_the_cast_of_a_lazy_module(caplog: pytest.LogCaptureFixture) -> None:
    m = nn.LazyLinear(2)
    with caplog.at_level(logging.WARNING, logger="torchdoctor"), torchdoctor.trace(m) as t:
        m.to(torch.float64)
    assert isinstance(m.weight, nn.UninitializedParameter) and m.weight.dtype == torch.float64
    assert sorted(r.path for r in t.records) == ["bias", "weight"], t.records
    assert not [r for r in caplog.records if "could not record" in r.getMessage()]

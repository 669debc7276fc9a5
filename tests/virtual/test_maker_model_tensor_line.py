"""A model's own tensor that the program made on the CPU inside a run is fixed at the line that made it, named with
its maker: a buffer registered from ``torch.from_numpy`` in an ``__init__`` run under ``with torch.device("cuda"):``
(from_numpy ignores the context), a state dict filled with ``torch.empty(v.shape)`` and loaded with
``assign=True``. A block's fix names the model as the program's frame does (``net.``), never a ``model`` the
program does not have; a model built on the cpu and never moved keeps its move."""

from __future__ import annotations

import inspect

import numpy as np
import torch
from torch import nn

import torchdoctor


def _at(obj: object, text: str) -> str:
    lines, start = inspect.getsourcelines(obj)  # type: ignore[arg-type]
    line = start + next(i for i, ln in enumerate(lines) if text in ln)
    return f"tests/virtual/test_maker_model_tensor_line.py:{line}"


class Table(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("table", torch.from_numpy(np.ones(4, dtype=np.float32)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.table


class Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def load_into(model: nn.Module) -> None:
    sd = {}
    for k, v in model.state_dict().items():
        t = torch.empty(v.shape)
        t.fill_(0.5)
        sd[k] = t
    model.load_state_dict(sd, assign=True)


def test_a_from_numpy_buffer_under_a_device_context_is_fixed_at_its_line() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        with torch.device("cuda"):
            net = Table()
        net(torch.randn(2, 4, device="cuda"))
    assert [p.path for p in sim.problems] == ["table"]
    (fix,) = sim.fixes
    at = _at(Table, "torch.from_numpy")
    assert fix.code == (f"# torch.from_numpy at {at} made table on cpu (it ignores the torch.device context): move "
                        "it: torch.from_numpy(...).to(torch.get_default_device())")  # the program's own choice
    assert fix.proven, fix.tried
    want = '+        self.register_buffer("table", torch.from_numpy(np.ones(4, dtype=np.float32))' \
        '.to(torch.get_default_device()))'
    assert fix.diff is not None and want in fix.diff, fix.diff


class Grid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        grid = np.arange(32, dtype=np.float64).reshape(4, 8) / 32  # numpy's default float64
        self.register_buffer("pos", torch.from_numpy(grid), persistent=False)
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x + self.pos[: x.shape[1]].float())


def test_a_float64_numpy_buffer_moved_to_mps_is_cast_at_its_maker() -> None:
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        net = Grid().to("mps")
        net(torch.randn(2, 4, 8, device="mps"))
    assert [(p.kind, p.path) for p in sim.problems] == [("unsupported_dtype", "pos")]
    (fix,) = sim.fixes
    assert fix.code == (f"# torch.from_numpy at {_at(Grid, 'torch.from_numpy')} made pos in float64 (the dtype of its "
                        "data): cast it there: torch.from_numpy(...).to(torch.float32)")
    assert fix.proven and fix.diff is not None and "torch.from_numpy(grid).to(torch.float32)" in fix.diff


def test_a_state_dict_filled_by_a_device_less_factory_is_fixed_at_that_factory() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        net = Lin().to("cuda")
        load_into(net)
        net(torch.randn(2, 4, device="cuda"))
    assert {p.path for p in sim.problems} == {"lin.weight", "lin.bias"}
    (fix,) = sim.fixes
    assert fix.code == (f"# torch.empty at {_at(load_into, 'torch.empty')} made lin.weight, lin.bias on cpu: pass "
                        "device= (torch.empty(..., device='cuda:0'))")
    assert fix.proven and fix.diff is not None and "+        t = torch.empty(v.shape, device='cuda:0')" in fix.diff
    report = torchdoctor.simulate(Lin(), device="cuda:0",
                                  call=lambda m: (load_into(m), m(torch.randn(2, 4, device="cuda:0"))))
    assert report.fixes[0].code == fix.code and report.fixes[0].proven, report.text()


def test_a_block_fix_names_the_model_as_the_program_does() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        net = Lin().to("cuda")
        net.lin.weight.data = net.lin.weight.data.cpu()
        net(torch.randn(2, 4, device="cuda"))
    assert [f.code for f in sim.fixes] == ["net.lin.weight.data = net.lin.weight.data.to('cuda:0')"]


def test_a_model_built_on_the_cpu_and_never_moved_keeps_its_move() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        net = Table()
        net(torch.randn(2, 4, device="cuda"))
    assert sim.fixes and not any("torch.from_numpy at" in f.code for f in sim.fixes), [f.code for f in sim.fixes]
    assert all("model" not in f.code.split("  #")[0] for f in sim.fixes), [f.code for f in sim.fixes]

"""A module the program keeps apart from the model on the cpu (an EMA copy: ``ema = copy.deepcopy(model).cpu()`` or
``ema.to("cpu")``) and then uses with accelerator tensors: the fix names the program's line that put it there, as
the program holds it (``ema``), never a path of ``model``. A diffusers ``EMAModel`` kept on the cpu on purpose and
brought in for its update only is quiet."""

from __future__ import annotations

import copy
import inspect

import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor


class _Det(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone, self.head = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.backbone(x)))


def _line(fn: object, text: str) -> str:
    lines, start = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    return f"tests/virtual/test_maker_put_apart.py:{start + next(i for i, ln in enumerate(lines) if text in ln)}"


def _evaluated() -> torchdoctor.VirtualSession:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = _Det().to("cuda:0")
        ema = copy.deepcopy(m).requires_grad_(False)
        ema = ema.cpu()  # kept on the cpu to save memory, then evaluated with cuda inputs
        m(torch.randn(2, 8, device="cuda:0")).sum().backward()
        ema(torch.randn(2, 8, device="cuda:0"))
    return sim


def _updated() -> torchdoctor.VirtualSession:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = nn.Linear(4, 4).to("cuda:0")
        ema = copy.deepcopy(m)
        ema.to("cpu")
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), m.parameters()):
                pe.mul_(0.9).add_(pm, alpha=0.1)
    return sim


def test_an_ema_copy_run_on_the_cpu_is_fixed_naming_the_line_that_put_it_there() -> None:
    sim = _evaluated()
    (fix,) = sim.fixes
    assert fix.code.startswith("ema.to('cuda:0')  # ema (_Det, called at "), fix.code
    assert fix.code.endswith(f"put on cpu by `ema = ema.cpu()` at {_line(_evaluated, 'ema = ema.cpu()')}: move it "
                             "back before it meets tensors on cuda:0"), fix.code
    assert "model" not in fix.code.split("  #")[0] and fix.proven, fix


def test_an_ema_copy_updated_on_the_cpu_names_its_move() -> None:
    sim = _updated()
    assert "ema.weight" in {p.path for p in sim.problems}
    (fix,) = sim.fixes
    assert fix.code == (f"ema.to('cuda:0')  # ema.weight is on cpu; put on cpu by `ema.to(\"cpu\")` at "
                        f"{_line(_updated, 'ema.to(')}: move it back before it meets tensors on cuda:0"), fix.code


def test_a_diffusers_ema_kept_on_the_cpu_between_updates_is_quiet() -> None:
    from diffusers.training_utils import EMAModel

    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)).to("cuda")
        ema = EMAModel(model.parameters(), decay=0.9)
        ema.to(device="cpu")  # offloaded between steps, on purpose
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):
            model(torch.randn(4, 8, device="cuda")).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            ema.to(device="cuda")
            ema.step(model.parameters())
            ema.to(device="cpu")
    assert sim.ok and not sim.problems and not sim.fixes, sim.problems
    report = torchdoctor.simulate(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)), device="cuda:0",
                                  call=lambda m: _ema_step(m, EMAModel))
    assert report.ok and not report.problems, report.text()


def _ema_step(m: nn.Module, ema_cls: type) -> torch.Tensor:
    m.to("cuda:0")
    ema = ema_cls(m.parameters(), decay=0.9)
    ema.to(device="cpu")
    out = m(torch.randn(4, 8, device="cuda:0"))
    ema.to(device="cuda:0")
    ema.step(m.parameters())
    ema.to(device="cpu")
    return out

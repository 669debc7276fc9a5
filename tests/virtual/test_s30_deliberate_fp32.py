"""A stream the program keeps in float32 on purpose is no silent promotion (hunt 30, z3): Mamba's
``residual_in_fp32`` upcasts the residual with ``residual.float()``, adds each block's half-precision output into it
(``hidden + residual``: float16 + float32 -> float32, the design) and casts back before the last layer
(``.to(self.out.weight.dtype)``). ``simulate(device="cpu", dtype=torch.float16)`` reported that add as "a silent
promotion" and proved a patch turning ``residual.float()`` into ``residual.to(torch.float16)``, removing the design:
from the second block on, ``.float()`` of the already-float32 sum returns the sum itself (no cast op runs), so the sum
of an explicit upcast and the float16 stream was not known as the program's choice. Now what an op computes wider
from operands that are all the program's explicit upcasts (or what they made) stays the program's choice.

Real silent promotions are still found: a plain float32 attribute (``.to`` never casts it), a factory given no dtype
(the default float32), the deliberate stream multiplied by such a factory; and a float32 tensor reaching a layer
that refuses the mix is still a problem."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

import torchdoctor
from run.test_run_cli import run, write
from torchdoctor._virtual.cpudtype import Calls, Checks
from torchdoctor._walk import walk


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        residual = (x + residual) if residual is not None else x
        residual = residual.float()  # residual_in_fp32, by design
        return self.fc(self.norm(residual.to(self.norm.weight.dtype))), residual


class Mamba(nn.Module):
    """hunt30/z3: a timestep embedding computed in float32 and cast back, and a float32 residual stream."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.t_proj = nn.Linear(16, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(3)])
        self.out = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        freqs = torch.exp(-math.log(10000) * torch.arange(8, dtype=torch.float32, device=t.device) / 8)
        args = t[:, None].float() * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(self.t_proj.weight.dtype)
        h, residual = x + self.t_proj(emb)[:, None], None
        for b in self.blocks:
            h, residual = b(h, residual)
        return self.out((h + residual).to(self.out.weight.dtype))


INPUTS = (torch.randn(2, 5, 16), torch.tensor([1, 500]))


def test_a_float32_residual_kept_on_purpose_is_quiet_on_the_cpu() -> None:
    report = torchdoctor.simulate(Mamba(), INPUTS, device="cpu", dtype=torch.float16)
    assert report.ok and report.problems == () and report.fixes == () and report.fix is None, report.text()
    assert "silent promotion" not in report.text()


def test_and_on_a_virtual_cuda_in_bfloat16() -> None:
    report = torchdoctor.simulate(Mamba(), INPUTS, device="cuda", dtype=torch.bfloat16)
    assert report.ok and report.problems == (), report.text()


def test_and_under_the_pytest_markers_in_place_check() -> None:
    m = Mamba().to("cpu", torch.float16)
    found, stack = walk(m), []
    checks = Checks(torch.float16, {id(e.tensor): (e.path, e.role) for e in found.entries}, stack,
                    {id(x): p for p, x in found.modules})
    pre = torch.nn.modules.module.register_module_forward_pre_hook(lambda mod, a: stack.append(mod))
    post = torch.nn.modules.module.register_module_forward_hook(lambda mod, a, o: stack.pop() and None)
    try:
        with checks, Calls(checks):
            out = m(INPUTS[0].half(), INPUTS[1])
    finally:
        pre.remove()
        post.remove()
    assert checks.problems == [] and out.dtype == torch.float16


class TimeEmbedding(nn.Module):  # hunt30/z3b (Wan's ``temb.float()``): was quiet, stays quiet
    def __init__(self) -> None:
        super().__init__()
        self.t_proj, self.fc = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        freqs = torch.exp(-math.log(10000) * torch.arange(8, dtype=torch.float32, device=t.device) / 8)
        temb = torch.cat([torch.cos(t[:, None].float() * freqs), torch.sin(t[:, None].float() * freqs)], dim=-1)
        return self.fc(x + self.t_proj(temb.float().to(x.dtype))[:, None])


def test_a_float32_timestep_embedding_cast_back_is_quiet() -> None:
    assert torchdoctor.simulate(TimeEmbedding(), INPUTS, device="cpu", dtype=torch.float16).ok


class Attr(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.shift = nn.Linear(16, 16), torch.zeros(16)  # a plain attribute: .to never casts it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.shift


class Factory(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.linspace(0, 1, 16)


class StreamTimesFactory(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x.float()
        h = self.lin(x) + residual * torch.linspace(0, 1, 16)  # the factory's default float32 is no choice
        return h.to(self.lin.weight.dtype)


class Leaks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.out = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x.float()
        return self.out(self.lin(x) + residual)  # never cast back: the float16 layer refuses it


def _found(model: nn.Module) -> Any:
    report = torchdoctor.simulate(model, (torch.randn(2, 16),), device="cpu", dtype=torch.float16)
    assert not report.ok
    return report


def test_real_silent_promotions_are_still_found() -> None:
    [p] = _found(Attr()).problems
    assert (p.kind, p.path, p.found, p.expected) == ("dtype", "shift", "float32", "float16")
    assert "promotes aten.add.Tensor out of float16 into float32: a silent promotion" in p.message
    [p] = _found(Factory()).problems
    assert p.message.startswith("a tensor made by torch.linspace in `<root>` at ") and \
        "(no dtype given: the default float32) float32[16] promotes aten.add.Tensor" in p.message
    report = _found(StreamTimesFactory())
    [p] = report.problems
    assert p.message.startswith("a tensor made from `float()` at ") and "and torch.linspace at " in p.message
    assert "a silent promotion" in p.message and len(report.fixes) == 2


def test_a_deliberate_float32_tensor_a_layer_refuses_is_still_a_problem() -> None:
    [p] = _found(Leaks()).problems
    assert (p.kind, p.path) == ("dtype", "out")
    assert "meets float16 in aten.addmm.default, which refuses the mix" in p.message


RESIDUAL_APP = """
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc = nn.LayerNorm(16), nn.Linear(16, 16)

        def forward(self, x, residual):
            residual = (x + residual) if residual is not None else x
            residual = residual.float()
            return self.fc(self.norm(residual.to(self.norm.weight.dtype))), residual

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks, self.out = nn.ModuleList([Block() for _ in range(2)]), nn.Linear(16, 4)

        def forward(self, h):
            residual = None
            for b in self.blocks:
                h, residual = b(h, residual)
            return self.out((h + residual).to(self.out.weight.dtype))

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Model().to(device, torch.bfloat16)
    print("out", model(torch.randn(2, 5, 16, device=device, dtype=torch.bfloat16)).dtype)
"""


def test_run_with_dtype_is_quiet_on_a_float32_residual(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", RESIDUAL_APP)
    proc = run("--device", "cuda:0", "--dtype", "bf16", "--json", str(script), cwd=tmp_path)
    doc = json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])
    assert proc.returncode == 0 and doc["ok"] and doc["problems"] == [], proc.stdout + proc.stderr
    assert "out torch.bfloat16" in proc.stdout

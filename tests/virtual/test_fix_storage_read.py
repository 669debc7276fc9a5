"""Integer storage read directly by a compute op in the program's own code (unsloth#3337: a GRPO helper multiplies
bf16 hidden states by a bitsandbytes ``Linear8bitLt``'s int8 weight): the stored tensor is named as the program
holds it, at its line, and the fix is to call the layer or dequantize there: never a no-op cast of the bf16 side,
never the activations cast to int8 (issue 41 points 1 and 3, hunt U1). And an EMA copy the program holds apart is
fixed as ``ema.to(...)``, never by ``model.ema...`` lines for a model that has no ``ema`` (hunt T18)."""

from __future__ import annotations

import copy
import functools
import inspect

import bitsandbytes as bnb
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(64, 64)
        self.lm_head = bnb.nn.Linear8bitLt(64, 128, bias=False, has_fp16_weights=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def logits_from_weight(hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
    return torch.matmul(hidden, lm_head.weight.t())


def logits_from_layer(hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
    return lm_head(hidden)


def app(m: Head, logits=logits_from_weight, device: str = "cuda:0") -> torch.Tensor:
    m.to(device)  # Linear8bitLt quantizes its weight on the move
    m.body.to(torch.bfloat16)
    return logits(m(torch.randn(2, 64, device=device, dtype=torch.bfloat16)), m.lm_head)


def test_int8_weight_read_by_matmul_is_named_with_its_fix() -> None:
    r = torchdoctor.simulate(Head(), device="cuda:0", dtype=torch.bfloat16, call=app)
    [p] = r.problems
    assert (p.kind, p.path, p.found, p.expected) == ("dtype", "lm_head.weight", "int8", "bfloat16")
    assert p.message.startswith("lm_head.weight i8[128,64]@cuda:0 (int8 storage of Linear8bitLt) is read directly at "
                                "tests/virtual/test_fix_storage_read.py:")
    [fix] = r.fixes
    assert ": lm_head.weight is int8 storage read directly: call the layer instead (lm_head(x)), or dequantize it " \
           "there (lm_head.weight.to(torch.bfloat16) * its scale" in fix.code
    assert not fix.proven and fix.tried.startswith("not re-run: a dequantization needs the layer's own scale")
    # never the no-op of the hunt (a cast of the bf16 side to bf16), never activations cast to int8
    assert "tensor.to(torch.bfloat16)" not in fix.code and ".to(torch.int8)" not in fix.code
    assert "stopped early: the run ended at tests/virtual/test_fix_storage_read.py:" in str(r)
    # the fix applied (the layer called): the run is quiet
    fixed = torchdoctor.simulate(Head(), device="cuda:0", dtype=torch.bfloat16,
                                 call=functools.partial(app, logits=logits_from_layer))
    assert fixed.ok, str(fixed)


class Packed(nn.Module):
    """A plain module holding uint8 codes and a scale the program dequantizes itself (or forgets to)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("codes", torch.randint(0, 255, (8, 4), dtype=torch.uint8))
        self.register_buffer("scale", torch.full((8, 1), 0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.mark.parametrize("dequantized", [False, True])
def test_uint8_codes_read_in_a_virtual_devices_block(dequantized: bool) -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = Packed().to("cuda:0")
        x = m(torch.ones(2, 4, device="cuda:0"))
        if dequantized:
            F.linear(x, m.codes.to(x.dtype) * m.scale)
        else:
            F.linear(x, m.codes)
    if dequantized:
        assert not sim.problems, [p.message for p in sim.problems]
        return
    [p] = sim.problems
    assert (p.path, p.found) == ("codes", "uint8"), p.message
    code = "\n".join(f.code for f in sim.fixes)
    assert p.message.startswith("codes u8[8,4]@cuda:0 (uint8 storage) is read directly at tests/virtual/")
    assert "m.codes is uint8 storage read directly: dequantize it there (m.codes.to(torch.float32) * its scale" in code
    assert ".to(torch.uint8)" not in code and "tensor.to(torch.float32)" not in code


class Det(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone, self.head = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.backbone(x)))


def ema_app(m: Det, ema_device: str = "cpu") -> torch.Tensor:
    m.to("cuda:0")
    ema = copy.deepcopy(m).to(ema_device).eval().requires_grad_(False)  # NotACracker/COTR#15: kept on cpu
    with torch.no_grad():
        for pe, pm in zip(ema.parameters(), m.parameters()):
            pe.mul_(0.99).add_(pm.detach(), alpha=0.01)
    return ema(torch.randn(2, 8, device="cuda:0"))


def test_an_ema_held_apart_is_fixed_as_the_program_holds_it() -> None:
    r = torchdoctor.simulate(Det(), device="cuda:0", call=ema_app)
    assert any(p.path.startswith("ema.") for p in r.problems)
    codes = [f.code for f in r.fixes]
    at = f"tests/virtual/test_fix_storage_read.py:{inspect.getsourcelines(ema_app)[1] + 2}"
    assert codes == ["ema.to('cuda:0')  # ema.backbone.weight is on cpu; put on cpu by `ema = copy.deepcopy(m)"
                     f".to(ema_device).eval().requires_grad_(False)` at {at}: move it back before it meets tensors on "
                     "cuda:0"]  # the program's line that put it there, its comment left out
    assert not any("model.ema" in c for c in codes)  # Det has no `ema`: such a line raises AttributeError
    # the fix applied where the program makes the copy: quiet
    assert torchdoctor.simulate(Det(), device="cuda:0", call=functools.partial(ema_app, ema_device="cuda:0")).ok

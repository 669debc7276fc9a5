"""What a virtual run's fix must never be (issue 41 point 1), pinned on a ``virtual_devices`` block (the API's own
cases are in test_proof_fixes): a no-op cast (to the dtype a tensor already has), a cast of activations to an
integer or float8 dtype, a model-wide move or cast for a tensor made outside the model. And a tensor computed from
ids the caller made on the cpu is fixed where the ids were made, never by moving the model."""

from __future__ import annotations

import inspect

import numpy as np
import torch
from torch import nn

import torchdoctor


class FloatsInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h = h.float()
        return self.b(h)


def _codes(sim: torchdoctor.VirtualSession) -> str:
    return "\n".join(f.code for f in sim.fixes)


def test_no_recast_of_weights_already_in_the_dtype() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        FloatsInForward().to("cuda:0", torch.bfloat16)(torch.ones(2, 4, device="cuda:0", dtype=torch.bfloat16))
    code = _codes(sim)
    assert "`h = h.float()` casts to float32 where aten.addmm.default computes in bfloat16" in code
    assert "a.weight" not in code and "b.weight" not in code and "model.to(" not in code
    assert [f.proven for f in sim.fixes] == [True]


def test_no_cast_of_activations_to_integer_storage() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = nn.Sequential(nn.Conv3d(2, 2, 1)).half()
        m[0].weight = nn.Parameter(m[0].weight.data.to(torch.uint8), requires_grad=False)
        m.to("cuda:0")(torch.randn(1, 2, 2, 2, 2, device="cuda:0").half())
    code = _codes(sim)
    assert code.startswith("m[0].weight.data = m[0].weight.data.to(torch.float16)")  # the block's own name for it
    assert "torch.uint8" not in code and "input 0" not in code
    assert "# uint8 storage computed with directly: dequantize it (scale included) or load its float16 weights; a " \
           "bare cast keeps the stored integers" in code
    # the bare cast runs, with the stored integers as its values: never said proven
    [fix] = sim.fixes
    assert not fix.proven and "a bare cast of stored integers runs with the integers as values" in fix.tried


def test_no_cast_of_activations_to_float8() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m = nn.Linear(4, 4).to("cuda:0", torch.bfloat16)
        m.weight = nn.Parameter(m.weight.data.to(torch.float8_e4m3fn), requires_grad=False)
        m(torch.ones(2, 4, device="cuda:0", dtype=torch.bfloat16))
    assert sim.problems and all(p.found == "float8_e4m3fn" for p in sim.problems if p.kind == "dtype")
    code = _codes(sim)
    assert "float8" not in code.split("#")[0] and ".to(torch.float8" not in code and "input 0" not in code


def test_no_model_wide_cast_for_a_tensor_outside_the_model() -> None:
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        m = nn.Linear(4, 4).to("mps")
        sigmas = torch.from_numpy(np.linspace(0, 1, 4)).to("mps")  # float64: MPS has none
        m(torch.ones(1, 4, device="mps")) * sigmas[0]
    [p] = sim.problems  # its maker named, though it is a plain cpu tensor made outside any module
    assert p.message.startswith("a tensor made by torch.from_numpy in code outside the model at "
                                "tests/virtual/test_never_fixes.py:")
    code = _codes(sim)
    assert "model.to(" not in code and "torchdoctor.move(model" not in code
    assert "# a float64 tensor made outside the model moves to mps:0, which cannot hold float64: cast that tensor " \
           "to float32 before moving it" in code


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens, self.pos = nn.Embedding(10, 4), nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = (ids > 0).long().cumsum(-1)  # a cast on the way: it keeps the ids' device
        return self.embed_tokens(ids.to(self.embed_tokens.weight.device)) + self.pos(pos)


def _decode(model: Decoder) -> torch.Tensor:
    model.to("cuda:1")
    ids = torch.tensor([[1, 2, 3]])  # made on the cpu: the maker every later problem goes back to
    return model(ids)


def test_a_tensor_computed_from_cpu_ids_is_fixed_where_the_ids_were_made() -> None:
    lines, start = inspect.getsourcelines(_decode)
    made = start + next(i for i, line in enumerate(lines) if "torch.tensor([[1, 2, 3]])" in line)
    report = torchdoctor.simulate(Decoder(), device="cuda:1", call=_decode)
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        _decode(Decoder())
    for problems, fixes in ((report.problems, report.fixes), (sim.problems, sim.fixes)):
        [p] = problems
        assert (p.kind, p.path) == ("device", "pos")
        assert f"ids (an argument of the Decoder call, made by torch.tensor at tests/virtual/test_never_fixes.py:" \
               f"{made})" in p.message
        code = "\n".join(f.code for f in fixes)
        assert code == "# torch.tensor made it on cpu: pass device= (torch.tensor(..., device='cuda:1'))"
        assert [f.proven for f in fixes] == [True] and fixes[0].diff is not None
        assert "+    ids = torch.tensor([[1, 2, 3]], device='cuda:1')" in fixes[0].diff


class Depth(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = torch.from_numpy(np.full(8, 0.5)).to(x.device)  # float64 numpy data: MPS has no float64
        return self.head(x - mean)


def test_a_block_never_casts_a_float32_model_for_float64_made_in_its_forward() -> None:
    # hunt V1: every model tensor is float32 already, so `model.to(torch.float32)` would be a no-op
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        Depth().to("mps")(torch.ones(2, 8, device="mps"))
    code = _codes(sim)
    assert "model.to(" not in code and "torch.from_numpy(...).to(x.dtype)" in code, code
    assert all(f.proven for f in sim.fixes), [(f.code, f.tried) for f in sim.fixes]

"""bitsandbytes' CPU-packed 4-bit layout in a virtual run. On a CPU with AVX512-BF16 the first eval forward repacks a
``Linear4bit`` weight in place (uint8 [out, in/2], ``packing_format_for_cpu``); ``Params4bit.to()`` keeps that layout,
which only the CPU kernel reads, so the model moved to cuda:1 with ``.to`` computes garbage there. The layout is made
here with bitsandbytes' own converter (plain torch ops), so the test runs the same on every CPU."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

import torchdoctor

bnb = pytest.importorskip("bitsandbytes")


def _model(packed: bool) -> nn.Module:
    from bitsandbytes.functional import _convert_weight_packed_for_cpu

    torch.manual_seed(0)
    layer = bnb.nn.Linear4bit(64, 128, compute_dtype=torch.bfloat16, quant_type="nf4")
    layer.load_state_dict(nn.Linear(64, 128).state_dict())
    m = nn.Sequential(OrderedDict(proj=layer.to("cpu"), out=nn.Linear(128, 8))).eval()
    if packed:
        w = m.proj.weight
        w.data, w.quant_state = _convert_weight_packed_for_cpu(w.data, w.quant_state)
    return m


def test_the_portable_layout_simulates_clean() -> None:
    assert torchdoctor.simulate(_model(False), (torch.randn(2, 64),), "cuda:1").ok


def test_the_cpu_packed_layout_on_cuda_is_named_with_the_call_that_unpacks_it() -> None:
    report = torchdoctor.simulate(_model(True), (torch.randn(2, 64),), "cuda:1")
    assert [(p.kind, p.path, p.found) for p in report.problems] == [("quant_incomplete", "proj.weight", "cpu-packed")]
    assert "CPU-packed layout" in report.problems[0].message and "Params4bit.to() keeps it" in report.problems[0].message
    assert "model.cuda(1)" in report.fix and "torchdoctor.move" not in report.fix
    # the repack un-nests the state and leaves ``offset`` behind: nothing reads it, and it is not a problem
    assert not [p for p in report.problems if p.path.endswith("offset")]


def test_scan_of_the_packed_layout_on_cpu_is_quiet_and_move_refuses_another_device() -> None:
    m = _model(True)
    assert torchdoctor.scan(m).ok
    # asked where cuda:1 exists (virtually): the refusal is the layer's, whatever this machine has
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False), \
            pytest.raises(torchdoctor.PlacementError, match="packing_format_for_cpu"):
        torchdoctor.move(m, "cuda:1")


def test_a_4bit_model_moves_with_its_own_to_inside_virtual_devices() -> None:
    """``Module.to`` wraps a moved ``Params4bit`` in ``Parameter(...)``; inside a virtual block that used to end in
    torch's "Creating a Parameter from an instance of type VirtualParams4bit" error."""
    m = _model(False)
    with torchdoctor.virtual_devices("cuda:1") as sim:
        m.to("cuda:1")
        y = m(torch.randn(2, 64, device="cuda:1"))
        assert type(m.proj.weight).__name__.endswith("Params4bit") and m.proj.weight.quant_state is not None
    assert sim.ok, sim.problems
    assert y.device == torch.device("cuda", 1)


def test_scan_inside_a_block_names_the_cpu_packed_layout_moved_to_cuda() -> None:
    m = _model(True)
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False):
        m.to("cuda:1")
        report = torchdoctor.scan(m)
    assert [(p.kind, p.path, p.found, p.expected) for p in report.problems] == [
        ("quant_incomplete", "proj.weight", "cpu-packed", "cuda:1")]
    assert "model.cuda()" in report.problems[0].message

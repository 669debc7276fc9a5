"""A quantized layer streamed to the accelerator and back by ``module.to`` (an app's own offload hooks around each
block): on the device torch assigns ``param.data``, so the ``Params4bit`` / ``Int8Params`` object and its quantization
state go back to the cpu with it. A virtual run must carry the same program to its end: ``Module._apply`` cannot
assign a real tensor into a virtual twin, and ``Parameter(params4bit)`` is refused by torch ("requires that detach()
returns an instance of the same type"), which killed the program in the run while it ran on the machine. The object
the model holds after each move has the attributes the machine's object would have (torch's ``.data`` assignment
keeps the old object's: a tag the program set, Int8Params' ``CB``/``SCB`` as the layer's forward left them)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torchdoctor
from torchdoctor._virtual.tensor import VirtualTensor


def _streamed(layers: nn.ModuleList) -> None:
    def swap_in(m: nn.Module, args: tuple) -> None:
        m.to("cuda")

    def swap_out(m: nn.Module, args: tuple, out: torch.Tensor) -> None:
        m.to("cpu")

    for layer in layers:
        layer.register_forward_pre_hook(swap_in)
        layer.register_forward_hook(swap_out)


@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_a_quantized_layer_streamed_by_module_to_runs_to_its_end(kind: str, bnb_cpu_branch: object) -> None:
    """Both branches of bitsandbytes' per-layer CPU check (the layers are quantized and parked on the cpu)."""
    bnb = __import__("bitsandbytes")
    torch.manual_seed(0)
    if kind == "nf4":
        make = lambda: bnb.nn.Linear4bit(32, 32, bias=False, quant_type="nf4", compute_dtype=torch.float32)  # noqa: E731
    else:
        make = lambda: bnb.nn.Linear8bitLt(32, 32, bias=False, has_fp16_weights=False)  # noqa: E731
    layers = nn.ModuleList([make() for _ in range(2)]).to("cpu")  # quantized on the cpu, as a cpu device map loads
    wclass = type(layers[0].weight)
    for layer in layers:
        layer.weight.tag = "set by the program"  # an attribute of the object, as the library's own ones are
    qmap = dict(bnb.functional.name2qmap)
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as run:
        _streamed(layers)
        x = torch.randn(2, 32, device="cuda", dtype=torch.float32 if kind == "nf4" else torch.float16)
        for _ in range(2):  # two passes: each layer goes cpu -> cuda -> cpu twice
            h = x
            for layer in layers:
                h = layer(h)
            assert isinstance(h, VirtualTensor) and h.device.type == "cuda"
            assert all(layer.weight.tag == "set by the program" for layer in layers)
        w = layers[1].weight
    bnb.functional.name2qmap.clear()
    bnb.functional.name2qmap.update(qmap)
    assert isinstance(w, wclass) and w.device.type == "cpu" and w.tag == "set by the program"
    if kind == "nf4":  # its state went back with it, as Params4bit.to moves it; nothing left behind
        assert w.quant_state.absmax.device.type == "cpu" and w.quant_state.code.device.type == "cpu"
        assert run.problems == []

"""A library's per-process tensor cache filled inside a virtual run (bitsandbytes' quantization map, made on the
run's cuda by the first 4-bit quantization there) must not outlive the run: after it, the process is the CPU
machine again, and a CPU quantization that read the cached map failed with "Torch not compiled with CUDA enabled"
(seen as an order-dependent failure of the 4-bit move tests after a virtual 4-bit test in the same process)."""

from __future__ import annotations

import torch
import torch.nn as nn

import torchdoctor
from torchdoctor._virtual.tensor import VirtualTensor


def test_bitsandbytes_quantization_map_made_in_a_run_is_made_again_after_it() -> None:
    bnb = __import__("bitsandbytes")
    qmap = bnb.functional.name2qmap
    saved = dict(qmap)
    qmap.clear()  # the map is made on the device of the first caller: here, inside the run
    try:
        with torchdoctor.virtual_devices("cuda", raise_on_exit=False):
            model = nn.Sequential(bnb.nn.Linear4bit(16, 16, bias=False, quant_type="nf4",
                                                    compute_dtype=torch.float32)).to("cuda")
            model(torch.randn(2, 16, device="cuda"))
            assert any(isinstance(v, VirtualTensor) for v in qmap.values())  # filled in the run, on its cuda
        assert not any(isinstance(v, VirtualTensor) for v in qmap.values())
        q, state = bnb.functional.quantize_blockwise(torch.randn(256))  # a CPU quantization after the run
        back = bnb.functional.dequantize_blockwise(q, state)
        assert back.device.type == "cpu" and back.shape == (256,)
    finally:
        qmap.clear()
        qmap.update(saved)

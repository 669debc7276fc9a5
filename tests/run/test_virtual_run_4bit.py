"""``torchdoctor run --device cuda:1`` of a program with a bitsandbytes 4-bit layer. bitsandbytes sets
``self.data = w_4bit`` while quantizing; the trace that ``run`` keeps replaces ``Tensor.data`` by a Python property,
and that assignment used to reach a real Params4bit with a virtual tensor's storage-less impl: the interpreter died
with SIGSEGV at the layer's first forward. The run now ends as the program does, on virtual cuda:1."""

from __future__ import annotations

from pathlib import Path

import pytest

from run.test_run_cli import run, write

PROGRAM = """
    import torch
    import bitsandbytes as bnb

    torch.cuda.set_device(1)  # device 0 stays current otherwise, as on real hardware
    layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.float32, quant_type="nf4").to("cuda")
    with torch.no_grad():
        y = layer(torch.randn(2, 64, device="cuda"))
    print("out", tuple(y.shape), y.device, type(layer.weight).__name__, layer.weight.quant_state is not None)
"""


@pytest.mark.parametrize("trace", [True, False], ids=["traced", "untraced"])
def test_a_4bit_layer_runs_under_run_on_a_virtual_gpu(tmp_path: Path, trace: bool) -> None:
    script = write(tmp_path / "app.py", PROGRAM)
    proc = run("--device", "cuda:1", *(() if trace else ("--no-trace",)), str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "out (2, 64) cuda:1 Params4bit True" in proc.stdout
    assert "no placement error" in proc.stderr

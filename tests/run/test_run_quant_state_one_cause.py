"""4-bit layers streamed to the GPU by ``p.data = p.data.to(device)`` swaps leave each weight's quantization state
(absmax, code, the nested state) on the cpu (bitsandbytes #1527): one mover, so one cause, however many layers and
state tensors the run met — said once with how many layers and which parts, every member kept in ``causes``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from support.apps import run_json

pytest.importorskip("bitsandbytes")

APP = """
    import torch, torch.nn as nn, bitsandbytes as bnb

    def swap_in(module, args):
        for p in module.parameters():
            p.data = p.data.to("cuda")

    net = nn.Sequential(*(bnb.nn.Linear4bit(16, 16, compute_dtype=torch.float16, quant_type="nf4") for _ in range(3)))
    net.to("cpu")
    for layer in net:
        layer.register_forward_pre_hook(swap_in)
    with torch.no_grad():
        print(net(torch.randn(2, 16, device="cuda", dtype=torch.float16)).shape)
"""


def test_the_state_of_many_layers_left_by_data_swaps_is_one_cause(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP))
    doc = run_json(app, "cuda")
    state = [p for p in doc["problems"] if p["role"] == "quant_state"]
    assert len(state) >= 6, doc["problems"]  # each layer's absmax and code at least
    [cause] = [c for c in doc["causes"] if "quant_state" in c["path"]]
    assert cause["message"].startswith("the quantization state (") and "of 3 Linear4bit layers is on cpu" in \
        cause["message"], cause["message"]
    assert sorted(cause["problems"]) == sorted(p["path"] for p in state)

"""``images.cpu().numpy()`` of a bfloat16 output raises "TypeError: Got unsupported ScalarType BFloat16" (numpy has
no bfloat16): a virtual run reports it at that line, names the tensor as the line does, and its fix casts it there
first, never the no-op cast to the dtype it already has."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import torchdoctor


def save(images: torch.Tensor) -> np.ndarray:
    return (255.0 * images.cpu().numpy()).clip(0, 255).astype(np.uint8)


@torch.inference_mode()
def app(m: nn.Module) -> np.ndarray:
    m.to("cuda:0", torch.bfloat16)
    images = torch.sigmoid(m(torch.randn(1, 8, device="cuda:0", dtype=torch.bfloat16)))
    return save(images)


@torch.inference_mode()
def app_ok(m: nn.Module) -> np.ndarray:
    m.to("cuda:0", torch.bfloat16)
    images = torch.sigmoid(m(torch.randn(1, 8, device="cuda:0", dtype=torch.bfloat16)))
    return (255.0 * images.float().cpu().numpy()).astype(np.uint8)


def test_numpy_of_bfloat16_is_reported_at_its_line_with_the_cast_first() -> None:
    report = torchdoctor.simulate(nn.Linear(8, 12), device="cuda:0", dtype=torch.bfloat16, call=app)
    assert len(report.problems) == 1
    p = report.problems[0]
    assert p.kind == "dtype" and p.found == "bfloat16" and p.expected == "float32" and p.op == "Tensor.numpy"
    assert p.message.startswith("images bf16[1,12]@cuda:0 .numpy() at ") and "test_numpy_bf16.py:15:" in p.message
    assert "numpy has no bfloat16 (TypeError: Got unsupported ScalarType BFloat16)" in p.message
    assert p.message.endswith("cast it first: images.float().cpu().numpy()")
    assert "tensor.to(torch.bfloat16)" not in str(report)  # never the no-op


def test_numpy_after_a_float_cast_is_quiet() -> None:
    assert torchdoctor.simulate(nn.Linear(8, 12), device="cuda:0", dtype=torch.bfloat16, call=app_ok).ok

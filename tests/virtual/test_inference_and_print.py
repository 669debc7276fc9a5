"""A program under ``torch.inference_mode()`` and a program that prints its tensors, in a virtual run.

- Slicing a tensor moved to the device before an ``inference_mode`` block (``mask[:, -1]``, what transformers'
  ``generate`` does with an attention mask inside ``inference_mode``) raised ``Cannot set version_counter for
  inference tensor`` from the run itself: autograd sets a view's version counter from its base, and the view's
  wrapper was made as an inference tensor. A view of a normal tensor is a normal tensor in torch too; the run makes
  it so. In-place writes into a normal tensor, views of inference tensors and copies behave as on the machine.
- A virtual tensor that holds values prints as torch prints a tensor on that device (``tensor([1, 1],
  device='cuda:0')``), with its dtype, grad_fn or requires_grad, so a program's own output reads as on the hardware.
"""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def test_views_and_writes_under_inference_mode_run_as_on_the_machine() -> None:
    with torchdoctor.virtual_devices("cuda:0") as session:
        m = nn.Linear(4, 4).to("cuda")
        mask = torch.tensor([[0, 1, 1], [1, 1, 1]]).to("cuda")
        cache = torch.zeros(2, 8, 4, device="cuda")
        with torch.inference_mode():
            last = mask[:, -1]
            y = m(torch.randn(2, 3, 4, device="cuda"))
            cache[:, :3] = y
            cache[:, 1:4].mul_(2)
            joined = torch.cat([y[:, 0], cache[:, 0]], 0).transpose(0, 1).reshape(-1)
        assert str(last.device) == "cuda:0" and last.tolist() == [1, 1]
        assert not last.is_inference()  # a view of a normal tensor, as in torch
        assert joined.shape == (16,) and float(cache.abs().sum()) > 0
    assert session.ok, session.problems


def test_a_virtual_tensor_prints_as_torch_prints_one_on_that_device() -> None:
    with torchdoctor.virtual_devices("cuda:0"):
        a = torch.tensor([[0, 1, 1], [1, 1, 1]]).to("cuda")
        lin = nn.Linear(2, 2).to("cuda")
        out = lin(torch.ones(1, 2, device="cuda"))
        assert repr(a[:, -1]) == "tensor([1, 1], device='cuda:0')"
        assert str(a.half()[0]) == "tensor([0., 1., 1.], device='cuda:0', dtype=torch.float16)"
        assert repr(out).endswith(", device='cuda:0', grad_fn=<AddmmBackward0>)"), repr(out)
        assert repr(lin.weight).endswith(", device='cuda:0', requires_grad=True)"), repr(lin.weight)
        assert repr(torch.empty(0, 3, device="cuda")) == "tensor([], device='cuda:0', size=(0, 3))"

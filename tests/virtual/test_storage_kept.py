"""A verb's own cast (``simulate(dtype=)``, the CLI's ``--dtype``) keeps float8 storage: inside
``storage.kept()`` the run's ``Module.to(device, bfloat16)`` casts the floating compute tensors (an fp32 scale)
and leaves float8 weights float8; a program's own ``.to(bfloat16)`` outside it casts them, as torch does."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor
from torchdoctor._virtual.storage import kept


def fp8_linear() -> nn.Linear:
    m = nn.Linear(8, 4)
    m.weight.data = m.weight.data.to(torch.float8_e4m3fn)
    m.register_buffer("scale", torch.ones(1))  # float32: a compute tensor
    m.register_buffer("codes", torch.zeros(4, dtype=torch.uint8))  # integer storage
    return m


def test_the_verbs_own_cast_keeps_float8_storage() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False):
        m = fp8_linear()
        with kept():
            m.to("cuda:0", torch.bfloat16)
        w = m.weight.to(m.scale.dtype) * m.scale  # after the cast: the program's own per-call dequantization
        assert (m.weight.dtype, m.scale.dtype, m.codes.dtype) == (torch.float8_e4m3fn, torch.bfloat16, torch.uint8)
        assert str(m.weight.device) == "cuda:0" and w.dtype == torch.bfloat16


def test_a_programs_own_cast_is_torchs() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False):
        m = fp8_linear().to("cuda:0", torch.bfloat16)
        assert (m.weight.dtype, m.scale.dtype) == (torch.bfloat16, torch.bfloat16)

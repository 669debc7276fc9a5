"""In-place ops that change a tensor's shape (``transpose_``, ``unsqueeze_``, ``resize_`` ...) give the virtual tensor
the program holds the shape and strides the real tensor gets: ``nn.GRU`` / ``nn.RNN`` with ``batch_first=True`` end
with ``output.transpose_(0, 1)``, and a correct program must not fail on virtual devices (hunt 29, c01)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torchdoctor

_OPS = {
    "transpose_": lambda x: x.transpose_(0, 1),
    "t_": lambda x: x[0].t_(),
    "unsqueeze_": lambda x: x.unsqueeze_(0),
    "squeeze_": lambda x: x[:1].squeeze_(0),
    "swapdims_": lambda x: x.swapdims_(0, 2),
    "as_strided_": lambda x: x.as_strided_((4,), (1,)),
    "resize_ smaller": lambda x: x.resize_(3, 4),
    "resize_ larger": lambda x: x.resize_(30, 40),
}


@pytest.mark.parametrize("data", ["cpu", "meta"])
@pytest.mark.parametrize("name", list(_OPS))
def test_inplace_reshape_gives_the_real_shape(name: str, data: str) -> None:
    op = _OPS[name]
    want = op(torch.randn(2, 5, 8))
    with torchdoctor.virtual_devices("cuda:0", data=data) as sim:
        x = torch.randn(2, 5, 8, device="cuda")
        got = op(x)
        assert (tuple(got.shape), got.stride()) == (tuple(want.shape), want.stride())
        assert got.device == torch.device("cuda:0")
        if name.startswith(("transpose_", "unsqueeze_", "swapdims_", "as_strided_", "resize_")):
            assert got is x  # the program's own tensor changed, as on the device
    assert not sim.problems


@pytest.mark.parametrize("cls", [nn.GRU, nn.RNN, nn.LSTM])
def test_batch_first_rnn_trains_on_a_virtual_device(cls: type) -> None:
    torch.manual_seed(0)
    rnn, head = cls(8, 8, batch_first=True), nn.Linear(8, 3)
    x = torch.randn(2, 5, 8)
    real_out = rnn(x)[0]
    real = head(real_out)
    with torchdoctor.virtual_devices("cuda:1") as sim:
        rnn.to("cuda:1"), head.to("cuda:1")
        out, _ = rnn(x.to("cuda:1"))
        assert out.shape == real_out.shape and out.stride() == real_out.stride()
        y = head(out)
        assert y.shape == real.shape and y.device == torch.device("cuda:1")
        y.float().pow(2).mean().backward()
        assert rnn.weight_ih_l0.grad is not None and rnn.weight_ih_l0.grad.shape == rnn.weight_ih_l0.shape
    assert not sim.problems

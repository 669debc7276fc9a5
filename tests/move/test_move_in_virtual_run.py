"""``torchdoctor.move`` inside a ``virtual_devices`` block moves what it moves on the device: parameters with their
grads, buffers, views of one storage and the optimizer's state, as the same objects. After a step the model's
storages were read through the run's function mode, which made a new one per read, so unrelated tensors seemed to
share one and the move left the model half-moved (grads on the target, parameters behind); views of one storage
were rebuilt on the virtual tensor's inner storage and left behind."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))


def _step(model: nn.Module, opt: torch.optim.Optimizer, device: str) -> float:
    x = torch.randn(8, 4).to(device)  # drawn on the cpu: the same numbers on both
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()
    opt.step()
    return float(loss.detach().cpu())


def _moved_after_a_step(target: str) -> tuple[list[float], nn.Module, list[nn.Parameter], torch.optim.Optimizer]:
    model = _model()
    held = list(model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = [_step(model, opt, "cpu")]  # grads and Adam state exist on the cpu
    torchdoctor.move(model, target)
    for _ in range(3):
        opt.zero_grad()
        losses.append(_step(model, opt, target))
    return losses, model, held, opt


def test_a_model_with_grads_and_optimizer_state_moves_whole_in_a_virtual_run() -> None:
    torch.manual_seed(1)
    want, _, _, _ = _moved_after_a_step("cpu")
    torch.manual_seed(1)
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        got, model, held, opt = _moved_after_a_step("cuda:1")
        held_devices = {str(p.device) for p in held}  # the objects the program held before the move
        held[0].requires_grad_(False)
        devices = {str(t.device) for t in [*model.parameters(), *model.buffers()]}
        grads = {str(p.grad.device) for p in model.parameters() if p.grad is not None}
        state = {str(v.device) for s in opt.state.values() for k, v in s.items()
                 if torch.is_tensor(v) and k != "step"}
    assert sim.problems == [], [p.message for p in sim.problems]
    assert devices == grads == state == {"cuda:1"}
    # on the device they are the model's Parameters (move keeps them); here what is done with them reaches those
    assert held_devices == {"cuda:1"}
    assert [p.requires_grad for p in model.parameters()][:2] == [False, True]
    assert [round(v, 4) for v in got] == [round(v, 4) for v in want]


def test_views_of_one_storage_move_together_in_a_virtual_run() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(8, 4)
            self.head = nn.Linear(4, 8, bias=False)
            self.head.weight = self.emb.weight
            self.register_buffer("both", torch.zeros(6))
            self.register_buffer("tail", self.both[3:])
            self.head_part = self.both[:3]  # a plain attribute Module.to never moves

    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        m = Tied()
        m.head(m.emb(torch.tensor([1, 2]))).sum().backward()
        torchdoctor.move(m, "cuda:1")
        with torch.no_grad():
            m.both.fill_(2)
        sums = float(m.head_part.sum().cpu()), float(m.tail.sum().cpu())
        devices = {str(t.device) for t in (m.emb.weight, m.emb.weight.grad, m.both, m.tail, m.head_part)}
    assert sim.problems == []
    assert m.head.weight is m.emb.weight
    assert devices == {"cuda:1"}
    assert sums == (6.0, 6.0)  # still views of one storage


def test_an_optimizer_of_another_model_is_refused_before_anything_moves() -> None:
    import pytest

    model, other = nn.Linear(2, 2), nn.Linear(2, 2)
    opt = torch.optim.Adam(other.parameters())
    with pytest.raises(ValueError, match="optimizer=Adam holds none of the parameters of the Linear moved"):
        torchdoctor.move(model, dtype=torch.float64, optimizer=opt)
    assert model.weight.dtype == torch.float32  # nothing moved
    torchdoctor.move(other, dtype=torch.float64, optimizer=opt)  # its own model: moved
    assert other.weight.dtype == torch.float64

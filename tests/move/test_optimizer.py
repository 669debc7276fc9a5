"""``move(model, ..., optimizer=opt)``: optimizer state follows its parameters, is verified, and rolls back with them.

``Module.to`` never touches an optimizer: after ``model.double()`` Adam's state stays float32 and the next ``step()``
raises. These tests run real optimizers (torch's and bitsandbytes' 8-bit Adam, whose CPU path this machine runs).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor import PlacementError


def _trained(opt_cls: type = torch.optim.Adam, **kw: object) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    opt = opt_cls(m.parameters(), lr=1e-3, **kw)
    m(torch.randn(4, 8)).sum().backward()
    opt.step()
    return m, opt


def _step(m: nn.Module, opt: torch.optim.Optimizer, dtype: torch.dtype) -> None:
    opt.zero_grad()
    m(torch.randn(4, 8, dtype=dtype)).sum().backward()
    opt.step()


def test_module_to_leaves_adam_state_behind_and_step_fails() -> None:
    """The failure this exists for, on the real torch: state left float32 under float64 parameters."""
    m, opt = _trained()
    m.double()
    with pytest.raises(RuntimeError, match="(?i)dtype|float"):
        _step(m, opt, torch.float64)


def test_optimizer_none_leaves_the_state_as_module_to_does() -> None:
    m, opt = _trained()
    report = torchdoctor.move(m, dtype=torch.float64, optimizer=None)
    assert report.optimizers == () and not [r for r in report.moved if r.path.startswith("optimizer")]
    with pytest.raises(RuntimeError, match="(?i)dtype|float"):
        _step(m, opt, torch.float64)


def test_adam_state_follows_a_cast_and_step_runs() -> None:
    m, opt = _trained()
    report = torchdoctor.move(m, dtype=torch.float64, optimizer=opt)
    paths = [r.path for r in report.moved]
    assert "optimizer.state[0.weight].exp_avg" in paths and "optimizer.state[2.bias].exp_avg_sq" in paths
    state = opt.state[m[0].weight]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float64
    assert state["step"].dtype == torch.float32  # torch keeps a plain optimizer's step counter as it is
    _step(m, opt, torch.float64)
    # what Module.to would have missed, the state folded into one line (the JSON keeps every row)
    assert "  optimizer.state  12 tensor(s)  f32@cpu -> f64@cpu" in str(report).splitlines()
    assert "optimizer.state[0.weight].exp_avg" in report.to_dict()["missed_by_module_to"]


def test_state_follows_a_device_move_step_stays_on_cpu() -> None:
    m, opt = _trained(torch.optim.SGD, momentum=0.9)
    torchdoctor.move(m, "meta", optimizer=opt)
    buf = opt.state[m[0].weight]["momentum_buffer"]
    assert buf.device.type == "meta" and buf.dtype == torch.float32


def test_capturable_adam_keeps_step_on_the_parameter_device_in_float32() -> None:
    m, opt = _trained()
    opt.param_groups[0]["capturable"] = True  # (a capturable Adam cannot step on cpu; its state has the same form)
    torchdoctor.move(m, "meta", torch.float64, optimizer=opt)
    state = opt.state[m[0].weight]
    assert state["step"].device.type == "meta" and state["step"].dtype == torch.float32
    assert state["exp_avg"].device.type == "meta" and state["exp_avg"].dtype == torch.float64


def test_state_kept_apart_on_purpose_stays() -> None:
    """fp32 master state of bf16 parameters (mixed-precision training) keeps float32 after a cast to float16."""
    m, opt = _trained()
    torchdoctor.move(m, dtype=torch.bfloat16, optimizer=None)  # None: the optimizer is left alone (not looked for)
    for state in opt.state.values():  # the optimizer keeps float32 moments on purpose
        assert state["exp_avg"].dtype == torch.float32
    report = torchdoctor.move(m, dtype=torch.float16, optimizer=opt)
    assert not [r for r in report.moved if r.path.startswith("optimizer")]
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())


def test_several_optimizers_are_named_by_index() -> None:
    m, opt = _trained()
    head = list(m[2].parameters())
    opt2 = torch.optim.SGD(head, lr=0.1, momentum=0.9)
    m(torch.randn(4, 8)).sum().backward()
    opt2.step()
    report = torchdoctor.move(m, dtype=torch.float64, optimizer=[opt, opt2])
    paths = [r.path for r in report.moved]
    assert "optimizer[0].state[0.weight].exp_avg" in paths
    assert "optimizer[1].state[2.weight].momentum_buffer" in paths
    assert opt2.state[m[2].weight]["momentum_buffer"].dtype == torch.float64


def test_bitsandbytes_8bit_state_is_moved_never_cast() -> None:
    """bitsandbytes declares ``non_castable_tensor_keys``: its uint8 state and fp32 qmap/absmax keep their dtype."""
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64))
    opt = bnb.optim.Adam8bit(m.parameters(), lr=1e-3, min_8bit_size=16)
    m(torch.randn(2, 64)).sum().backward()
    opt.step()
    before = {k: v.dtype for k, v in opt.state[m[0].weight].items() if isinstance(v, torch.Tensor)}
    assert before["state1"] == torch.uint8 and before["qmap1"] == torch.float32
    torchdoctor.move(m, dtype=torch.bfloat16, optimizer=opt)
    after = {k: v.dtype for k, v in opt.state[m[0].weight].items() if isinstance(v, torch.Tensor)}
    assert after == before


class _Breaks(dict):  # type: ignore[type-arg]
    """A parameter's state dict that refuses its second write: the move fails part-way through the optimizer."""

    def __init__(self, items: dict, exc: BaseException) -> None:  # type: ignore[type-arg]
        super().__init__(items)
        self.exc, self.writes = exc, 0

    def __setitem__(self, key: object, value: object) -> None:
        self.writes += 1
        if self.writes == 2:
            raise self.exc
        super().__setitem__(key, value)


@pytest.mark.parametrize("rollback", ["auto", "exact"])
@pytest.mark.parametrize("exc", [RuntimeError("injected fault"), KeyboardInterrupt()], ids=["error", "interrupt"])
@pytest.mark.parametrize("to", [{"dtype": torch.float64}, {"device": "meta"}], ids=["cast", "meta"])
def test_a_failure_in_the_optimizer_rolls_back_model_and_state(rollback: str, exc: BaseException,
                                                                 to: dict) -> None:  # type: ignore[type-arg]
    """A move to meta replaces the Parameters (``.data =`` cannot cross to meta): the optimizer is pointed at the
    new ones, and back at the originals by the rollback."""
    m, opt = _trained()
    params = list(m.parameters())
    w = m[2].weight
    opt.state[w] = _Breaks(opt.state[w], exc)
    snap = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    objs = {id(p): dict(s) for p, s in opt.state.items()}
    with pytest.raises((PlacementError, KeyboardInterrupt)) as info:
        torchdoctor.move(m, **to, optimizer=opt, rollback=rollback)
    assert list(m.parameters()) == params and opt.param_groups[0]["params"] == params
    assert "optimizer.state[2.weight]" in str(info.value) or "torchdoctor" in "".join(
        getattr(info.value, "__notes__", []))
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in m.parameters())
    for p, s in opt.state.items():
        for k, v in s.items():
            assert v.dtype == snap[id(p)][k].dtype and torch.equal(v, snap[id(p)][k]), k
            if rollback == "exact":
                assert v is objs[id(p)][k]
    _step(m, opt, torch.float32)  # the optimizer still works with the rolled-back model


def test_parameters_replaced_by_a_move_to_meta_are_the_optimizers_new_parameters() -> None:
    m, opt = _trained()
    torchdoctor.move(m, "meta", optimizer=opt)
    assert opt.param_groups[0]["params"] == list(m.parameters())
    assert set(opt.state) == set(m.parameters())


def test_bad_optimizer_argument_is_one_clear_error() -> None:
    m, opt = _trained()
    with pytest.raises(TypeError, match=r"optimizer\[1\] must be a torch.optim.Optimizer .*not int"):
        torchdoctor.move(m, dtype=torch.float64, optimizer=[opt, 3])
    assert all(p.dtype == torch.float32 for p in m.parameters())

"""``move(model, ...)`` without ``optimizer=`` finds the optimizers that hold the model's parameters (issue 39 point 9).

Real torch optimizers after real steps: the move casts or moves their state with the parameters, the next ``step()``
runs, the report names each optimizer, a failing move rolls the state back too, and a model nobody else holds costs
no search (the debug log says which search ran).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor import PlacementError
from torchdoctor._move.plan import HeldBy
from move.test_optimizer import _Breaks

LOG = "torchdoctor.move"


def _trained(opt_cls: type = torch.optim.Adam, steps: int = 3, **kw: Any) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    opt = opt_cls(m.parameters(), lr=1e-2, **kw)
    for _ in range(steps):
        _step(m, opt, torch.float32)
    return m, opt


def _step(m: nn.Module, opt: Any, dtype: torch.dtype) -> None:
    opt.zero_grad()
    m(torch.randn(4, 8, dtype=dtype)).sum().backward()
    opt.step()


def _state_dtypes(opt: Any) -> set[torch.dtype]:
    return {v.dtype for s in opt.state.values() for k, v in s.items() if isinstance(v, torch.Tensor) and k != "step"}


def _searches(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("optimizer search")]


@pytest.mark.parametrize("opt_cls,kw,keys", [
    (torch.optim.Adam, {}, {"exp_avg", "exp_avg_sq"}),
    (torch.optim.AdamW, {"weight_decay": 0.1}, {"exp_avg", "exp_avg_sq"}),
    (torch.optim.SGD, {"momentum": 0.9}, {"momentum_buffer"}),
], ids=["Adam", "AdamW", "SGD-momentum"])
def test_a_cast_without_optimizer_moves_the_state_and_step_runs(opt_cls: type, kw: dict[str, Any], keys: set[str],
                                                               caplog: pytest.LogCaptureFixture) -> None:
    m, opt = _trained(opt_cls, **kw)
    caplog.set_level(logging.DEBUG, LOG)
    report = torchdoctor.move(m, dtype=torch.float64)
    assert _state_dtypes(opt) == {torch.float64}
    assert report.optimizers == (HeldBy(opt_cls.__name__, "optimizer", 6, 6 * len(keys), True),)
    assert (f"optimizer {opt_cls.__name__} holds 6 of these parameters (found by move); its state was moved with "
            f"them ({6 * len(keys)} tensor(s))") in str(report)
    assert report.to_dict()["optimizers"][0]["name"] == opt_cls.__name__
    assert {r.path.rsplit(".", 1)[1] for r in report.moved if r.path.startswith("optimizer.")} == keys
    assert _searches(caplog) and "in the caller's frames" in _searches(caplog)[0]  # no pass over the heap
    before = m[0].weight.detach().clone()
    _step(m, opt, torch.float64)  # Module.to leaves this raising (test_optimizer.py pins that)
    assert not torch.equal(before, m[0].weight)


def test_a_model_nobody_else_holds_costs_no_search(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    m.tied = m[0].weight  # a second slot of the same parameter is still the model's own
    caplog.set_level(logging.DEBUG, LOG)
    report = torchdoctor.move(m, dtype=torch.float64)
    assert report.optimizers == () and report.notes == ()
    assert _searches(caplog) == []
    assert "optimizer" not in str(report)


def test_a_list_of_parameters_alone_is_searched_and_nothing_is_named(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    m = nn.Linear(4, 4)
    params = list(m.parameters())  # held elsewhere, by no optimizer
    caplog.set_level(logging.DEBUG, LOG)
    report = torchdoctor.move(m, dtype=torch.float64)
    assert report.optimizers == () and report.notes == ()
    assert "0 optimizer(s) found after a pass over every tracked object" in _searches(caplog)[0]
    assert params[0] is m.weight and m.weight.dtype == torch.float64


class _Box:
    pass


_REGISTRY: dict[str, Any] = {}


def _hide(opt: Any) -> None:
    """An optimizer the caller's frames cannot reach within two levels: only the GC pass finds it."""
    box = _Box()
    box.inner = [[opt]]
    _REGISTRY["deep"] = {"levels": [box]}


def test_an_optimizer_out_of_the_frames_reach_is_found_by_the_gc_pass(caplog: pytest.LogCaptureFixture) -> None:
    m, opt = _trained()
    _hide(opt)
    del opt
    caplog.set_level(logging.DEBUG, LOG)
    try:
        report = torchdoctor.move(m, dtype=torch.float64)
        opt = _REGISTRY["deep"]["levels"][0].inner[0][0]
        assert [o.name for o in report.optimizers] == ["Adam"]
        assert "1 optimizer(s) found after a pass over every tracked object" in _searches(caplog)[0]
        _step(m, opt, torch.float64)
    finally:
        _REGISTRY.clear()


def test_a_device_move_to_meta_points_the_found_optimizer_at_the_new_parameters() -> None:
    m, opt = _trained(torch.optim.SGD, momentum=0.9)
    report = torchdoctor.move(m, "meta")
    assert opt.param_groups[0]["params"] == list(m.parameters())
    assert set(opt.state) == set(m.parameters())
    assert all(s["momentum_buffer"].device.type == "meta" for s in opt.state.values())
    assert report.optimizers[0].params == 6 and report.optimizers[0].moved == 6


def test_two_optimizers_are_both_found_and_named_by_index() -> None:
    m, opt = _trained()
    head = torch.optim.SGD(m[2].parameters(), lr=0.1, momentum=0.9)
    _step(m, head, torch.float32)
    report = torchdoctor.move(m, dtype=torch.float64)
    assert sorted((o.name, o.params) for o in report.optimizers) == [("Adam", 6), ("SGD", 2)]
    assert {o.path for o in report.optimizers} == {"optimizer[0]", "optimizer[1]"}
    _step(m, opt, torch.float64)
    _step(m, head, torch.float64)


def test_an_optimizer_with_no_state_yet_is_named_and_left_as_it_is() -> None:
    torch.manual_seed(0)
    m = nn.Linear(4, 4)
    opt = torch.optim.Adam(m.parameters())
    report = torchdoctor.move(m, dtype=torch.float64)
    assert report.optimizers[0].moved == 0
    assert "its state stays as it was (none yet, or kept apart on purpose)" in str(report)
    opt.zero_grad()
    m(torch.randn(2, 4, dtype=torch.float64)).sum().backward()
    opt.step()  # Adam makes its state now, from the float64 parameters
    assert _state_dtypes(opt) == {torch.float64}


def test_optimizer_none_touches_no_optimizer() -> None:
    m, opt = _trained()
    report = torchdoctor.move(m, dtype=torch.float64, optimizer=None)
    assert report.optimizers == ()
    assert _state_dtypes(opt) == {torch.float32}


def test_an_lr_scheduler_keeps_scheduling_and_its_optimizer_is_found_through_it(
        caplog: pytest.LogCaptureFixture) -> None:
    m, opt = _trained()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    del opt  # only the scheduler holds it now: one level down from the frame
    caplog.set_level(logging.DEBUG, LOG)
    report = torchdoctor.move(m, dtype=torch.float64)
    assert "in the caller's frames" in _searches(caplog)[0]
    assert report.optimizers[0].name == "Adam"
    lrs = []
    for _ in range(3):
        _step(m, sched.optimizer, torch.float64)
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    assert lrs == pytest.approx([5e-3, 2.5e-3, 1.25e-3])


@pytest.mark.parametrize("rollback", ["auto", "exact"])
@pytest.mark.parametrize("to", [{"dtype": torch.float64}, {"device": "meta"}], ids=["cast", "meta"])
@pytest.mark.parametrize("exc", [RuntimeError("injected fault"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_a_failing_move_rolls_the_found_optimizer_back_too(rollback: str, to: dict[str, Any],
                                                          exc: BaseException) -> None:
    """The fault comes after every model tensor moved, inside the optimizer move found: all of it comes back."""
    m, opt = _trained()
    params = list(m.parameters())
    w = m[2].weight
    opt.state[w] = _Breaks(opt.state[w], exc)
    snap = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    with pytest.raises((PlacementError, KeyboardInterrupt)) as info:
        torchdoctor.move(m, **to, rollback=rollback)
    text = str(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert "move failed at optimizer.state[2.weight].exp_avg_sq after 15 tensor(s)" in text
    assert "rolled back: the object is as before" in text
    assert list(m.parameters()) == params and opt.param_groups[0]["params"] == params
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in m.parameters())
    for p, s in opt.state.items():
        for k, v in s.items():
            assert v.dtype == snap[id(p)][k].dtype and torch.equal(v, snap[id(p)][k]), k
    opt.state[w] = dict(opt.state[w])
    _step(m, opt, torch.float32)


def test_an_optimizer_whose_state_cannot_be_read_is_named_and_the_move_goes_on() -> None:
    class Opaque(torch.optim.SGD):
        @property
        def param_groups(self) -> Any:
            raise RuntimeError("groups are remote")

        @param_groups.setter
        def param_groups(self, value: Any) -> None:
            pass

    m, opt = _trained()
    weird = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    weird.__class__ = Opaque  # built as a plain SGD: its own __init__ reads its groups
    report = torchdoctor.move(m, dtype=torch.float64)
    assert report.notes == ("could not look for optimizers holding these parameters (Opaque: RuntimeError: groups "
                            "are remote): pass move(obj, ..., optimizer=opt) to move an optimizer's state with them",)
    assert str(report).endswith(report.notes[0])
    assert [o.name for o in report.optimizers] == ["Adam"]  # what could be read was still found and moved
    _step(m, opt, torch.float64)
    del weird


def test_bitsandbytes_8bit_adam_is_found_and_its_state_moved_never_cast() -> None:
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64))
    opt = bnb.optim.Adam8bit(m.parameters(), lr=1e-3, min_8bit_size=16)
    m(torch.randn(2, 64)).sum().backward()
    opt.step()
    before = {k: v.dtype for k, v in opt.state[m[0].weight].items() if isinstance(v, torch.Tensor)}
    report = torchdoctor.move(m, "meta")
    assert [o.name for o in report.optimizers] == ["Adam8bit"]
    after = opt.state[m[0].weight]
    assert {k: v.dtype for k, v in after.items() if isinstance(v, torch.Tensor)} == before
    assert after["state1"].device.type == "meta" and after["state1"].dtype == torch.uint8


def test_an_accelerate_wrapper_and_its_optimizer_count_once() -> None:
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState

    m, opt = _trained()
    AcceleratorState._reset_state(True)  # a test before may have left one (e.g. a training app run with accelerate)
    try:
        wrapped = accelerate.Accelerator(cpu=True).prepare_optimizer(opt)
        assert wrapped.state is opt.state  # the wrapper shares its optimizer's state
        report = torchdoctor.move(m, dtype=torch.float64)
        assert [(o.name, o.moved) for o in report.optimizers] in ([("Adam", 12)], [("AcceleratedOptimizer", 12)])
        _step(m, wrapped, torch.float64)
    finally:  # the accelerator's state is process-wide
        AcceleratorState._reset_state(True)
        GradientState._reset_state()


@pytest.mark.parametrize("name", ["gpt2", "llama_lora", "unet_lora", "t5", "sd_pipeline"])
def test_real_models_nobody_else_holds_cost_no_search(name: str, caplog: pytest.LogCaptureFixture) -> None:
    """The reference count that decides "held elsewhere" is exact on real models: tied weights (GPT-2), peft
    adapters, ``_keep_in_fp32_modules`` (T5), a pipeline; then with an optimizer the same model is searched."""
    from tests.support import zoo

    obj = zoo.build(name).obj
    caplog.set_level(logging.DEBUG, LOG)
    torchdoctor.move(obj, dtype=torch.float64)
    assert _searches(caplog) == []
    module = obj.unet if name == "sd_pipeline" else obj
    opt = torch.optim.SGD(module.parameters(), lr=0.1)  # frozen base weights too: the adapters may not move
    report = torchdoctor.move(obj, dtype=torch.float32)
    assert [o.name for o in report.optimizers] == ["SGD"] and "in the caller's frames" in _searches(caplog)[0]
    del opt


def test_bitsandbytes_8bit_adam_is_found_and_steps_after_a_cast() -> None:
    """A cast leaves 8-bit state as it is (its dtype is the optimizer's, not the parameter's) and step() runs."""
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64))
    opt = bnb.optim.Adam8bit(m.parameters(), lr=1e-3, min_8bit_size=16)
    for _ in range(2):
        opt.zero_grad()
        m(torch.randn(2, 64)).sum().backward()
        opt.step()
    state = {k: v for k, v in opt.state[m[0].weight].items() if isinstance(v, torch.Tensor)}
    report = torchdoctor.move(m, dtype=torch.bfloat16)
    assert report.optimizers == (HeldBy("Adam8bit", "optimizer", 2, 0, True),)
    assert all(opt.state[m[0].weight][k] is v for k, v in state.items())
    before = m[0].weight.detach().clone()
    opt.zero_grad()
    m(torch.randn(2, 64, dtype=torch.bfloat16)).sum().backward()
    opt.step()
    assert m[0].weight.dtype == torch.bfloat16 and not torch.equal(before, m[0].weight)

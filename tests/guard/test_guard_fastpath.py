"""strict's module-boundary gate (``_guard/fastpath.py``): the dispatch mode only inside modules whose tensors
disagree, around the model's code and through a suspect module's backward; the same reports as strict on every
op where it checks, and torch's own error explained where it does not."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from support import zoo
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import torchdoctor
from torchdoctor import PlacementError
from torchdoctor._guard import fastpath
from torchdoctor._guard.dispatch import CheckMode

BF = torch.bfloat16
SCALAR = torch.tensor(2.0, dtype=torch.float64)  # a 0-dim fp64 attribute: suspect at the boundary, legal per op


def checking() -> bool:
    return any(isinstance(m, CheckMode) for m in _get_current_dispatch_mode_stack())


def around() -> bool:
    """The code around the model is checked: by the first stage (calls whose tensors disagree run under the
    dispatch mode: ``_guard/aftergrad.py``), ready, and not the dispatch mode on every op."""
    from torch.overrides import _get_current_function_mode_stack

    from torchdoctor._guard.aftergrad import AfterBackward

    return not checking() and any(isinstance(m, AfterBackward) and m.ready for m in _get_current_function_mode_stack())


class Probe(nn.Module):
    """Records whether strict's dispatch mode is on while its forward runs."""

    def __init__(self, log: list[bool], extra: torch.Tensor | None = None) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.extra = extra
        self.log = log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append(checking())
        y = self.lin(x)
        return y * self.extra if self.extra is not None else y


def test_odd_compares_devices_and_floating_dtypes_only() -> None:
    f32, i64 = torch.ones(2), torch.ones(2, dtype=torch.int64)
    assert not fastpath.odd([f32, i64, None, 3, "x", torch.ones(3)])
    assert fastpath.odd([f32, f32.to(BF)])
    assert fastpath.odd([f32, torch.ones(2, device="meta")])
    assert fastpath.odd([f32, torch.ones(2, dtype=torch.complex64)])
    assert fastpath.odd([nn.Parameter(f32), f32.as_subclass(type("Sub", (torch.Tensor,), {}))])  # the rules decide


def test_a_module_call_is_judged_on_its_own_tensors_and_one_level_of_its_inputs() -> None:
    """The gate's per-call check (``_disagree``): parameters, buffers, plain tensor attributes (a list of them
    too) and positional inputs, lists and tuples among the inputs looked into one level deep, no deeper."""
    f32 = torch.ones(2)
    lin = nn.Linear(2, 2)
    assert not fastpath._disagree(lin, (f32,), ())
    assert fastpath._disagree(lin, (f32.to(BF),), ())
    assert fastpath._disagree(lin, ([f32, f32.to(BF)],), ())  # a list argument: looked into
    assert fastpath._disagree(lin, ((f32.to(BF),),), ())
    assert not fastpath._disagree(lin, ([[f32.to(BF)]],), ())  # two levels down: not read (as before)
    assert not fastpath._disagree(lin, (f32, None, 3, "x", torch.ones(2, dtype=torch.int64)), ())
    lin.register_buffer("scale", torch.ones(2, device="meta"))
    assert fastpath._disagree(lin, (), ())  # a meta buffer among real weights
    plain = nn.Linear(2, 2)
    plain.extra = [f32, f32.double()]  # a plain attribute holding a list of tensors
    names = fastpath._attributes(plain)
    assert names == ("extra",) and fastpath._disagree(plain, (f32,), names)
    assert not fastpath._disagree(plain, (f32,), ())  # (what the names say is what is read)
    assert fastpath._disagree(nn.Linear(2, 2), (f32.as_subclass(type("Sub", (torch.Tensor,), {})),), ())


def test_the_common_calls_judged_without_the_general_loop_say_what_it_says() -> None:
    """A container (no tensors of its own) and a layer called on one plain tensor take shorter paths through
    ``_disagree``: they must answer as the general comparison ``odd`` does."""
    f32, bf, meta = torch.ones(2), torch.ones(2, dtype=BF), torch.ones(2, device="meta")
    ids = torch.ones(2, dtype=torch.int64)
    box = nn.Sequential(nn.Linear(2, 2))
    for args in [(f32,), (bf,), (f32, bf), (f32, meta), ([f32, bf],), (ids, f32), (None,), ()]:
        assert fastpath._disagree(box, args, ()) == fastpath.odd([a for x in args for a in (
            x if isinstance(x, list) else [x])]), args
    emb = nn.Embedding(4, 2)
    assert not fastpath._disagree(emb, (ids,), ())  # integer ids beside float weights agree
    assert fastpath._disagree(emb, (ids.to("meta"),), ())
    lin = nn.Linear(2, 2, bias=False)
    assert not fastpath._disagree(lin, (f32,), ()) and fastpath._disagree(lin, (bf,), ())
    lin.weight.data = lin.weight.data.to(BF)  # the same Parameter, another dtype: read afresh at every call
    assert fastpath._disagree(lin, (f32,), ()) and not fastpath._disagree(lin, (bf,), ())
    lin.weight = nn.Parameter(torch.ones(2, 2, device="meta"))
    assert fastpath._disagree(lin, (f32,), ())
    odd_param = nn.Linear(2, 2)
    odd_param.bias = nn.Parameter(torch.ones(2).as_subclass(type("Sub", (torch.Tensor,), {})))
    assert fastpath._disagree(odd_param, (f32,), ())  # a subclass: the rules decide what it means
    mixed = nn.Linear(2, 2)
    mixed.bias.data = mixed.bias.data.double()
    assert fastpath._disagree(mixed, (ids,), ())  # two floating dtypes among its own tensors, whatever the input


def test_clean_modules_run_without_the_mode_and_the_code_around_them_with_it() -> None:
    log: list[bool] = []
    net = nn.Sequential(Probe(log), nn.ReLU(), Probe(log))
    with torch.no_grad(), torchdoctor.guard(net, mode="strict"):
        assert around()  # around the model: checked by the first stage, calls that disagree per op
        net(torch.ones(1, 4))
        assert around()
    assert log == [False, False] and not checking() and not around()


def test_a_suspect_module_is_checked_per_op_and_its_siblings_are_not() -> None:
    log: list[bool] = []
    odd = Probe(log, extra=SCALAR)
    net = nn.Sequential(Probe(log), odd, Probe(log))
    with torch.no_grad(), torchdoctor.guard(net, mode="strict") as g:
        net(torch.ones(1, 4))
    assert log == [False, True, False]
    assert g.problems == []  # a 0-dim scalar takes part in no promotion: nothing the rules refuse


def test_after_a_forward_that_autograd_differentiates_its_backward_runs_unchecked() -> None:
    seen: list[bool] = []
    net = nn.Sequential(nn.Linear(4, 4))
    x = torch.ones(1, 4, requires_grad=True)
    with torchdoctor.guard(net, mode="strict"):
        out = net(x).sum()
        seen.append(checking() or around())  # the loss is built, the backward runs: nothing per op
        out.backward()
        seen.append(around())  # the backward has run: what follows it is looked at by the first stage
        with torch.no_grad():
            net(x)
        seen.append(around())
    assert seen == [False, True, True]


def test_a_suspect_modules_backward_is_checked() -> None:
    """Its forward fed autograd: the mode stays on until the next forward starts, so the backward (where a saved
    tensor of the wrong dtype surfaces: test_guard.py's Mixer) is checked per op."""
    log: list[bool] = []
    seen: list[bool] = []
    net = nn.Sequential(Probe(log, extra=SCALAR))
    x = torch.ones(1, 4, requires_grad=True)
    with torchdoctor.guard(net, mode="strict"):
        out = net(x).sum()
        seen.append(checking())
        out.backward()
        net(x)  # the next forward starts: its clean modules run unchecked again
        seen.append(checking())
    assert log == [True, True] and seen == [True, True]


def _planted() -> dict[str, Any]:
    """Broken models and the call that runs them: each fails under strict."""

    def bias() -> Any:
        net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        net[1].bias.data = net[1].bias.data.double()
        return net, lambda: net(torch.ones(1, 4))

    def fp32_input() -> Any:
        b = zoo.build("llama", BF)
        return b.obj, lambda: b.obj(inputs_embeds=torch.randn(1, 8, b.obj.config.hidden_size))

    def meta_weight() -> Any:
        b = zoo.build("llama")
        mlp = b.obj.model.layers[0].mlp
        mlp.down_proj.weight = nn.Parameter(torch.empty_like(mlp.down_proj.weight, device="meta"))
        return b.obj, b.run

    def conv_bias() -> Any:
        unet = zoo.tiny_unet(BF)
        unet.conv_in.bias.data = unet.conv_in.bias.data.float()
        inputs = dict(zoo.build("unet", BF).inputs)  # type: ignore[arg-type]
        return unet, lambda: unet(**inputs)

    return {"bias": bias, "fp32_input": fp32_input, "meta_weight": meta_weight, "conv_bias": conv_bias}


def _report(name: str) -> tuple[str, list[Any], str | None]:
    model, run = _planted()[name]()
    with pytest.raises(PlacementError) as info, torch.no_grad(), torchdoctor.guard(model, mode="strict"):
        run()
    e = info.value
    return str(e), [(p.kind, p.path, p.found, p.expected) for p in e.problems], e.fix


@pytest.mark.parametrize("name", sorted(_planted()))
def test_the_gate_reports_what_strict_on_every_op_reports(name: str) -> None:
    gated = _report(name)
    fastpath.ENABLED = False
    try:
        assert _report(name) == gated
    finally:
        fastpath.ENABLED = True
    assert " problem in `" in gated[0]  # strict's own report, made before the op ran, not torch's error explained


def test_a_tensor_made_in_a_clean_module_fails_in_torch_and_is_explained() -> None:
    class MakesFp64(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) @ torch.eye(4, dtype=torch.float64)

    net = MakesFp64()
    with pytest.raises(PlacementError) as info, torch.no_grad(), torchdoctor.guard(net, mode="strict"):
        net(torch.ones(1, 4))
    assert isinstance(info.value.__cause__, RuntimeError)  # torch's kernel check raised; guard explained it
    assert "expected m1 and m2 to have the same dtype" in str(info.value)


def test_without_a_model_or_with_a_profile_every_op_is_checked() -> None:
    net = nn.Sequential(nn.Linear(4, 4))
    for g in (torchdoctor.guard(mode="strict"), torchdoctor.guard(net, mode="strict", profile="a100")):
        log: list[bool] = []
        probe = Probe(log)
        with torch.no_grad(), g:
            probe(torch.ones(1, 4))
        assert log == [True]


def test_a_compiled_model_is_checked_on_every_op() -> None:
    log: list[bool] = []
    net = nn.Sequential(Probe(log))
    compiled = torch.compile(net, backend="eager")
    with pytest.warns(torchdoctor.PlacementWarning, match="does not check inside torch.compile"), torch.no_grad(), \
            torchdoctor.guard(compiled, mode="strict"):
        compiled(torch.ones(1, 4))
    assert log == [True]


def test_a_mode_entered_inside_a_suspect_module_is_left_intact() -> None:
    """A user's mode entered in one module's forward and left in a later one's (hooks do this): when the suspect
    module returns, the gate must not pop the user's mode in place of its own."""
    seen: list[Any] = []

    class Own(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    own = Own()

    class Enters(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = SCALAR

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            own.__enter__()
            return x * self.w

    class Leaves(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(_get_current_dispatch_mode_stack()[-1])
            own.__exit__(None, None, None)
            return x

    net = nn.Sequential(Enters(), nn.Linear(4, 4), Leaves())
    with torch.no_grad(), torchdoctor.guard(net, mode="strict"):
        net(torch.ones(1, 4))
    assert seen == [own] and _get_current_dispatch_mode_stack() == []


def test_another_threads_modules_do_not_switch_this_sessions_mode() -> None:
    log: list[bool] = []
    odd = nn.Sequential(Probe(log, extra=SCALAR))
    net = nn.Sequential(nn.Linear(4, 4))
    states: list[bool] = []
    with torch.no_grad(), torchdoctor.guard(net, mode="strict"):
        net(torch.ones(1, 4))
        t = threading.Thread(target=lambda: odd(torch.ones(1, 4)))
        t.start()
        t.join(60)
        states.append(around())
    assert log == [False] and states == [True]

"""A compiled model reports the model's paths whichever call compiled first.

Where a failure inside a compiled model surfaces depends on the order (compiled before the guard or inside it, with
the wrong value already baked in or not) and on the backend: dynamo's own ``GraphModule`` holding nothing, or, as
under ``aot_eager`` on a Sapphire-Rapids-class CPU, a traced graph named ``<lambda>`` whose constants
(``_tensor_constant0`` ...) are the model's tensors. ``make_fx`` of a lambda builds that second form on every
machine, so both forms are tested here whatever this machine's kernels are.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import torchdoctor
from guard.test_evidence import _ScaledAttr

BF = torch.bfloat16
FIX = "model.scale.data = model.scale.data.to(torch.bfloat16)"


def _fail(obj: object, call: object, mode: str) -> torchdoctor.PlacementError:
    with pytest.raises(torchdoctor.PlacementError) as info:
        with torchdoctor.guard(obj, mode=mode):
            call()  # type: ignore[operator]
    return info.value


def _names_the_path(err: torchdoctor.PlacementError) -> None:
    text = str(err)
    assert "_tensor_constant" not in text and "outside the guarded model" not in text, text
    assert err.problems[0].path == "scale" and FIX in (err.fix or ""), text
    # at the failing addmm (explain), or at the mul whose float32 operand promoted it (strict, issue 42 point 3)
    assert "culprit scale: f32[16]@cpu" in text or (
        "culprit scale = arg 1 (other): f32[16]@cpu" in text and "promotes the model's bfloat16" in text), text


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_traced_lambda_graph_with_the_models_tensors_as_constants_names_the_path(mode: str) -> None:
    model = _ScaledAttr().to(BF)
    model.scale = torch.ones(16, dtype=BF)
    x = torch.randn(2, 16, dtype=BF)
    with torch.no_grad():
        traced = make_fx(lambda x: model(x))(x)
    assert type(traced).__name__ == "<lambda>" and any(n.startswith("_tensor_constant") for n, _ in
                                                       traced.named_buffers())
    model.scale.data = model.scale.data.float()  # the graph's constant is the model's tensor: float32 now
    err = _fail(model, lambda: traced(x), mode)
    _names_the_path(err)
    assert err.module_path == "" and "_ScaledAttr compiled by torch.compile" in str(err).splitlines()[0]


ORDERS = ["compiled_before_with_a_good_value", "compiled_before_already_wrong", "compiled_inside"]


@pytest.mark.parametrize("mode", ["explain", "strict"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_model_names_the_path_whichever_call_compiled_first(backend: str, order: str, mode: str) -> None:
    model = _ScaledAttr().to(BF)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 16, dtype=BF)
    if order == "compiled_before_with_a_good_value":
        model.scale = torch.ones(16, dtype=BF)
        compiled(x)  # compiled outside the guard; the float32 attribute below makes it compile again
        model.scale = torch.ones(16)
    elif order == "compiled_before_already_wrong":
        model.scale = torch.ones(16)
        with pytest.raises(RuntimeError, match="same dtype"):
            compiled(x)  # compiled outside the guard with the float32 constant in the graph
    else:
        model.scale = torch.ones(16)
    with warnings.catch_warnings():  # torch's note on global hooks, guard's on compiled modules: not asserted here
        warnings.simplefilter("ignore")
        err = _fail(compiled, lambda: compiled(x), mode)
    _names_the_path(err)
    torch._dynamo.reset()

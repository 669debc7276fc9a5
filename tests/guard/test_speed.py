"""What guard's speed work must not change (docs/guard-speed.md): strict's dispatch mode runs without torch's
per-op dynamo wrapper, yet dynamo still never compiles its frames, and every op is still checked."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import torchdoctor
from torchdoctor._guard import dispatch


class _TorchWrapped(TorchDispatchMode):
    """An empty mode as torch makes it: ``__torch_dispatch__`` behind torch's ``_disable_dynamo`` wrapper."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


class _Compiled(TorchDispatchMode):
    """The control: a mode that lets dynamo compile its frames (what the wrapper, or our switch, prevents)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _graphs_compiled_under(enter: Any) -> int:
    """Graphs dynamo compiles for a function with a graph break, called twice inside ``enter()``."""
    import torch._dynamo

    torch._dynamo.reset()
    graphs: list[Any] = []

    def backend(gm: torch.fx.GraphModule, example: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        torch._dynamo.graph_break()
        return torch.sin(y) + 1

    compiled = torch.compile(f, backend=backend)
    with enter():
        compiled(torch.ones(3))
        compiled(torch.ones(3))
    return len(graphs)


def test_strict_dispatch_is_not_behind_torchs_per_op_wrapper_on_this_torch() -> None:
    # torch 2.13 has the code-level switch: if this fails, the per-op saving is gone (the mode still works)
    assert dispatch._UNWRAPPED
    assert dispatch.CheckMode.__dict__["__torch_dispatch__"] is dispatch._check
    assert "__wrapped__" not in vars(dispatch._check)


@pytest.mark.parametrize("mode", ["strict", "fix"])
def test_dynamo_compiles_no_frame_of_the_dispatch_mode(mode: str) -> None:
    model = nn.Linear(3, 3)
    expected = _graphs_compiled_under(_TorchWrapped)
    assert _graphs_compiled_under(_Compiled) > expected  # the control: frames a dispatch mode runs can be compiled
    assert _graphs_compiled_under(lambda: torchdoctor.guard(model, mode=mode)) == expected
    torch._dynamo.reset()  # the switch lives on the code object: a reset of dynamo's caches keeps it
    assert _graphs_compiled_under(lambda: torchdoctor.guard(model, mode=mode)) == expected


def test_strict_still_checks_ops_run_eagerly_around_a_graph_break() -> None:
    w = torch.ones(3, 3, dtype=torch.float64)

    def f(x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return x @ w

    compiled = torch.compile(f, backend="eager")
    with pytest.raises(torchdoctor.PlacementError, match="dtype problem in code outside any module at aten.mm.default"), \
            torchdoctor.guard(mode="strict"):
        compiled(torch.ones(2, 3))

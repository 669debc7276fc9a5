"""A proof replays the failing op with its whole argument list: a convolution checked at module entry (strict) is
re-run as the module runs it (stride, padding, groups, transposed, padding mode), and a replay that cannot be called
as the op's schema says is told as such ("could not be replayed"), never as the user's error; the fix is kept."""

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._guard.proof import prove, unbound

BF = torch.bfloat16
CONV = torch.ops.aten.convolution.default


def _strict_fix_lines(m: nn.Module, x: torch.Tensor) -> list[str]:
    with pytest.raises(torchdoctor.PlacementError) as ei:
        with torchdoctor.guard(m, mode="strict"):
            m(x)
    return [ln.strip() for ln in str(ei.value).splitlines() if ln.strip().startswith("fix ")]


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.Conv2d(3, 4, 2), (1, 3, 8, 8)),
    (lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1), (1, 3, 8, 8)),
    (lambda: nn.Conv2d(3, 4, 3, padding="same"), (1, 3, 6, 6)),
    (lambda: nn.Conv1d(3, 4, 3, padding=1, padding_mode="reflect"), (1, 3, 6)),
    (lambda: nn.ConvTranspose2d(3, 4, 2, stride=2), (1, 3, 4, 4)),
    (lambda: nn.Conv3d(4, 4, 1, groups=2), (1, 4, 2, 2, 2)),
])
def test_conv_bias_fp32_in_bf16_model_is_proven(make, shape) -> None:
    m = nn.Sequential(make()).to(BF)
    m[0].bias.data = m[0].bias.data.float()
    lines = _strict_fix_lines(m, torch.rand(*shape, dtype=BF))
    assert lines == ["fix proven: the whole forward runs again on a copy of the model with 0.bias -> bfloat16",
                     "fix proven: aten.convolution.default runs with arg 2 (bias) -> bfloat16"], lines


@pytest.mark.parametrize("make, shape, odd, op", [
    (lambda: nn.BatchNorm2d(3).eval(), (2, 3, 4, 4), "weight", "native_batch_norm"),
    (lambda: nn.LayerNorm(8), (2, 8), "weight", "native_layer_norm"),
    (lambda: nn.GroupNorm(2, 4), (2, 4, 3), "weight", "native_group_norm"),
    (lambda: nn.Linear(8, 8), (2, 8), "bias", "addmm"),
])
def test_norm_and_linear_ops_replayed_with_all_arguments(make, shape, odd, op) -> None:
    m = nn.Sequential(make()).to(BF)
    p = getattr(m[0], odd)
    p.data = p.data.float()
    lines = _strict_fix_lines(m, torch.rand(*shape, dtype=BF))
    assert len(lines) == 2 and lines[1].startswith(f"fix proven: aten.{op}.default runs with"), lines
    assert lines[0] == f"fix proven: the whole forward runs again on a copy of the model with 0.{odd} -> bfloat16"


def test_a_truncated_argument_list_is_an_unreplayable_op_not_the_users_error() -> None:
    x, w, b = torch.rand(1, 3, 4, 4, dtype=BF), torch.rand(2, 3, 2, 2, dtype=BF), torch.rand(2)
    assert unbound(CONV, (x, w, b), {}) == "argument 'stride' missing"
    assert unbound(CONV, (x, w, b, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), {}) is None
    plan = [(None, BF, [(2, -1)])]
    said = prove(CONV, (x, w, b), {}, plan, {(2, -1): b}, CONV)
    assert said.startswith("fix unproven: the op could not be replayed (argument 'stride' missing)")
    assert "missing value" not in said and "RuntimeError" not in said
    assert b.dtype == torch.float32  # the user's tensor untouched


def test_a_replay_refused_by_the_call_itself_is_told_apart() -> None:
    def op(x: torch.Tensor) -> torch.Tensor:  # no schema: called, and it refuses the arguments
        raise TypeError("op() got an unexpected keyword argument 'alpha'")

    t = torch.rand(2)
    said = prove(op, (t,), {}, [(None, BF, [(0, -1)])], {(0, -1): t}, "op")
    assert said.startswith("fix unproven: the op could not be replayed (TypeError:"), said

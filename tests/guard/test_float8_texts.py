"""guard on float8 storage used in bf16 math, whatever text the kernel raises on this machine.

Which float8 error a block raises depends on the CPU's kernel set and the device: "Promotion for Float8 Types is not
supported" on one x86 CPU, ``"add_stub" not implemented for 'Float8_e4m3fn'`` (NotImplementedError) on a
Sapphire-Rapids-class one, ``"add_xpu"`` / ``"addmm_cuda"`` forms on Intel and NVIDIA GPUs, a TypeError on MPS. The
real ops below raise the CPU texts this machine has; a test-only op (``tdtest_f8::use``) raises each text in turn, so
every text drives guard's code on every machine: ``fix`` casts the float8 operand and runs on, ``explain`` and
``strict`` name the float8 table with the same fix whatever the text.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._guard.float8 import is_float8_message

BF = torch.bfloat16
F8 = torch.float8_e4m3fn


def _raised(fn: Callable[[], object]) -> tuple[type[BaseException], str]:
    try:
        fn()
    except (RuntimeError, TypeError) as exc:
        return type(exc), str(exc)
    raise AssertionError("the op ran")


_ONES = torch.ones(2, dtype=F8)
# (exception type, text): the CPU ones made by real torch ops here; the others as the devices print them
TEXTS = {
    "promotion": _raised(lambda: _ONES * torch.ones(2, dtype=BF)),
    "add_stub": _raised(lambda: _ONES + _ONES),
    "mul_scalar": _raised(lambda: _ONES * 2.0),
    # intel/torch-xpu-ops#1939 (a+b and a*b on xpu)
    "xpu": (NotImplementedError, "\"add_xpu\" not implemented for 'Float8_e4m3fn'"),
    # tests/explain/fixtures/unsupported_dtype__ComfyUI_6859.txt
    "mps": (TypeError,
            "Trying to convert Float8_e4m3fn to the MPS backend but it does not have support for that dtype."),
    # a GPU computes float8 only through _scaled_mm (tests/realworld/test_realworld_tools.py)
    "cuda": (NotImplementedError, "\"addmm_cuda\" not implemented for 'Float8_e4m3fn'"),
}

_LIB = torch.library.Library("tdtest_f8", "DEF")  # test-only: lives as long as this module
_LIB.define("use(Tensor x, str which) -> Tensor")


def _use(x: torch.Tensor, which: str) -> torch.Tensor:
    """The float8 refusal ``which`` for a float8 input (a kernel without a float8 body), else ``x * 2``."""
    if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        kind, text = TEXTS[which]
        raise kind(text)
    return x * 2


_LIB.impl("use", _use, "CPU")


class _Table(nn.Module):
    """An fp8 embedding table whose lookups go straight into a kernel (then bf16 math)."""

    def __init__(self, which: str) -> None:
        super().__init__()
        self.which = which
        self.emb = nn.Embedding(16, 4)
        self.emb.weight.data = self.emb.weight.data.to(F8)
        self.scale = nn.Parameter(torch.ones(4, dtype=BF))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.ops.tdtest_f8.use(self.emb(ids), self.which) * self.scale


IDS = torch.tensor([1, 2])


def test_the_cpu_texts_are_real_and_all_texts_are_known() -> None:
    assert TEXTS["promotion"][0] is RuntimeError and "Promotion for Float8 Types" in TEXTS["promotion"][1]
    assert TEXTS["add_stub"] == (NotImplementedError, "\"add_stub\" not implemented for 'Float8_e4m3fn'")
    assert all(is_float8_message(text) for _, text in TEXTS.values())
    assert not is_float8_message("\"addmm_cuda\" not implemented for 'BFloat16'")
    assert not is_float8_message("expected m1 and m2 to have the same dtype, but got: c10::BFloat16 != float")


@pytest.mark.parametrize("which", list(TEXTS))
def test_fix_mode_casts_the_float8_operand_whatever_the_text(which: str) -> None:
    m = _Table(which)
    kind, text = TEXTS[which]
    with pytest.raises(kind, match="Float8"):
        m(IDS)  # unguarded: the text as given
    with torchdoctor.guard(m, mode="fix") as g:
        out = m(IDS)
    assert out.dtype == BF and torch.equal(out, m.emb.weight[IDS].to(BF) * 2)
    assert m.emb.weight.dtype == F8  # the op's operand was cast, never the model
    assert [(f.found, f.expected, f.op) for f in g.fixes] == [("float8_e4m3fn", "bfloat16", "tdtest_f8.use.default")]


@pytest.mark.parametrize("which", list(TEXTS))
def test_warn_mode_warns_once_and_runs_whatever_the_text(which: str) -> None:
    m = _Table(which)
    with pytest.warns(torchdoctor.PlacementWarning, match="float8_e4m3fn, expected bfloat16; aligned"):
        with torchdoctor.guard(m, mode="warn"):
            assert m(IDS).dtype == BF


@pytest.mark.parametrize("mode", ["explain", "strict"])
@pytest.mark.parametrize("which", list(TEXTS))
def test_the_table_is_named_with_the_same_fix_whatever_the_text(which: str, mode: str) -> None:
    m = _Table(which)
    kind, text = TEXTS[which]
    with pytest.raises((torchdoctor.PlacementError, TypeError)) as info:
        with torchdoctor.guard(m, mode=mode):
            m(IDS)
    fix = "model.emb.weight.data = model.emb.weight.data.to(torch.bfloat16)"
    if kind is TypeError:  # not a RuntimeError: it keeps its class, the explanation is in its message
        assert type(info.value) is TypeError and fix in str(info.value)
        return
    err = info.value
    assert isinstance(err, torchdoctor.PlacementError)
    assert [(p.path, p.found, p.expected) for p in err.problems] == [("emb.weight", "float8_e4m3fn", "bfloat16")]
    assert fix in (err.fix or "") and str(err).splitlines()[0].startswith("dtype mismatch in `<root>`")
    assert f"original error: {kind.__name__}: {text}" in str(err)


class _Real(nn.Module):
    """float8 storage in real torch ops: a lookup plus a float8 shift (both float8: no rule sees a mix, the kernel
    refuses), a lookup times a scalar, and an e4m3 table plus an e5m2 shift (promotion refused)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.emb = nn.Embedding(16, 4)
        self.emb.weight.data = self.emb.weight.data.to(F8)
        self.shift = nn.Parameter(torch.ones(4).to(torch.float8_e5m2 if how == "e5m2" else F8), requires_grad=False)
        self.scale = nn.Parameter(torch.ones(4, dtype=BF))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.emb(ids)
        h = e * 2.0 if self.how == "scalar" else e + self.shift
        return h * self.scale


@pytest.mark.parametrize("how", ["shift", "scalar", "e5m2"])
def test_fix_mode_runs_real_float8_ops_the_rules_let_through(how: str) -> None:
    m = _Real(how)
    with pytest.raises(RuntimeError, match="Float8"):
        m(IDS)
    with torchdoctor.guard(m, mode="fix") as g:
        out = m(IDS)
    assert out.dtype == BF and m.shift.dtype in (F8, torch.float8_e5m2)
    assert {(f.found, f.expected) for f in g.fixes} <= {("float8_e4m3fn", "bfloat16"), ("float8_e5m2", "bfloat16")}
    assert g.fixes and all(f.expected == "bfloat16" for f in g.fixes)  # never a cast to float8
    if how != "scalar":
        assert "shift" in {f.path for f in g.fixes}


def test_float8_is_never_the_dtype_activations_are_cast_to() -> None:
    """More float8 bytes than bf16 in the model: the bf16 parameter is still what the float8 lookup is cast to,
    never the other way round (an activation cast to float8 loses its precision)."""
    m = _Real("shift")
    m.how = "mul"  # e * scale: the promotion rule sees the mix before the kernel runs
    m.forward = lambda ids: m.emb(ids) * m.scale  # type: ignore[method-assign]
    with torchdoctor.guard(m, mode="fix") as g:
        out = m(IDS)
    assert out.dtype == BF and [(f.found, f.expected) for f in g.fixes] == [("float8_e4m3fn", "bfloat16")]

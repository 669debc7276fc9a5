"""A fix proven at the failing op is printed as proven only when a re-run with it applied has no new failure (issue
41 point 1, hunt S11): casting an fp32 text encoder to bf16 makes the caller's fp32 input `t` fail upstream at the
encoder's own Linear; the fix is extended with that input's cast and proven by a re-run, or labelled unproven."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor
from torchdoctor._virtual.prove import NEW, Fix, proven
from torchdoctor._report.model import Problem

BF16 = torch.bfloat16


class TE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.lin(t)


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(self.q(x), ctx, ctx)


class Pipe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.text_encoder, self.transformer = TE(), Attn()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.transformer(x, self.text_encoder(t))


def app(m: nn.Module) -> torch.Tensor:
    m.transformer.to("cuda:0", BF16)
    m.text_encoder.to("cuda:0")  # a custom encoder left in fp32
    return m(torch.randn(1, 3, 8, device="cuda:0", dtype=BF16), torch.randn(1, 3, 8, device="cuda:0"))


def test_the_encoder_cast_is_extended_with_the_input_it_now_fails_on_and_proven() -> None:
    report = torchdoctor.simulate(Pipe(), device="cuda:0", dtype=BF16, call=app)
    codes = [f.code for f in report.fixes]
    assert codes[0].startswith("model.text_encoder.to(torch.bfloat16)  # every floating tensor of text_encoder is "
                               "float32 while the rest of the model is bfloat16"), codes
    assert "# pass input 1 (t) as tensor.to(torch.bfloat16)" in codes  # the input the cast now meets upstream
    assert all(f.proven for f in report.fixes if f.kind != "note"), [(f.code, f.tried) for f in report.fixes]
    assert "fix unproven" not in report.text() and "# fix proven (at the failing op aten.scaled_dot_product_attention" \
        in report.text()


def _p(path: str) -> Problem:
    return Problem("dtype", path, "activation", "float32", "bfloat16", f"{path} is float32")


def test_a_fix_proven_at_the_op_is_unproven_when_the_re_run_meets_a_new_failure() -> None:
    fix = Fix("model.a.data = model.a.data.to(torch.bfloat16)", "path", sets=(("a", BF16),))

    def at_op(fixes: list[Fix]) -> None:
        fixes[0].at_op, fixes[0].proven, fixes[0].tried = True, True, "at the failing op aten.mm"

    (out,) = proven([fix], lambda _: [_p("b")], at_op, before=[_p("a")])
    assert not out.proven and out.tried == f"at the failing op aten.mm; but a virtual re-run with it applied {NEW}: " \
        "b is float32"
    again = Fix("model.a.data = model.a.data.to(torch.bfloat16)", "path", sets=(("a", BF16),))
    (ok,) = proven([again], lambda _: [], at_op, before=[_p("a")])  # no new failure: proven at the op stands
    assert ok.proven and ok.tried == "at the failing op aten.mm"

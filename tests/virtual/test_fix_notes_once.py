"""Fix notes that are advice, said once: bfloat16 gradients met by GradScaler (CUDA has no bfloat16 unscale kernel:
HERMES#12 / trl#4901) get "drop the scaler", never a cast of a tensor to the dtype it has; the same line printed by
several parts of a fix is said once (hunt U16, U12)."""

from __future__ import annotations

import torch

from torchdoctor._report.model import Problem
from torchdoctor._virtual.fixes import fix_items
from torchdoctor._virtual.prove import Fix, fix_text, proof_lines


def test_bfloat16_gradients_under_a_scaler_get_drop_the_scaler() -> None:
    p = Problem("dtype", "<top level>", "activation", "bfloat16", "float32", "aten._amp_foreach_non_finite_check_"
                "and_unscale_.default: arg 0 (self[0]) is a bfloat16 gradient", op="aten._amp_foreach_non_finite_"
                "check_and_unscale_.default")
    (fix,) = fix_items([p], torch.device("cuda:0"), torch.bfloat16) or []
    assert fix.code.startswith("# bfloat16 gradients need no GradScaler (CUDA has no bfloat16 unscale kernel): drop "
                               "the scaler"), fix.code
    assert "tensor.to(torch.bfloat16)" not in fix.code and fix.kind == "note"


def test_a_line_several_parts_print_is_said_once() -> None:
    same = "# pass the tensors made on cpu as tensor.to('cuda:0')"
    fixes = [Fix(same, "note", sets=(("a", torch.device("cuda:0")),)), Fix(same, "note", sets=(("b", torch.device(
        "cuda:0")),))]
    for f in fixes:
        f.at_op, f.proven, f.tried = True, False, "no failing op recorded reads a tensor it changes"
    assert sum(line == same for line in proof_lines(fixes)) == 1, proof_lines(fixes)
    for f in fixes:
        f.at_op = False
    assert sum(line.strip() == same for line in fix_text(fixes)) == 1, fix_text(fixes)

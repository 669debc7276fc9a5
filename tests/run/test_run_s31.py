"""Whole programs from the thirty-first session.

- A float32 projector's output handed to a bfloat16 LM inline (``lm(inputs_embeds=projector(torch.randn(...)))``,
  no local between them): the program's line names no tensor to cast, so the fix fell back to casting the LM's
  ``o_proj`` weights to float32 (undoing the program's own ``.to(device, torch.bfloat16)``) beside an unproven
  projector cast. The call's output is cast where it is handed over now, proven, and no model weight is cast out of
  the dtype the program chose for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from run.test_run_cli import run, write
from run.test_run_hunt26 import _applied_clean, _report

PROJECTOR_INLINE = """
    import torch
    import torch.nn as nn
    from transformers import LlamaConfig, LlamaForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    lm = LlamaForCausalLM(cfg).to(device, torch.bfloat16)
    projector = nn.Linear(24, 32).to(device)
    with torch.no_grad():
        out = lm(inputs_embeds=projector(torch.randn(1, 6, 24, device=device)))
    print(tuple(out.logits.shape))
"""


def test_a_projector_called_inline_has_its_output_cast_where_the_lm_is_handed_it(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    write(tmp_path / "app.py", PROJECTOR_INLINE)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith("out = lm(inputs_embeds=projector(torch.randn(1, 6, 24, device=device))"
                                  ".to(lm.dtype))  # at app.py:12: LlamaForCausalLM computes in bfloat16 on purpose"), \
        fix["code"]
    assert "projector(...) (float32) is made for another component" in fix["code"], fix["code"]
    assert fix["proven"], fix["tried"]
    assert "float32)" not in "".join(f["code"].split("#")[0] for f in report["fixes"])  # no weight cast to float32
    _applied_clean(tmp_path, report)

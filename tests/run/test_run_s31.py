"""Whole programs from the thirty-first session.

- A float32 projector's output handed to a bfloat16 LM inline (``lm(inputs_embeds=projector(torch.randn(...)))``,
  no local between them): the program's line names no tensor to cast, so the fix fell back to casting the LM's
  ``o_proj`` weights to float32 (undoing the program's own ``.to(device, torch.bfloat16)``) beside an unproven
  projector cast. The call's output is cast where it is handed over now, proven, and no model weight is cast out of
  the dtype the program chose for it.
- A diffusers scheduler's timesteps left on the cpu (``set_timesteps(5)`` with no ``device=``), iterated and handed
  to a model whose ``nn.Embedding`` reads them: the fix was a comment, ``# pass input 1 (t) as tensor.to('cuda:0')``.
  It is the program's call now, ``model(x, t.to(device))``, a proven patch that says where ``t`` came from.
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


SCHEDULER_TIMESTEPS = """
    import torch
    import torch.nn as nn
    from diffusers import DDPMScheduler

    device = "cuda" if torch.cuda.is_available() else "cpu"

    class Denoiser(nn.Module):
        def __init__(self):
            super().__init__()
            self.temb = nn.Embedding(1000, 8)
            self.net = nn.Linear(8, 8)

        def forward(self, x, t):
            return self.net(x + self.temb(t))

    model = Denoiser().to(device)
    sched = DDPMScheduler(num_train_timesteps=1000)
    sched.set_timesteps(5)
    x = torch.randn(2, 8, device=device)
    with torch.no_grad():
        for t in sched.timesteps:
            eps = model(x, t)
            x = sched.step(eps, t, x).prev_sample
    print(tuple(x.shape))
"""


def test_a_scheduler_timestep_left_on_the_cpu_is_moved_where_the_program_hands_it_to_the_model(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    write(tmp_path / "app.py", SCHEDULER_TIMESTEPS)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"] == ("# input 1 (t): on the cpu, taken from sched.timesteps at app.py:22 and handed to model at "
                           "app.py:23 as it is: move it there (t.to(device))"), fix["code"]
    assert fix["proven"], fix["tried"]
    assert "-        eps = model(x, t)\n+        eps = model(x, t.to(device))" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)

"""A factory fix whose line holds two calls of that factory (a collate_fn's ``{"input_ids": torch.tensor(a),
"labels": torch.tensor(b)}``: T5 shifts the cpu labels into decoder ids) is still a diff `git apply` takes: every
call at the line gets ``device=``, and the program with the diff applied runs quiet (issue 41 point 1, hunt U33)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torchdoctor
from support.apps import committed, load_file as _load

APP = """\
    import torch
    from transformers import T5Config, T5ForConditionalGeneration


    def build():
        return T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                                   num_decoder_layers=1, num_heads=2, decoder_start_token_id=0,
                                                   pad_token_id=0))


    def collate(rows):
        return {"input_ids": torch.tensor(rows), "labels": torch.tensor([list(reversed(r)) for r in rows])}


    def app(m):
        m.to("cuda:0", torch.bfloat16)
        batch = collate([[5, 6, 7, 8], [9, 10, 11, 12]])
        return m(input_ids=batch["input_ids"].to("cuda:0"), labels=batch["labels"]).loss
"""



@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_two_calls_at_the_maker_line_are_both_given_the_device(tmp_path: Path) -> None:
    path = tmp_path / "t5app.py"
    path.write_text(textwrap.dedent(APP), encoding="utf-8")
    committed(tmp_path, "app")
    mod = _load(path, "t5app_each_call")
    r = torchdoctor.simulate(mod.build(), device="cuda:0", dtype=torch.bfloat16, call=mod.app)
    [p] = r.problems
    assert p.path == "decoder.embed_tokens" and "from labels (an argument of the T5ForConditionalGeneration call, " \
        "made by torch.tensor at " in p.message
    [fix] = [f for f in r.fixes if f.diff]
    assert fix.proven and fix.code.startswith("# torch.tensor made it on cpu: pass device=")
    assert "+    return {\"input_ids\": torch.tensor(rows, device='cuda:0'), \"labels\": torch.tensor([list(reversed(r)) " \
           "for r in rows], device='cuda:0')}\n" in fix.diff
    (tmp_path / "fix.diff").write_text(fix.diff, encoding="utf-8")
    done = subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    fixed = _load(path, "t5app_each_call_fixed")
    again = torchdoctor.simulate(fixed.build(), device="cuda:0", dtype=torch.bfloat16, call=fixed.app)
    assert again.ok, str(again)
    assert "t5app_each_call" not in sys.modules

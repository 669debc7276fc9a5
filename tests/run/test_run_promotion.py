"""``torchdoctor run --device D --dtype bf16`` reports a silent promotion by path (issue 42 point 3): a bf16 model's
forward multiplying by an fp32 plain attribute on the right device returns fp32 with no error."""

from __future__ import annotations

import json
from pathlib import Path

from run.test_run_cli import run, write

PROMOTES = """
    import torch
    from torch import nn

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.scale = torch.ones(4)

        def forward(self, x):
            return self.lin(x) * self.scale

    model = Scaled().to("cuda", torch.bfloat16)
    model.scale = model.scale.to("cuda")
    y = model(torch.ones(2, 4, device="cuda", dtype=torch.bfloat16))
    print("out", y.dtype)
"""


def test_run_reports_a_silent_promotion_by_path(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", PROMOTES)
    proc = run("--device", "cuda:0", "--dtype", "bfloat16", "--json", str(script), cwd=tmp_path)
    doc = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert proc.returncode == 1 and not doc["ok"], proc.stderr
    [p] = doc["problems"]
    assert (p["kind"], p["path"], p["found"], p["expected"]) == ("dtype", "scale", "float32", "bfloat16")
    assert "promotes it to float32 silently" in p["message"]
    assert p["where"] == "app.py:12 in forward"  # the forward's line that multiplied
    if "fixes" in doc:  # the run report carries the block's fixes, each with proven
        assert [(f["code"], f["proven"]) for f in doc["fixes"]] == \
            [("model.scale.data = model.scale.data.to(torch.bfloat16)", True)]

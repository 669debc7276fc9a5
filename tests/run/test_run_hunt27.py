"""Whole programs from the twenty-seventh session's hunt, each a mechanism the virtual run or its fix had wrong.

- A trainer that reloads a cpu checkpoint mid-run with ``model.load_state_dict(sd, assign=True)``: torch puts the
  checkpoint's cpu tensors in place of the model's parameters, and the optimizer built before keeps the old ones. A
  move of the model after the load would run without a crash while the optimizer steps tensors the forward no
  longer reads; the fix is that line without ``assign=True`` (a diff, proven), and applied, the run is clean. A
  model built on meta and loaded with ``assign=True`` (how such a model gets its weights) keeps its own fix.
"""

from __future__ import annotations

from pathlib import Path

from run.test_run_cli import run, write
from run.test_run_hunt26 import _applied_clean, _report

ASSIGN_MID_RUN = """
    import torch, torch.nn as nn
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train(n):
        for _ in range(n):
            x = torch.randn(4, 8, device=device)
            loss = (model(x) - x).pow(2).mean()
            loss.backward(); opt.step(); opt.zero_grad()

    train(1)
    sd = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(sd, strict=True, assign=True)  # resume
    train(1)
"""

META_ASSIGN = """
    import torch, torch.nn as nn
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    sd = {k: torch.randn(v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(sd, assign=True)
    model(torch.randn(2, 8, device="cuda"))
"""


def test_a_load_with_assign_mid_run_is_fixed_at_its_line(tmp_path: Path) -> None:
    write(tmp_path / "app.py", ASSIGN_MID_RUN)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    fix = next(f for f in report["fixes"] if "assign=True at app.py:15" in f["code"])
    assert fix["proven"] and fix["code"].startswith("model.load_state_dict(sd, strict=True)  # "), fix
    assert "an optimizer built before holds the old ones" in fix["code"]
    assert not any(f["code"].startswith("torchdoctor.move(") for f in report["fixes"]), report["fixes"]
    assert "-model.load_state_dict(sd, strict=True, assign=True)  # resume\n" \
           "+model.load_state_dict(sd, strict=True)  # resume\n" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


def test_a_meta_model_loaded_with_assign_keeps_its_move(tmp_path: Path) -> None:
    write(tmp_path / "app.py", META_ASSIGN)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    assert not report["ok"]
    assert report["fixes"] and not any("assign=True" in f["code"] for f in report["fixes"]), report["fixes"]

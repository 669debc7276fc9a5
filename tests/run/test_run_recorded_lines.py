"""What ``torchdoctor run`` says under each recorded problem: the line it was recorded at, per module (two unmoved
layers whose parameters share a path, an Embedding's ``weight`` and a Linear's, each at its own call), and the last
change the virtual run saw itself (a copy the program's line took back to the cpu, which no trace of the model
records) over the trace's older record of the same path."""

from __future__ import annotations

from pathlib import Path

from support.apps import run_json

TWO_ROOTS = '''import torch, torch.nn as nn
emb = nn.Embedding(10, 4)
ids = torch.tensor([[1, 2]]).to("cuda")
print(emb(ids).device)
lin = nn.Linear(4, 4)
print(lin(torch.randn(2, 4, device="cuda")).device)
'''

TAKEN_BACK = '''import torch, torch.nn as nn
class M(nn.Module):
    def __init__(s):
        super().__init__(); s.lin = nn.Linear(4, 4)
    def forward(s, x): return s.lin(x)
model = M().to("cuda:1")
master = {n: p.detach().cpu() for n, p in model.named_parameters()}
y = torch.func.functional_call(model, master, (torch.randn(2, 4, device="cuda:1"),))
'''


def test_each_root_with_the_same_path_is_recorded_at_its_own_call(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(TWO_ROOTS)
    doc = run_json(tmp_path / "app.py", "cuda")
    where = {(p["module_type"], p["path"]): p["where"] for p in doc["problems"]}
    assert where[("Embedding", "weight")] == "app.py:4 in <module>"
    assert where[("Linear", "weight")] == "app.py:6 in <module>"  # not the Embedding's line
    assert where[("Linear", "bias")] == "app.py:6 in <module>"


def test_the_last_change_is_the_runs_own_when_the_trace_record_is_older(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(TAKEN_BACK)
    doc = run_json(tmp_path / "app.py", "cuda:1")
    [problem] = [p for p in doc["problems"] if p["path"] == "lin.weight"]
    # the `.cpu()` copy the forward met, not the model's .to at line 6 (the trace's last record of that path)
    assert problem["trace"] == "on cpu since `.cpu()` at app.py:7"

"""A model the program moved away in place at its own line (``torch.save(model.cpu().state_dict(), f)`` mid-training:
``Module.cpu()`` moves the live model) is fixed at that line, the state dict copied instead, proven; never a
``torchdoctor.move(model, ...)`` that undoes it afterwards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.apps import run_json

SAVE = """\
import io, torch, torch.nn as nn
net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to("cuda")
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(3):
    loss = net(torch.randn(5, 4, device="cuda")).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step == 1:
        torch.save(net.cpu().state_dict(), io.BytesIO())
print("done")
"""

SAVE_IN_FUNCTION = """\
import io, torch, torch.nn as nn
def checkpoint(m, f):
    torch.save({"model": m.to("cpu").state_dict(), "step": 1}, f)
def main():
    model = nn.Linear(4, 4).to("cuda")
    for step in range(2):
        model(torch.ones(2, 4, device="cuda"))
        checkpoint(model, io.BytesIO())
main()
"""


def _applied(tmp_path: Path, text: str) -> tuple[dict, str]:
    app = tmp_path / "app.py"
    app.write_text(text)
    doc = run_json(app, "cuda")
    subprocess.run(["git", "init", "-q", "."], cwd=tmp_path, check=True)
    (tmp_path / "p.diff").write_text(doc["patch"] or "")
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True)
    again = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "app.py"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    return doc, again.stdout + again.stderr


def test_a_save_that_moves_the_model_is_fixed_at_its_line(tmp_path: Path) -> None:
    doc, again = _applied(tmp_path, SAVE)
    (fix,) = doc["fixes"]
    assert fix["code"].startswith("# app.py:8 moves net to cpu in place to save it (net.cpu().state_dict(): "
                                  "Module.cpu() moves the module, not a copy)"), fix
    assert fix["proven"], fix["tried"]
    assert "+        torch.save({k: v.cpu() for k, v in net.state_dict().items()}, io.BytesIO())" in doc["patch"]
    assert "torchdoctor.move(" not in fix["code"] and "no placement error" in again, again


def test_a_to_cpu_save_inside_a_helper_is_fixed_there(tmp_path: Path) -> None:
    doc, again = _applied(tmp_path, SAVE_IN_FUNCTION)
    codes = "\n".join(f["code"] for f in doc["fixes"])
    assert "app.py:3 moves m to cpu in place to save it" in codes, codes
    assert '+    torch.save({"model": {k: v.cpu() for k, v in m.state_dict().items()}, "step": 1}, f)' in doc["patch"]
    assert "no placement error" in again, again

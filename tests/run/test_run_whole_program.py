"""A whole program under ``torchdoctor run --device``: one training step, a checkpoint saved and loaded back, a sample
generated and written as an image (PIL) and an array (numpy). The correct program is quiet (rc 0) and writes its
files; with three bugs planted -- a training target made on the CPU, sampling noise made on the CPU, a bfloat16 sample
handed to numpy -- each is named at its line, each fix is proven, and the ``--json`` report carries one ``patch``
that ``git apply`` takes whole, after which the program runs quiet.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from run.test_run_cli import run, write

PROGRAM = """\
    import numpy as np
    import torch
    import torch.nn as nn
    from PIL import Image

    device = "cuda:0"


    class Gen(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 48)
            self.register_buffer("mean", torch.zeros(48))

        def forward(self, z):
            return torch.tanh(self.fc(z) - self.mean)


    torch.manual_seed(0)
    model = Gen().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    z = torch.randn(4, 8, device=device)
    target = torch.rand(4, 48, device=device)
    loss = (model(z) - target).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"loss {loss.item():.4f}")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, "ckpt.pt")

    ckpt = torch.load("ckpt.pt", map_location="cpu")
    gen = Gen()
    gen.load_state_dict(ckpt["model"])
    gen.to(device, torch.bfloat16)
    with torch.no_grad():
        img = gen(torch.randn(1, 8, device=device, dtype=torch.bfloat16))
    arr = ((img.float().cpu().numpy().reshape(4, 4, 3) + 1) * 127.5).astype(np.uint8)
    Image.fromarray(arr).save("out.png")
    np.save("out.npy", arr)
    print("saved", arr.shape)
"""

PLANTED = {  # the correct line -> the bug (line numbers of the written file: 23, 36, 37)
    "target = torch.rand(4, 48, device=device)": "target = torch.rand(4, 48)",
    "img = gen(torch.randn(1, 8, device=device, dtype=torch.bfloat16))": "img = gen(torch.randn(1, 8, dtype=torch.bfloat16))",
    "img.float().cpu().numpy()": "img.cpu().numpy()",
}


def test_the_correct_program_is_quiet_and_writes_its_image_and_array(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    script = write(tmp_path / "app.py", PROGRAM)
    proc = run("--device", "cuda:0", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "saved (4, 4, 3)" in proc.stdout and "exited with 0" in proc.stderr and "no placement error" in proc.stderr
    assert (tmp_path / "out.png").stat().st_size > 0 and (tmp_path / "out.npy").stat().st_size > 0


def test_each_planted_bug_is_named_at_its_line_and_one_proven_patch_fixes_the_program(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    if shutil.which("git") is None:
        pytest.skip("git applies the patch")
    text = PROGRAM
    for good, bad in PLANTED.items():
        text = text.replace(good, bad)
    script = write(tmp_path / "app.py", text)
    out = tmp_path / "out.json"
    proc = run("--device", "cuda:0", "--file", str(out), str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(out.read_text(encoding="utf-8"))
    assert [p["where"] for p in report["problems"]] == ["app.py:24 in <module>", "app.py:16 in forward"], proc.stderr
    assert "a tensor made by torch.rand in code outside the model at app.py:23" in report["problems"][0]["message"]
    assert "z (an argument of the Gen call, made by torch.randn at app.py:36)" in report["problems"][1]["message"]
    (numpy,) = report["findings"]  # the third bug raises: numpy has no bfloat16
    # its traceback ends at the program's line, as on the device (no frame of the virtual devices' stand-ins)
    trace = proc.stderr[proc.stderr.index("Traceback"):proc.stderr.index("TypeError: Got unsupported ScalarType")]
    assert trace.rstrip().endswith("^") and 'app.py", line 37, in <module>' in trace and "_virtual" not in trace
    assert numpy["where"] == "app.py:37 in <module>" and numpy["fix_from"] == "guard"
    assert "fix proven" in numpy["culprit"] and "img.float().cpu().numpy()" in numpy["fix"]
    # the virtual run's two fixes, then the raised error's (kind "finding"), each proven, each a diff
    assert [(f["kind"] == "finding", f["proven"]) for f in report["fixes"]] == [(False, True), (False, True), (True, True)]
    assert all(f["diff"] for f in report["fixes"])
    # one patch for the three fixes: the per-fix diffs quote each other's old lines and do not apply one after another
    (tmp_path / "all.patch").write_text(report["patch"], encoding="utf-8")
    applied = subprocess.run(["git", "apply", "--unsafe-paths", "all.patch"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert applied.returncode == 0, applied.stderr
    fixed = script.read_text(encoding="utf-8")
    assert "torch.rand(4, 48, device=device)" in fixed and "img.float().cpu().numpy()" in fixed
    again = run("--device", "cuda:0", str(script), cwd=tmp_path)
    assert again.returncode == 0 and "no placement error" in again.stderr, again.stderr
    assert (tmp_path / "out.png").exists()

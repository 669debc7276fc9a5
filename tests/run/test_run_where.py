"""``torchdoctor run --device`` names the device the work really ran on, in its text and its JSON (issue 40
point 3): the device asked for, or the one the program picked itself."""

from __future__ import annotations

import json
from pathlib import Path

from run.test_run_cli import run, write


def test_the_report_names_the_device_the_work_ran_on(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", """
        import torch
        torch.cuda.set_device(1)                  # the app's own choice of GPU
        m = torch.nn.Linear(4, 4).to("cuda")      # the app's own choice: the current device
        print(m(torch.ones(2, 4, device="cuda")).shape)
    """)
    proc = run("--device", "cuda:1", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "on virtual cuda:1 exited with 0" in proc.stderr and "no placement error; ran on cuda:1" in proc.stderr


def test_a_program_that_picks_another_gpu_is_said_to_have_run_there(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", """
        import torch
        m = torch.nn.Linear(4, 4).to("cuda:0")    # hard-coded: not the device the user asked for
        print(m(torch.ones(2, 4, device="cuda:0")).shape)
    """)
    proc = run("--device", "cuda:1", "--json", str(script), cwd=tmp_path)
    doc = json.loads(proc.stdout[proc.stdout.index("{"):])  # after the program's own line
    assert doc["ran"] == "ran on cuda:0 (the program picked it; cuda:1 was asked for)", doc

"""``torchdoctor run``: an error the program catches and reports by its message only (``log.error(str(e))``,
``print(f"failed: {e}")``) is found with its own line, culprit and fix; two different errors with the same message
(two nodes' "mat1 and mat2 ...") stay two findings, the same error at the same place is one, counted; a virtual
run's text summary prints each fix with its proof label, as simulate does."""

from __future__ import annotations

import json
from pathlib import Path

from run.test_run_cli import run, write

NODES = """
    import logging
    import torch
    from torch import nn

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    log = logging.getLogger("execution")

    class Upcasts(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc, self.dec = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            h = self.enc(x).float()
            return self.dec(h)  # UPCASTS-FAILS

    class Reads(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(8, 8)
            self.compute_dtype = torch.float32

        def forward(self, x):
            h = x.to(self.compute_dtype)
            return self.head(h)  # READS-FAILS

    nodes = [Upcasts().half(), Reads().half()]
    for node in nodes + nodes[:1]:  # the first node fails twice at the same place
        try:
            node(torch.ones(2, 8, dtype=torch.float16))
        except RuntimeError as e:
            log.error(str(e))  # the message only: no traceback, no exc_info
    try:
        nodes[1](torch.ones(2, 8, dtype=torch.float16))
    except RuntimeError as e:
        print(f"failed: {e}")
    print("queue done")
"""


def test_errors_reported_by_message_only_are_found_each_at_its_own_line(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", NODES)
    proc = run("--file", str(tmp_path / "out.json"), str(script), cwd=tmp_path)
    assert "queue done" in proc.stdout and "failed: mat1 and mat2 must have the same dtype" in proc.stdout
    assert proc.returncode == 1, proc.stderr
    findings = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["findings"]
    lines = script.read_text(encoding="utf-8").splitlines()
    upcasts = f"app.py:{1 + next(i for i, t in enumerate(lines) if 'UPCASTS-FAILS' in t)} in forward"
    reads = f"app.py:{1 + next(i for i, t in enumerate(lines) if 'READS-FAILS' in t)} in forward"
    by_where = {f["where"]: f for f in findings}
    assert set(by_where) == {upcasts, reads}, findings
    assert all(f["error"].startswith("RuntimeError: mat1 and mat2 must have the same dtype") for f in findings)
    assert all(f["category"] == "dtype_mismatch" for f in findings)
    assert by_where[upcasts]["count"] == 2 and by_where[reads]["count"] == 2  # logged twice / logged and printed
    assert by_where[upcasts]["how"] == "logged"
    # each its own maker and fix, not the first one's
    assert "float()" in by_where[upcasts]["culprit"] and "h = self.enc(x).to(torch.float16)" in \
        by_where[upcasts]["fix"]
    assert "self.compute_dtype" in by_where[reads]["culprit"] and "model.compute_dtype = torch.float16" in \
        by_where[reads]["fix"]  # the attribute by the path the program's model has, not a placeholder
    summary = proc.stderr[proc.stderr.index("torchdoctor run:"):]
    assert "2 placement error(s) met" in summary and "no placement error" not in summary
    assert f"logged at {upcasts}" in summary and f"logged at {reads}" in summary


TEXT_ONLY = """
    import logging
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    saved = "mat1 and mat2 must have the same dtype, but got Float and Half"
    logging.getLogger("worker").warning("node 7: %s", saved)  # a message from another process: no exception here
"""

ZEROS = """
    import torch
    from torch import nn

    class Inpaint(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            mask = torch.zeros(x.shape[0], 4)
            return self.proj(torch.cat([x, mask], dim=1))

    model = Inpaint().to("cuda:0")
    print(model(torch.randn(2, 4, device="cuda:0")).device)
"""


def test_a_logged_message_alone_is_found_at_the_logging_line(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", TEXT_ONLY)
    proc = run(str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    summary = proc.stderr[proc.stderr.index("torchdoctor run:"):]
    assert "1 placement error(s) met" in summary and "[dtype_mismatch]" in summary
    assert "logged at app.py:5 in <module>" in summary


def test_a_virtual_runs_text_summary_prints_each_fix_with_its_proof(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", ZEROS)
    proc = run("--device", "cuda:0", "--color", "never", str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    summary = proc.stderr[proc.stderr.index("torchdoctor run:"):]
    assert "a tensor made by torch.zeros" in summary
    fix = summary[summary.index("\nFix"):]
    assert "device=x.device" in fix and "# fix proven (at the failing op aten.cat.default" in fix
    assert "Patch (git apply):" in fix and "+        mask = torch.zeros(x.shape[0], 4, device=x.device)" in fix


NO_CUDA = """
    import torch
    m = torch.nn.Linear(8, 12)
    m.to("cuda:0")
    print(m(torch.ones(1, 8, device="cuda:0")).shape)
"""


def test_a_program_that_wants_missing_hardware_is_first_told_to_run_on_a_virtual_device(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        import pytest

        pytest.skip("this machine has CUDA: the program runs")
    script = write(tmp_path / "app.py", NO_CUDA)
    proc = run("--file", str(tmp_path / "out.json"), str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (f,) = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["findings"]
    assert f["category"] == "no_accelerator" and f["where"] == "app.py:4 in <module>"  # m.to("cuda:0")
    assert f["fix"].startswith(f"torchdoctor run --device cuda:0 {script}  # its placement checked on a virtual")
    assert "pip install torch" in f["fix"]  # the real build, second
    assert f["culprit"] is None  # the Linear guard saw last is no culprit of a missing GPU

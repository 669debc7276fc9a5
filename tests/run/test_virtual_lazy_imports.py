"""No third-party import the program did not cause (issue 42, point 4): a virtual run no longer imports
bitsandbytes at its start. A program that never imports it never gets it nor its warnings; one that imports it
inside the run gets it as on the real machine (its CPU path) and its 4-bit layer runs on virtual cuda. Each in a
fresh subprocess under a timeout, since the test process may have imported bitsandbytes already."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from run.test_run_cli import ENV, TIMEOUT, run, write

WITHOUT = """
    import sys
    import torch
    torch.cuda.set_device(1)  # device 0 stays current otherwise, as on real hardware
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("cuda")
    model(torch.ones(3, 4, device="cuda")).sum().backward()
    print("bitsandbytes imported:", "bitsandbytes" in sys.modules, "ran on", next(model.parameters()).device)
"""


def test_a_program_that_never_imports_bitsandbytes_never_gets_it(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", WITHOUT)
    proc = run("--device", "cuda:1", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "bitsandbytes imported: False ran on cuda:1" in proc.stdout
    assert "bitsandbytes" not in proc.stderr.lower() and "kernels-community" not in proc.stderr
    assert "no placement error" in proc.stderr


WITH = """
    import sys
    import torch
    import torchdoctor

    assert "bitsandbytes" not in sys.modules
    with torchdoctor.virtual_devices("cuda:1", select=True) as sim:  # cuda:1 current: a bare "cuda" is cuda:1
        import bitsandbytes as bnb  # imported inside the run: as the real machine would import it
        layer = bnb.nn.Linear4bit(64, 32, compute_dtype=torch.float32, quant_type="nf4").to("cuda")
        y = layer(torch.randn(3, 64, device="cuda"))
        assert torch.cuda.is_available()  # the run answers again once the import is done
    print("4-bit", type(layer.weight).__name__, y.device, tuple(y.shape), bool(torch.isfinite(y.cpu()).all()), sim.ok)
    print("after the run, cuda available:", torch.cuda.is_available())
"""


def test_a_program_that_imports_bitsandbytes_in_the_run_uses_its_4bit_layer(tmp_path: Path) -> None:
    script = write(tmp_path / "q.py", WITH)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert "4-bit Params4bit cuda:1 (3, 32) True True" in proc.stdout, proc.stdout
    assert "after the run, cuda available: False" in proc.stdout

"""``.numpy()`` of a tensor left on the GPU (ComfyUI_FaceSimilarity#10: a node calls ``image.numpy()`` on another
node's cuda output) is fixed at the line that reads it: ``image.cpu().numpy()``, a diff of the user's file that
applies and runs (issue 41 point 1, hunt T7). The recorder names that line as the problem's source ("read at")."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from torchdoctor._report.model import Problem
from torchdoctor._virtual.fixes import fix_items
from torchdoctor._virtual.origin import LINES

PROGRAM = """
    import numpy as np, torch
    def to_cv2(image):
        score = float(image.mean())
        npimage = image.numpy()
        return (npimage[0] * 255).astype(np.uint8), score
    if __name__ == "__main__":
        print(to_cv2(torch.rand(1, 4, 4, 3))[0].shape)
"""


def test_the_read_is_fixed_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "node.py"
    path.write_text(textwrap.dedent(PROGRAM), encoding="utf-8")
    at = "node.py:5"
    LINES[at] = (str(path), 5)
    try:
        p = Problem("device", "<top level>", "activation", "cuda:0", "cpu", "Tensor.numpy() of a tensor "
                    "f32[1,4,4,3]@cuda:0: can't convert cuda:0 device type tensor to numpy; call .cpu() first",
                    op="Tensor.numpy")
        (fix,) = fix_items([p], torch.device("cuda:0"), None, {("device", "<top level>", "Tensor.numpy", "cuda:0"):
                                                                 (f"read at {at}",)}) or []
    finally:
        LINES.pop(at, None)
    assert fix.code == "# node.py:5: image.numpy() reads a tensor on cuda:0; numpy reads host memory: " \
        "image.cpu().numpy()", fix.code
    assert fix.diff is not None and "+    npimage = image.cpu().numpy()\n" in fix.diff
    # no run read it here, so no copy of what it read is on record: unproven, saying so (a run proves it on that
    # copy: tests/virtual/test_proof_labels.py)
    assert not fix.proven and fix.tried == "not re-run: what the line read is not on record", fix.tried
    proc = subprocess.run(["git", "apply", "--unsafe-paths", "-p1", "--directory", "."], input=fix.diff,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    ran = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and "(4, 4, 3)" in ran.stdout, ran.stderr

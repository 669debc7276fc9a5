"""A bfloat16 tensor a program converts to numpy at several lines (a normaliser's ``np.min``, ``np.max`` and the
division): one run fixes every conversion of it in one patch, each proven on a CPU copy, up to the line that
assigns the name again — never one line per run."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from support.apps import run_json

APP = textwrap.dedent('''\
    import numpy as np
    import torch

    x = torch.rand(2, 3, device="cuda", dtype=torch.bfloat16)
    lo = x.min().cpu().numpy()
    hi = np.asarray(x.max().cpu())
    scaled = (x.cpu().numpy() - lo) / (hi - lo)
    x = x.float()
    print(x.cpu().numpy().shape, scaled.dtype)
''')


def test_every_conversion_of_the_tensor_is_fixed_in_one_proven_patch(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    doc = run_json(app, "cuda")
    [f] = doc["findings"]
    assert f["category"] == "unsupported_dtype_on_device", f
    assert "x is converted again at app.py:6, app.py:7: each conversion is fixed" in f["culprit"]
    assert "fix proven: the 3 conversions (`x.float().min().cpu().numpy()`, `np.asarray(x.float().max().cpu())`, " \
           "`x.float().cpu().numpy()`) run on CPU copies (ndarray of float32)" in f["culprit"]
    assert f["fix"].splitlines() == ["lo = x.float().min().cpu().numpy()  # app.py:5",
                                     "hi = np.asarray(x.float().max().cpu())  # app.py:6",
                                     "scaled = (x.float().cpu().numpy() - lo) / (hi - lo)  # app.py:7"]
    patch = doc["patch"]
    assert "+lo = x.float().min().cpu().numpy()\n" in patch and "+hi = np.asarray(x.float().max().cpu())\n" in patch
    assert "+scaled = (x.float().cpu().numpy() - lo) / (hi - lo)\n" in patch
    assert "print(x.float()" not in patch  # after `x = x.float()` the name holds another tensor
    subprocess.run(["git", "apply", "-"], input=patch, cwd=tmp_path, text=True, check=True, timeout=60)
    again = run_json(app, "cuda")
    assert again["ok"] and again["exit_code"] == 0, again

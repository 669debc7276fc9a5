"""A model's argument handed in another dtype than its siblings at a program's line that casts the siblings there
(``dit(latents.to(device), text.to(device, dtype=dit_dtype), ...)``: fp32 cached latents into a bf16 model): the fix
is that line, the argument cast in the program's own name for the dtype and its siblings' style
(``_virtual/calldtype``), never only the comment "pass input 0 as tensor.to(torch.bfloat16)". Under ``torchdoctor
run --device cuda`` on tiny apps written here whose inputs come from a safetensors cache (no maker on record): a
positional argument with its own ``.to(device)``, a keyword argument passed bare. Applied, a virtual re-run is clean
and plain python runs on this cpu. A line that casts no sibling keeps the comment (nothing says the program's
dtype)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

APP = """
    import torch
    from safetensors.torch import load_file, save_file
    from torch import nn

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model_dtype = torch.bfloat16


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.emb = nn.Linear(8, 4), nn.Linear(2, 4)

        def forward(self, x, cond):
            return self.proj(x.flatten(1) if x.dim() > 2 else x) + self.emb(cond)


    net = Net().to(device, model_dtype)
    save_file({"x": torch.randn(SHAPE), "cond": torch.randn(3, 2)}, "cache.safetensors")
    cache = load_file("cache.safetensors")
    x, cond = cache["x"], cache["cond"].to(device)
    with torch.no_grad():
        out = CALL
    print("done", tuple(out.shape))
"""

CASES = [
    ("net(x.to(device), cond=cond.to(device, dtype=model_dtype))",
     "net(x.to(device, dtype=model_dtype), cond=cond.to(device, dtype=model_dtype))", "input 0 (x)", "3, 8"),
    ("net(x.to(device, model_dtype), cond=cond)",
     "net(x.to(device, model_dtype), cond=cond.to(dtype=model_dtype))", "kwarg cond", "3, 8"),
    # the failing op reads a view of the argument (a DiT's patchify): judged by the patched program's re-run
    ("net(x.to(device), cond=cond.to(device, dtype=model_dtype))",
     "net(x.to(device, dtype=model_dtype), cond=cond.to(device, dtype=model_dtype))", "input 0 (x)", "3, 2, 4"),
]


def _run(root: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "--json", "main.py"],
                          cwd=root, env=ENV, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = proc.stdout
    return json.loads(out[out.index('{\n  "schema"'):])


def _write(root: Path, call: str, shape: str = "3, 8") -> None:
    (root / "main.py").write_text(textwrap.dedent(APP).lstrip().replace("CALL", call).replace("SHAPE", shape))


@pytest.mark.parametrize("call,fixed,label,shape", CASES, ids=["positional", "keyword", "through-a-view"])
def test_argument_cast_where_the_line_casts_its_siblings(tmp_path: Path, call: str, fixed: str, label: str,
                                                          shape: str) -> None:
    _write(tmp_path, call, shape)
    doc = _run(tmp_path)
    assert doc["patch"] and f"+    out = {fixed}" in doc["patch"], doc["patch"]
    code = [f["code"] for f in doc["fixes"]]
    assert any(c.startswith(f"# {label} is handed to net at main.py:") and "in another dtype than its siblings, "
               "which that line casts to model_dtype: cast it there too" in c for c in code), code
    assert not any("pass input" in c or "pass kwarg" in c for c in code), code
    # the failing op reads the argument, or a view of it (a linear's x.view(-1, n)): proven there, the cast carried
    # through the view
    assert all(f["proven"] for f in doc["fixes"]), doc["fixes"]
    if shape != "3, 8":
        assert doc["fixes"][0]["tried"].endswith(f"; the cast of {label} carried through aten.view to the operand"), \
            doc["fixes"]
    subprocess.run(["git", "init", "-q", "."], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=doc["patch"], text=True, check=True)
    again = _run(tmp_path)
    assert again["problems"] == [] and again["patch"] is None, again["problems"]
    plain = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL)
    assert plain.returncode == 0 and "done (3, 4)" in plain.stdout, plain.stderr[-2000:]


def test_no_sibling_cast_keeps_the_comment(tmp_path: Path) -> None:
    """Nothing at the line names the program's dtype: no line is written, the comment stays."""
    _write(tmp_path, "net(x.to(device), cond=cond)")
    doc = _run(tmp_path)
    code = [f["code"] for f in doc["fixes"]]
    assert "# pass input 0 (x) as tensor.to(torch.bfloat16)" in code and doc["patch"] is None, (code, doc["patch"])

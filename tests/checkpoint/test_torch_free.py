"""The checkpoint command line never imports torch (the pre-commit hook answers in a fraction of ``import torch``),
and it says exactly what the Python API says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchdoctor._checkpoint.scan import check_checkpoint, scan_checkpoint

from . import corpus

SRC = str(Path(__file__).resolve().parents[2] / "src")

_CHILD = r"""
import argparse, json, sys
from torchdoctor._cli.checkpoint import command
from torchdoctor._cli.common import UsageError
out = []
for line in sys.stdin:
    targets, opts = json.loads(line)
    ns = argparse.Namespace(target=targets, device=opts.get("device"), dtype=opts.get("dtype"), json=True,
                            html=None, plan=False, limit=40, quiet=True, distributed=False)
    try:
        code = command(ns)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        code = 2
    out.append(code)
print("RESULT", json.dumps({"codes": out, "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))}))
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from safetensors.torch import save_file
    from torch.distributed.checkpoint import save as dcp_save

    root = tmp_path_factory.mktemp("torchfree")
    sd = {"w": torch.randn(3, 4), "b": torch.zeros(4, dtype=torch.bfloat16)}
    save_file(sd, str(root / "m.safetensors"))
    torch.save(sd, root / "m.pt")
    torch.save(sd, root / "legacy.pt", _use_new_zipfile_serialization=False)
    torch.save(sd, root / "proto1.pt", _use_new_zipfile_serialization=False, pickle_protocol=1)
    dcp_save({k: v.clone() for k, v in sd.items()}, checkpoint_id=str(root / "dcp"))
    payload = root / "evil.pkl"
    payload.write_bytes(corpus.dotted("torch", "os.system", str(root / "PWNED")))
    (root / "lfs.safetensors").write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n")
    return root


def _run(lines):
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONDONTWRITEBYTECODE": "1"}
    stdin = "".join(json.dumps(line) + "\n" for line in lines)
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=stdin, capture_output=True, text=True, timeout=120,
                          env=env)
    result = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and result, proc.stderr[-3000:]
    return json.loads(result[0][7:]), proc


def test_checkpoint_cli_never_imports_torch(files):
    names = ["m.safetensors", "m.pt", "legacy.pt", "proto1.pt", "dcp", "evil.pkl", "lfs.safetensors"]
    lines = [[[str(files / n)], {}] for n in names] + [[[str(files / "m.pt")], {"device": "cuda:1", "dtype": "bf16"}]]
    doc, proc = _run(lines)
    assert doc["torch"] == []  # not torch, not one torch submodule
    assert doc["codes"] == [0, 0, 0, 0, 0, 1, 2, 1]
    assert "can run code (torch.os is the os module: this is os.system)" in proc.stdout
    assert "a git-LFS pointer, not the checkpoint itself: run `git lfs pull`" in proc.stderr + proc.stdout
    assert not (files / "PWNED").exists()


@pytest.mark.parametrize("name", ["m.safetensors", "m.pt", "legacy.pt", "proto1.pt", "dcp", "evil.pkl"])
def test_cli_document_equals_the_api_document(files, name):
    api = scan_checkpoint(files / name, device="cuda:1", dtype=torch.float16).to_dict()
    cli = check_checkpoint(files / name, device="cuda:1", dtype=__import__(
        "torchdoctor._checkpoint.dtypes", fromlist=["x"]).DTYPES["float16"]).to_dict()
    assert json.dumps(api, sort_keys=True, default=str) == json.dumps(cli, sort_keys=True, default=str)
    assert api["tensors"] or name == "evil.pkl"

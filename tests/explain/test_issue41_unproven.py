"""explain, issue 41 point 1 (the explain part): its fixes say that they were not proven.

explain reads an error text and nothing else: no failing state exists to apply a fix to. So every fix that is code
is printed as "unproven (from the error text only)", and the JSON carries ``proven: false`` on every fix; a pure
environment or app fix (a shell command, an app's flag or setting) is printed without the label, marked ``kind:
environment``.
"""

from __future__ import annotations

import json
import subprocess
import sys

from torchdoctor._explain.api import explain
from torchdoctor._explain.report import UNPROVEN, environment_fix

IPEX = "RuntimeError: The model is mixed with different device type"
MAT = "RuntimeError: mat1 and mat2 must have the same dtype, but got Float and BFloat16"


def _fix_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("    - ")]


def test_code_fixes_are_labelled_unproven_and_app_switches_are_not() -> None:
    d = explain(IPEX)[0]
    lines = _fix_lines(d.text())
    assert lines[0] == f"    - Move the whole model before optimizing [{UNPROVEN}]:"
    assert UNPROVEN == "unproven (from the error text only)"
    switch = [ln for ln in lines if "skip that step" in ln]
    assert switch and UNPROVEN not in switch[0]
    for (_, code), line in zip(d.fixes, lines):
        assert (UNPROVEN in line) is (not environment_fix(code)), (code, line)


def test_json_carries_proven_false_and_the_kind_of_every_fix() -> None:
    doc = json.loads(json.dumps(explain(IPEX).to_dict()))
    fixes = doc["diagnoses"][0]["fixes"]
    assert all(f["proven"] is False for f in fixes)
    kinds = {f["code"].split("\n")[0]: f["kind"] for f in fixes}
    assert kinds['model = model.to("xpu")'] == "code"
    assert kinds["python main.py --disable-ipex-optimize"] == "environment"


def test_environment_fixes_are_commands_flags_and_settings() -> None:
    env = ["pip install torch --index-url https://download.pytorch.org/whl/cu124", "python main.py --force-fp32",
           "set COMMANDLINE_ARGS=--reinstall-torch", "--no-half-vae", "nvidia-smi  # must list the GPU",
           'Settings > Compute Settings: no-half', "invokeai.yaml:  precision: float32", "torchdoctor env",
           "git -C custom_nodes/x pull", "export PYTORCH_ENABLE_MPS_FALLBACK=1"]
    code = ["x = x.to(w.dtype)", "model.to(torch.bfloat16)", "pipe.vae.to(torch.float32)",
            "# do not call ipex.optimize on a partially offloaded model", "import torch"]
    assert all(environment_fix(c) for c in env)
    assert not any(environment_fix(c) for c in code)


def test_the_cli_prints_the_label_and_its_json_the_field() -> None:
    run = [sys.executable, "-m", "torchdoctor", "explain", "-"]
    text = subprocess.run(run, input=MAT, capture_output=True, text=True, timeout=120)
    assert text.returncode == 1 and f"[{UNPROVEN}]:" in text.stdout
    js = subprocess.run(run[:-1] + ["--json", "-"], input=MAT, capture_output=True, text=True, timeout=120)
    fixes = json.loads(js.stdout)["diagnoses"][0]["fixes"]
    assert fixes and all(f["proven"] is False for f in fixes)

"""What a ``virtual_devices`` block imports when nothing goes wrong: the proof, fix-writing and error-reading
machinery of the virtual runtime comes in with the first problem only, and no library the program did not import
(bitsandbytes is imported by the block only when the program imports it). Each probe is a fresh process: this test
process has imported everything already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# loaded by a block only once a problem (or an error of the program's) is met
LATER = ("torchdoctor._virtual.prove", "torchdoctor._virtual.entrycheck", "torchdoctor._virtual.escaped", "torchdoctor._virtual.intread", "torchdoctor._virtual.hooked",
         "torchdoctor._virtual.fixes", "torchdoctor._virtual.simulate", "torchdoctor._virtual.simreport",
         "torchdoctor._guard.provenance", "torchdoctor._guard.diagnose", "torchdoctor._explain", "torchdoctor._move",
         "torchdoctor._report.terminal", "bitsandbytes", "transformers", "diffusers", "accelerate", "peft")
# what only a block that runs no module leaves out (a module's inputs are kept as twins for a later proof; a
# module cast at the program's line is recorded with the program's own files told apart)
NO_MODULE = ("torchdoctor._virtual.atop", "torchdoctor._guard")

PROBE = """
    import json, sys
    import torch
    before = set(sys.modules)
    import torchdoctor
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        {body}
    print(json.dumps([sim.ok, sorted(set(sys.modules) - before)]))
"""

BODIES = {
    "empty": "pass",
    "tiny": "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to('cuda:1'); "
            "m(torch.randn(2, 8, device='cuda:1')).sum().item()",
    "mismatch": "m = torch.nn.Linear(8, 8).to('cuda:1'); m(torch.randn(2, 8))",
}


def _probe(kind: str) -> tuple[bool, list[str]]:
    code = textwrap.dedent(PROBE).replace("{body}", BODIES[kind])
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok, modules = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "torchdoctor._virtual.session" in modules  # the probe saw the block's own import
    return ok, modules


def _loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in names)]


@pytest.mark.parametrize("kind", ["empty", "tiny"])
def test_a_clean_block_loads_no_proof_or_error_machinery(kind: str) -> None:
    ok, modules = _probe(kind)
    assert ok
    assert _loaded(modules, LATER + (NO_MODULE if kind == "empty" else ())) == []


def test_a_block_with_a_problem_loads_the_proof_and_proves_its_fix() -> None:
    ok, modules = _probe("mismatch")
    assert not ok
    assert _loaded(modules, ("torchdoctor._virtual.atop", "torchdoctor._virtual.fixes")) == [
        "torchdoctor._virtual.atop", "torchdoctor._virtual.fixes"]

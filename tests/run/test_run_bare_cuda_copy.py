"""A module the program moves with a bare ``.cuda()`` (``.to("cuda")``) while the rest of its work runs on the device
the program chose (``--device cuda:1``): a bare move goes to the current device, cuda:0, so an inference copy built
in a ``post_init`` as ``Model(cfg).cuda()`` meets ids made on cuda:1 (index-tts #265: "index is on cuda:6, different
from other tensors on cuda:0"). ``run`` names that line and fixes it there, moved to the program's own device name
(the ``device=`` the ids were made with, a module-level name the method reads; else the holder's own device) — never
the ids moved to cuda:0 (off the GPU the user chose), never ``.data`` moves of single weights (the copy split over
two GPUs). The patch, applied, runs clean on the virtual devices."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from run.test_run_cli import run, write

pytest_plugins = ["pytester"]

APP = """
    import torch
    import torch.nn as nn


    class Voice(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(40, 8)
            self.head = nn.Linear(8, 40)

        def post_init(self):
            self.copy = nn.Sequential(nn.Embedding(40, 8), nn.Linear(8, 40)){move}.eval()

        def infer(self, ids):
            for _ in range(3):
                ids = torch.cat([ids, self.copy(ids)[:, -1:].argmax(-1)], dim=1)
            return ids


    device = torch.device("cuda:1" if torch.cuda.is_available() else "cpu")
    voice = Voice().to(device)
    voice.post_init()
    ids = torch.tensor([[1, 2, 3]], device=device)
    print("out", tuple(voice.infer(ids).shape))
"""


def _fix_part(out: str) -> str:
    return out[out.find("\nFix"):]


def test_a_bare_cuda_copy_is_fixed_at_its_line_with_the_programs_device(tmp_path: Path) -> None:
    write(tmp_path / "app.py", APP.format(move=".cuda()"))
    r = run("--device", "cuda", "--count", "2", "app.py", cwd=tmp_path)
    out = r.stdout + r.stderr
    fix = _fix_part(out)
    assert "# app.py:13 moves self.copy with a bare `.cuda()`: that is the current device, cuda:0, not the " \
           "program's cuda:1 the tensors it meets are on; move it there: " \
           "self.copy = nn.Sequential(nn.Embedding(40, 8), nn.Linear(8, 40)).to(device).eval()" in fix, out
    assert "# fix proven" in fix, out
    assert ".data = " not in fix and "'cuda:0'" not in fix and "'cuda:1'" not in fix, out
    assert "+        self.copy = nn.Sequential(nn.Embedding(40, 8), nn.Linear(8, 40)).to(device).eval()" in out, out
    # the patch, applied: the program runs clean on the same virtual devices
    rj = run("--device", "cuda", "--count", "2", "--json", "app.py", cwd=tmp_path)
    doc = rj.stdout[rj.stdout.find("{"):]
    import json

    patch = json.loads(doc)["patch"]
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    shutil.copy(tmp_path / "app.py", fixed / "app.py")
    (fixed / "p.diff").write_text(patch)
    subprocess.run(["git", "init", "-q", "."], cwd=fixed, check=True)
    subprocess.run(["git", "apply", "p.diff"], cwd=fixed, check=True)
    again = run("--device", "cuda", "--count", "2", "app.py", cwd=fixed)
    assert "no placement error" in again.stdout + again.stderr, again.stdout + again.stderr


def test_to_cuda_of_a_holder_without_a_device_name_uses_the_holders_device(tmp_path: Path) -> None:
    head, _, tail = APP.format(move='.to("cuda")').partition("    device = torch.device")
    main = "    device = torch.device" + tail  # the program's device is a local of main(): the method cannot read it
    app = head + "    def main():\n" + "".join("    " + x + "\n" for x in main.splitlines()) + "\n\n    main()\n"
    write(tmp_path / "app.py", app)
    out = run("--device", "cuda", "--count", "2", "app.py", cwd=tmp_path)
    fix = _fix_part(out.stdout + out.stderr)
    assert "moves self.copy with a bare `.to(\"cuda\")`: that is the current device, cuda:0" in fix, fix
    assert ".to(next(self.parameters()).device).eval()" in fix, fix
    assert "'cuda:0'" not in fix and ".data = " not in fix, fix


def test_set_device_first_is_quiet(tmp_path: Path) -> None:
    app = APP.format(move=".cuda()").replace("voice = Voice()", "torch.cuda.set_device(device)\n    voice = Voice()")
    write(tmp_path / "app.py", app)
    r = run("--device", "cuda", "--count", "2", "app.py", cwd=tmp_path)
    assert "no placement error" in r.stdout + r.stderr, r.stdout + r.stderr


MARKED = """
import pytest, torch, torch.nn as nn


@pytest.mark.simulate(device="cuda", count=2)
def test_inference_copy():
    device = torch.device("cuda:1")
    emb = nn.Embedding(40, 8).to(device)
    inference_emb = nn.Embedding(40, 8).cuda()
    inference_emb.load_state_dict(emb.state_dict())
    ids = torch.tensor([[1, 2, 3]], device=device)
    assert inference_emb(ids).shape == (1, 3, 8)


@pytest.mark.simulate(device="cuda", count=2)
def test_inference_copy_fixed():
    device = torch.device("cuda:1")
    inference_emb = nn.Embedding(40, 8).to(device)
    ids = torch.tensor([[1, 2, 3]], device=device)
    assert inference_emb(ids).shape == (1, 3, 8)
"""


def test_the_marker_names_the_bare_cuda_line_of_the_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=MARKED)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(failed=1, passed=1)  # the fixed line, as the fix writes it, passes
    out = result.stdout.str()
    assert "# test_suite.py:8 moves inference_emb with a bare `.cuda()`: that is the current device, cuda:0, not " \
           "the program's cuda:1 the tensors it meets are on; move it there: " \
           "inference_emb = nn.Embedding(40, 8).to(device)" in out, out[-3000:]
    assert "to('cuda:0')" not in out, out[-3000:]

"""A CUDA-only device pick local to the function that moves the model (``device = "cuda" if torch.cuda.is_available()
else "cpu"`` in a ``main()``, a trainer's ``__init__``, a test): on an XPU or a Mac the model stays on the cpu. The
pick is the fix, as a patch, proven -- in ``run``, ``simulate(call=)`` and the pytest marker alike -- never a
hard-coded ``'xpu:0'`` move after it (hunt A11: unsloth #9524's rule inside a test). The patched program runs clean
on xpu, mps and cuda; a parameter of the same name is never taken for the module-level pick it shadows."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torchdoctor
from support.apps import load_file

pytest_plugins = ["pytester"]

PICK = 'device = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"'
MAIN = '''import sys, torch, torch.nn as nn


class Trainer:
    def __init__(self, dtype=torch.float32):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        self.net.to(device, dtype)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
    batch = torch.randn(4, 8, device=torch.accelerator.current_accelerator())
    print(net(batch).sum().item())
    return batch


if __name__ == "__main__":
    if "--trainer" in sys.argv:  # one model per run: two of one shape share their paths
        print(Trainer().net(torch.randn(4, 8, device=torch.accelerator.current_accelerator())).sum().item())
    else:
        main()
'''


def _run(cwd: Path, device: str, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", device, "app.py", *args], cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    return r.stdout + r.stderr


def _patch(out: str) -> str:
    patch = out.split("Patch (git apply):\n", 1)[1]
    return "\n".join(line[4:] for line in patch.splitlines() if line.startswith("    ")) + "\n"


def test_a_pick_local_to_main_or_to_a_trainers_init_is_fixed_where_it_is_picked(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(MAIN)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    out = _run(tmp_path, "xpu")
    assert 'app.py:13 moves its component to device = "cuda" if torch.cuda.is_available() else "cpu" (app.py:12), ' \
           "which is cpu here while the run is on xpu:0" in out, out
    assert "it is picked each time main() runs" in out and "# fix proven" in out, out
    assert "'xpu:0')" not in out.split("Fix:", 1)[1], out
    (tmp_path / "p.diff").write_text(_patch(out))
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, timeout=60)
    out = _run(tmp_path, "mps", "--trainer")
    assert "(app.py:6), which is cpu here while the run is on mps:0" in out, out
    assert "it is picked each time Trainer.__init__() runs" in out and "# fix proven" in out, out
    (tmp_path / "p.diff").write_text(_patch(out))
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True, timeout=60)
    assert (tmp_path / "app.py").read_text().count(PICK) == 2
    for device, args in (("xpu", ()), ("mps", ("--trainer",)), ("cuda", ())):
        assert "no placement error" in _run(tmp_path, device, *args), device


APP = """\
    import torch
    from torch import nn

    device = "cuda" if torch.cuda.is_available() else "cpu"  # a module-level pick the parameter below shadows


    class Node(nn.Module):
        def __init__(self):
            super().__init__()
            self.seg, self.refine = nn.Conv2d(3, 1, 3, padding=1), nn.Conv2d(3, 3, 1)


    def app(m, where="xpu"):
        node_device = "cuda" if torch.cuda.is_available() else "cpu"
        m.refine.to(where)
        m.seg.to(node_device)
        image = torch.rand(1, 3, 8, 8, device=where)
        return m.refine(image) * m.seg(image.to(node_device))


    def shadowed(m, device="cpu"):
        m.to(device)
        return m.refine(torch.rand(1, 3, 8, 8, device="xpu"))
"""


def test_simulate_call_fixes_the_pick_of_the_function_it_calls(tmp_path: Path) -> None:
    path = tmp_path / "node.py"
    path.write_text(textwrap.dedent(APP), encoding="utf-8")
    mod = load_file(path, "local_pick_node")
    r = torchdoctor.simulate(mod.Node(), device="xpu", call=mod.app)
    [fix] = r.fixes
    assert fix.proven, fix.tried
    assert 'node.py:14), which is cpu here while the run is on xpu:0' in fix.code, fix.code
    assert "it is picked each time app() runs" in fix.code
    assert fix.diff is not None and '+    node_device = torch.accelerator.current_accelerator().type if ' \
        'torch.accelerator.is_available() else "cpu"\n' in fix.diff, fix.diff
    # a parameter named like the module-level pick is the caller's value, never that pick
    r = torchdoctor.simulate(mod.Node(), device="xpu", call=mod.shadowed)
    assert not r.ok and all("is_available()" not in f.code for f in r.fixes), str(r)


MARKED = '''
import pytest, torch, torch.nn as nn

@pytest.mark.simulate(device="xpu")
def test_device_pick_in_the_test():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
    net(torch.randn(4, 8, device=torch.accelerator.current_accelerator())).sum().backward()
'''


def test_the_marker_names_the_tests_own_pick(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_pick=MARKED)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert 'test_pick.py:6 moves its component to device = "cuda" if torch.cuda.is_available() else "cpu" ' \
           "(test_pick.py:5), which is cpu here while the run is on xpu:0" in out, out[-3000:]
    assert "it is picked each time test_device_pick_in_the_test() runs" in out and "# fix proven" in out, out[-3000:]
    assert "'xpu:0')" not in out.split("Fix:", 1)[1], out[-3000:]

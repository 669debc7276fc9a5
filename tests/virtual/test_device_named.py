"""A tensor a factory of the program's line made on the cpu, meeting tensors on the accelerator, is fixed with the
program's own name for the device (``_virtual/devname``), never a device written out: a program that picks its
device by its own rule (``d = "cuda" if torch.cuda.is_available() else "cpu"``) still runs on a machine without
that accelerator once the patch is applied. Checked under ``torchdoctor run``, ``simulate(call=)`` (the re-run
proof) and the pytest marker:

- a DataLoader batch whose labels the line moves (``y.to(device)``) and whose images it does not: the images are
  moved at that line, ``net(x.to(device))``, never the dataset's factory given ``device='xpu:0'``;
- index_select, embedding, gather, where and matmul with a cpu operand: the factory gets ``device=d``, the name the
  tensor it meets was made with;
- cross_entropy with cpu targets meeting a model's output: ``target.to(logits.device)`` at the line, or
  ``target.to(accelerator.device)`` where the line moves another tensor so (accelerate's ``Accelerator``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
pytest_plugins = ["pytester"]

BATCH = """
    import torch, torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    device = torch.device("xpu" if torch.xpu.is_available() else "cpu")
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 36, 2)).to(device)
    data = DataLoader(TensorDataset(torch.randn(4, 3, 6, 6), torch.randint(0, 2, (4,))), batch_size=2)
    for x, y in data:
        loss = nn.functional.cross_entropy(net(x), y.to(device))
        loss.backward()
    print("trained")
"""

ACCELERATE = """
    import torch
    from torch import nn
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model = nn.Linear(8, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    table = torch.randn(10, 8, device=accelerator.device)
    ids = torch.randint(0, 10, (4,))
    target = torch.randint(0, 3, (4,))
    for _ in range(2):
        loss = nn.functional.cross_entropy(model(table[ids.to(accelerator.device)]), target)
        accelerator.backward(loss)
        opt.step(); opt.zero_grad()
    print("trained")
"""

OPS = """
    import torch
    import torch.nn.functional as F

    d = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(6, 4, device=d)
    idx = torch.tensor([0, 2, 5])
    table = torch.randn(10, 4, device=d)
    ids = torch.randint(0, 10, (3,))
    gidx = torch.zeros(6, 4, dtype=torch.long)
    cond = torch.rand(6) > 0.5
    w = torch.randn(4, 4)
    print(x.index_select(0, idx).shape)
    print(F.embedding(ids, table).shape)
    print(torch.gather(x, 1, gidx).shape)
    print(torch.where(cond, x[:, 0], x[:, 1]).shape)
    print((x @ w).shape)


    def main():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        net = torch.nn.Linear(4, 3).to(device)
        logits = net(torch.randn(5, 4, device=device))
        target = torch.randint(0, 3, (5,))
        loss = F.cross_entropy(logits, target)
        print("loss", loss.item() > 0)


    main()
"""


def _run(root: Path, device: str) -> tuple[str, dict]:  # the program's stdout, and the run's JSON
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", device, "--json", "main.py"],
                          cwd=root, env=ENV, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = proc.stdout
    return out, json.loads(out[out.index('{\n  "schema"'):])


def _applied(root: Path, text: str, device: str) -> tuple[dict, str, subprocess.CompletedProcess[str]]:
    """The run's patch applied to the program: the report of the run, the patch, and plain python on this cpu."""
    (root / "main.py").write_text(textwrap.dedent(text).lstrip())
    _, doc = _run(root, device)
    patch = doc.get("patch") or ""
    subprocess.run(["git", "init", "-q", "."], cwd=root, check=True)
    subprocess.run(["git", "apply", "-"], cwd=root, input=patch, text=True, check=True)
    plain = subprocess.run([sys.executable, "main.py"], cwd=root, env=ENV, capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL)
    return doc, patch, plain


def test_a_batch_whose_labels_the_line_moves_is_moved_there_never_the_dataset(tmp_path: Path) -> None:
    doc, patch, plain = _applied(tmp_path, BATCH, "xpu")
    assert "+    loss = nn.functional.cross_entropy(net(x.to(device)), y.to(device))" in patch
    assert "TensorDataset(torch.randn(4, 3, 6, 6), torch" in patch  # the dataset's line kept as it is
    assert "xpu:0" not in patch and "'xpu" not in patch
    code = "\n".join(f["code"] for f in doc["fixes"])
    assert "x.to(device) (the line moves y with .to(device) already)" in code
    assert "where it was made stays as it is" in code
    assert plain.returncode == 0 and "trained" in plain.stdout, plain.stderr[-600:]  # the program's own cpu fallback
    _, again = _run(tmp_path, "xpu")
    assert again["ok"] and not again["problems"], again


def test_accelerates_device_is_the_name_a_target_is_moved_with(tmp_path: Path) -> None:
    doc, patch, plain = _applied(tmp_path, ACCELERATE, "cuda")
    assert ("+    loss = nn.functional.cross_entropy(model(table[ids.to(accelerator.device)]), "
            "target.to(accelerator.device))") in patch, patch
    assert "cuda:0" not in patch and doc["fixes"][0]["proven"], doc["fixes"]
    assert plain.returncode == 0 and "trained" in plain.stdout, plain.stderr[-600:]
    _, again = _run(tmp_path, "cuda")
    assert again["ok"] and not again["problems"], again


def test_ops_with_a_cpu_operand_get_the_programs_device_name(tmp_path: Path) -> None:
    doc, patch, plain = _applied(tmp_path, OPS, "cuda")
    for fixed in ("+idx = torch.tensor([0, 2, 5], device=d)", "+ids = torch.randint(0, 10, (3,), device=d)",
                  "+gidx = torch.zeros(6, 4, dtype=torch.long, device=d)", "+cond = torch.rand(6, device=d) > 0.5",
                  "+w = torch.randn(4, 4, device=d)",
                  "+    loss = F.cross_entropy(logits, target.to(logits.device))"):
        assert fixed in patch, patch
    assert "cuda:0" not in patch
    code = "\n".join(f["code"] for f in doc["fixes"])
    assert "pass device=d, the program's name for the device x is on (main.py:5)" in code
    assert "it follows the device of logits, wherever the program puts it" in code
    assert all(f["proven"] for f in doc["fixes"]), doc["fixes"]
    assert plain.returncode == 0 and "loss True" in plain.stdout, plain.stderr[-600:]
    _, again = _run(tmp_path, "cuda")
    assert again["ok"] and not again["problems"], again


def test_a_cast_on_the_line_is_no_device_name(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        net = nn.Linear(4, 2).to(device)
        x = torch.randn(3, 4)
        w = torch.ones(3, 2, device=device)
        out = nn.functional.mse_loss(net(x), w.to(torch.float32))
    """).lstrip())
    _, doc = _run(tmp_path, "cuda")
    assert "+x = torch.randn(3, 4, device=device)" in doc["patch"], doc["patch"]  # never x.to(torch.float32)


def _build() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 16, 2))


def _step(net: nn.Module) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = net.to(device)
    x, y = torch.randn(2, 3, 4, 4), torch.tensor([0, 1])
    F.cross_entropy(net(x), y.to(device)).backward()


def test_the_moved_argument_is_proven_by_a_re_run_of_the_call() -> None:
    report = torchdoctor.simulate(_build(), device="cuda", call=_step)
    assert not report.ok
    fix = report.fixes[0]
    assert "x.to(device)" in fix.code and "cuda:0" not in fix.code
    assert fix.proven and "a virtual re-run with the line changed: no problem left" in fix.tried, fix.tried
    assert "F.cross_entropy(net(x.to(device)), y.to(device)).backward()" in (fix.diff or "")


def test_the_marker_names_the_tests_device(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_batch="""
        import pytest, torch, torch.nn as nn, torch.nn.functional as F

        @pytest.mark.simulate(device="xpu")
        def test_batch_left_on_cpu():
            device = torch.device("xpu" if torch.xpu.is_available() else "cpu")
            net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 16, 2)).to(device)
            x, y = torch.randn(2, 3, 4, 4), torch.tensor([0, 1])
            F.cross_entropy(net(x), y.to(device)).backward()
    """)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    fix = text[text.index("Fix:"):]
    assert "x.to(device) (the line moves y with .to(device) already)" in fix
    assert "'xpu:0'" not in fix

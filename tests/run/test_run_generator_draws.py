"""A sampling op given a generator of another device type than its tensors (ComfyUI#16409's yue2 sampler:
``torch.multinomial(probs_on_cuda, 1, generator=torch.Generator())``): real PyTorch raises "Expected a 'cuda' device
type for generator but found 'cpu'", so a virtual run names each draw at its line, never "no placement error"; with
the generator made on the device the same program is quiet (hunt of the twenty-fifth session, round two)."""

from __future__ import annotations

import json
from pathlib import Path

from run.test_run_cli import run, write

DRAWS = """
    import torch
    GEN
    probs = torch.full((2, 5), 0.2, device="cuda")
    a = torch.multinomial(probs, 1, generator=g)  # MULTINOMIAL
    b = torch.bernoulli(torch.full((4,), 0.5, device="cuda"), generator=g)  # BERNOULLI
    c = torch.empty(3, device="cuda").normal_(generator=g)  # NORMAL
    print("done")
"""


def _lines(text: str) -> dict[str, int]:
    rows = text.splitlines()
    return {m: next(i for i, x in enumerate(rows, 1) if m in x) for m in ("MULTINOMIAL", "BERNOULLI", "NORMAL")}


def test_every_draw_from_a_cpu_generator_on_device_tensors_is_named_at_its_line(tmp_path: Path) -> None:
    text = DRAWS.replace("GEN", "g = torch.Generator().manual_seed(0)")
    write(tmp_path / "app.py", text)
    proc = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    report = json.loads(proc.stdout[proc.stdout.index("\n{") + 1:])
    assert not report["ok"]
    said = " ".join(p["message"] for p in report["problems"])
    at = _lines(Path(tmp_path / "app.py").read_text())
    for op, mark in (("multinomial", "MULTINOMIAL"), ("bernoulli", "BERNOULLI"), ("normal_", "NORMAL")):
        assert f"torch.{op} at app.py:{at[mark]} draws with a generator on cpu from tensors on cuda:0" in said, said
    assert "Expected a 'cuda' device type for generator but found 'cpu'" in said
    codes = [f["code"] for f in report["fixes"]]
    assert any(f"app.py:{at['MULTINOMIAL']}: pass a generator made on cuda:0" in c for c in codes), codes
    assert not any(f["proven"] for f in report["fixes"])  # advice: nothing a re-run applies


def test_a_generator_made_on_the_device_is_quiet(tmp_path: Path) -> None:
    write(tmp_path / "app.py", DRAWS.replace("GEN", "g = torch.Generator(device='cuda').manual_seed(0)"))
    proc = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    report = json.loads(proc.stdout[proc.stdout.index("\n{") + 1:])
    assert report["ok"], report["problems"]


LOADER = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    ds = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    loader = DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator(device="cuda"))
    net = torch.nn.Linear(4, 2).to("cuda")
    for x, y in loader:  # LOOP
        net(x.to("cuda")).sum()
"""


def test_a_dataloader_given_a_cuda_generator_is_told_to_take_a_cpu_one(tmp_path: Path) -> None:
    """zhang-can/CoLA#10: the RandomSampler shuffles on the cpu with the DataLoader's generator; the fix is a cpu
    generator for the DataLoader, never "move what that call returns" at the loop."""
    write(tmp_path / "app.py", LOADER)
    proc = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert not report["ok"]
    (fix,) = report["fixes"]
    assert "the DataLoader's sampler draws on the cpu: give the DataLoader a generator made on the cpu" in fix["code"]
    assert "move what that call returns" not in fix["code"]

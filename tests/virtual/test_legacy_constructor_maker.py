"""A legacy constructor (``torch.LongTensor([0])``, ``torch.FloatTensor(2, 3)``) makes its tensor on the CPU
whatever the run's device, and torch's function modes never see it: a run names it as the maker by its line, as it
names ``torch.zeros`` — decoder start ids made in an MT5 regression head and moved only ``if
torch.cuda.is_available()`` (google-research/metricx #17). Its fix is the factory that takes a device, in the
program's name for it: a legacy constructor refuses any device but the cpu."""

from __future__ import annotations

import ast
import subprocess
import textwrap
from pathlib import Path

import torch
import torch.nn as nn

import torchdoctor
from support.apps import committed, run_json
from torchdoctor._virtual.castfix import modern_call


def test_a_legacy_constructor_is_named_as_the_maker() -> None:
    emb = nn.Embedding(32, 8)
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        emb.to("mps")
        ids = torch.randint(0, 32, (3, 5), device="mps")
        start = torch.LongTensor([0]).repeat(ids.size(0)).reshape(-1, 1)
        assert isinstance(start, torch.LongTensor) and not isinstance(start, torch.FloatTensor)
        emb(start)
    [p] = sim.problems
    assert "made by torch.LongTensor at " in p.message and "made before the run" not in p.message, p.message
    assert isinstance(torch.ones(2, dtype=torch.long), torch.LongTensor)  # the classes are torch's own after it


def test_the_fix_is_a_factory_that_takes_the_device() -> None:
    call = ast.parse("torch.LongTensor([0])", mode="eval").body
    assert modern_call(call, "ids.device") == "torch.tensor([0], dtype=torch.int64, device=ids.device)"
    sizes = ast.parse("torch.FloatTensor(2, 3)", mode="eval").body
    assert modern_call(sizes, "x.device") == "torch.empty(2, 3, dtype=torch.float32, device=x.device)"
    assert modern_call(ast.parse("torch.FloatTensor(*shape)", mode="eval").body, "x.device") is None


APP = """
    import torch, torch.nn as nn

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 8)

        def forward(self, input_ids):
            start = torch.LongTensor([0]).repeat(input_ids.size(0)).reshape(-1, 1)
            if torch.cuda.is_available():
                start = start.to(torch.device("cuda"))
            return self.emb(start) + self.emb(input_ids)[:, :1]

    dev = torch.device("mps" if torch.backends.mps.is_available() else "cpu")
    head = Head().to(dev)
    print(head(torch.randint(0, 32, (3, 5), device=dev)).shape)
"""


def test_run_names_the_line_and_patches_it_in_the_program_s_names(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP))
    committed(tmp_path)
    doc = run_json(app, "mps")
    said = " | ".join(p["message"] for p in doc["problems"])
    assert "made by torch.LongTensor in `<root>` at app.py:10" in said, said
    patch = doc["patch"] or ""
    assert "+        start = torch.tensor([0], dtype=torch.int64, device=input_ids.device).repeat(" in patch, patch
    assert "'mps:0'" not in patch
    # the note says what the patch does: never a device= for the legacy constructor, which refuses it
    code = " | ".join(f["code"] for f in doc["fixes"])
    assert "torch.LongTensor(..., device=" not in code, code
    assert "made it on cpu: make it with torch.tensor(..., dtype=torch.int64, device=input_ids.device): a legacy " \
        "constructor takes no device but the cpu" in code, code
    (tmp_path / "fix.diff").write_text(patch)
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True, timeout=60)
    assert not run_json(app, "mps")["problems"]


def test_the_legacy_classes_still_work_as_torch_s_in_a_run() -> None:
    import warnings

    before = torch.get_default_dtype()
    try:
        with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # set_default_tensor_type is deprecated
            assert torch.ones(2).type(torch.LongTensor).dtype == torch.int64
            assert torch.ones(2, device="cuda").type(torch.LongTensor).device.type == "cpu"
            torch.set_default_tensor_type(torch.DoubleTensor)
            assert torch.get_default_dtype() == torch.float64
            torch.set_default_tensor_type("torch.FloatTensor")
            assert torch.get_default_dtype() == torch.float32
        assert not sim.problems
    finally:
        torch.set_default_dtype(before)

"""``torchdoctor simulate FILE:fn`` calls ``fn`` inside the virtual session: a function that builds its model on
``cuda:N`` (the normal way to write a rank's or an app's code) runs on a CPU-only machine, with and without
``--distributed``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from torchdoctor._cli.main import main

APP = """
    import os
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(8, 16)
            self.out = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.out(self.inp(x))

    def on_cuda():
        assert torch.cuda.is_available()
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "1")))
        model = Net().to(device)
        return model, (torch.ones(2, 8, device=device),)

    class Scaled(Net):
        def __init__(self):
            super().__init__()
            self.scale = torch.ones(16)  # the bug: a plain attribute, which Module.to never moves

        def forward(self, x):
            return self.out(self.inp(x) * self.scale)

    def attribute_left_behind():
        model = Scaled().to("cuda:1")
        return model, (torch.ones(2, 8, device="cuda:1"),)

    def cuda_only_runtime():
        free, total = torch.cuda.mem_get_info(1)
        stats = torch.cuda.memory_stats(1)
        assert stats["reserved_bytes.all.current"] == 0 and free == total
        return Net().to("cuda:1")
"""


@pytest.fixture
def app(tmp_path: Path) -> Path:
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(APP), encoding="utf-8")
    return path


def test_a_target_that_builds_its_model_on_cuda_runs_in_the_session(app: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert not torch.cuda.is_available()  # this machine: the target could not run outside the session
    assert main(["simulate", f"{app}:on_cuda", "--device", "cuda:1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["forward"] and doc["ops"] > 0 and doc["device"] == "cuda:1"
    assert main(["simulate", f"{app}:cuda_only_runtime", "--device", "cuda:1"]) == 0
    assert "ok" in capsys.readouterr().out
    assert not torch.cuda.is_available()  # and the session ended with the command


def test_a_placement_bug_in_such_a_target_is_found_by_path(app: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", f"{app}:attribute_left_behind", "--device", "cuda:1", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["problems"][0]["path"] == "scale" and doc["problems"][0]["found"] == "cpu", doc["problems"]


def test_distributed_ranks_call_their_target_on_their_own_virtual_device(app: Path) -> None:
    from tests.distributed.launch import torchrun

    done = torchrun(2, "-m", "torchdoctor", "simulate", f"{app}:on_cuda", "--distributed", "--device", "cuda",
                    "--json", cwd=str(app.parent))
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout[done.stdout.index("{"):])
    assert doc["world_size"] == 2 and not doc["failed"], doc
    assert "Torch not compiled with CUDA enabled" not in done.stdout + done.stderr

"""A model an offloading mechanism moved away between two uses is fixed where the program uses it, never inside the
mechanism: a ComfyUI-like model manager's ``free_memory`` → ``unpatch`` offloads a node's model between prompts (the
fix puts the node's own load call before its use, or moves the model to its input's device there), and accelerate's
``cpu_offload_with_hook`` onloads a sub-model only for its own forward (a layer of it called directly gets its own
hook where the program puts the hooks). Each fix is proven at the failing ops, its diff applies with ``git apply``, and
the patched program runs clean (issue 41: hunt Y5 and Y26)."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

import torchdoctor
from support.apps import committed, load_file

# a few lines of a ComfyUI-like model manager (model_management.py's shape) and a node that keeps its model
MANAGER = """\
    import torch
    from torch import nn

    loaded = []


    class Patcher:
        def __init__(self, model, device):
            self.model, self.device = model, device

        def patch(self):
            self.model.to(self.device)

        def unpatch(self):
            self.model.to("cpu")


    def load_gpu(patchers):
        for p in patchers:
            if p not in loaded:
                p.patch()
                loaded.append(p)


    def free_memory():
        while loaded:
            loaded.pop().unpatch()


"""

NODE_LOADS_ONCE = MANAGER + """\
    class Node:
        def __init__(self):
            self.p = None

        def encode(self, n):
            if self.p is None:
                self.p = Patcher(nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4)).eval(), torch.device("cuda", 0))
                load_gpu([self.p])
            ids = torch.arange(n, device="cuda:0") % 10
            return self.p.model(ids)


    def main():
        node = Node()
        for n in (3, 4):
            node.encode(n)
            free_memory()
"""

NODE_GIVEN = MANAGER + """\
    class Node:
        def __init__(self, p):
            self.p = p

        def encode(self, ids):
            return self.p.model(ids).sum()


    def main():
        p = Patcher(nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4)).eval(), torch.device("cuda", 0))
        load_gpu([p])
        node = Node(p)
        for n in (3, 4):
            node.encode(torch.arange(n, device="cuda:0") % 10)
            free_memory()
"""

BARK = """\
    import torch
    from accelerate import cpu_offload_with_hook
    from torch import nn


    class Semantic(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 8)
            self.lm = nn.Linear(8, 50)

        def forward(self, h):
            return self.lm(h)


    class Bark(nn.Module):
        def __init__(self):
            super().__init__()
            self.semantic, self.coarse = Semantic(), nn.Linear(8, 8)

        def enable_cpu_offload(self, device="cuda:0"):
            hook = None
            for m in (self.semantic, self.coarse):
                _, hook = cpu_offload_with_hook(m, device, prev_module_hook=hook)

        @torch.no_grad()
        def generate(self, ids):
            h = self.semantic.embed(ids)
            logits = self.semantic(h)
            return self.coarse(h + logits[..., :8])


    def main():
        model = Bark().eval()
        model.enable_cpu_offload()
        return model.generate(torch.randint(0, 50, (1, 6), device="cuda:0"))
"""

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")


def _run(path: Path, name: str) -> Any:
    mod = load_file(path, name)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as s:
        mod.main()
    return s


def _applied_clean(tmp_path: Path, path: Path, diff: str, name: str) -> None:
    (tmp_path / "fix.diff").write_text(diff, encoding="utf-8")
    done = subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    again = _run(path, name)
    assert not again.problems, [p.message for p in again.problems]


@needs_git
def test_a_node_whose_model_the_manager_offloaded_loads_it_before_each_use(tmp_path: Path) -> None:
    path = tmp_path / "nodes.py"
    path.write_text(textwrap.dedent(NODE_LOADS_ONCE), encoding="utf-8")
    committed(tmp_path)
    s = _run(path, "offload_nodes_once")
    assert s.problems and {p.found for p in s.problems if p.kind == "device"} == {"cpu"}
    [fix] = s.fixes
    assert fix.code.startswith("load_gpu([self.p])  # before "), fix.code
    assert "nodes.py:39: `self.p.model` was offloaded to cpu by `unpatch` at nodes.py:15 (called from nodes.py:46), " \
        "and " in fix.code and "as nodes.py:37 did once" in fix.code
    assert "move it back" not in fix.code and ".data" not in fix.code and "torchdoctor" not in fix.code
    assert fix.proven, fix.tried
    assert fix.diff is not None and "-        return self.p.model(ids)\n+        load_gpu([self.p])\n" \
        "+        return self.p.model(ids)\n" in fix.diff
    _applied_clean(tmp_path, path, fix.diff, "offload_nodes_once_fixed")


@needs_git
def test_a_model_given_to_the_node_is_moved_to_its_input_where_it_is_used(tmp_path: Path) -> None:
    # the program's load call is in another function than the use: the use line moves the model to its input
    path = tmp_path / "given.py"
    path.write_text(textwrap.dedent(NODE_GIVEN), encoding="utf-8")
    committed(tmp_path)
    s = _run(path, "offload_nodes_given")
    [fix] = s.fixes
    assert fix.code.startswith("return self.p.model.to(ids.device)(ids).sum()  # at "), fix.code
    assert "given.py:35: `self.p.model` was offloaded to cpu by `unpatch` at given.py:15 (called from given.py:44)" \
        in fix.code
    assert fix.proven, fix.tried
    assert fix.diff is not None and "+        return self.p.model.to(ids.device)(ids).sum()\n" in fix.diff
    _applied_clean(tmp_path, path, fix.diff, "offload_nodes_given_fixed")


@needs_git
def test_a_layer_called_outside_its_hooked_sub_model_gets_its_own_hook(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    path = tmp_path / "bark.py"
    path.write_text(textwrap.dedent(BARK), encoding="utf-8")
    committed(tmp_path)
    s = _run(path, "offload_bark")
    assert [p.path for p in s.problems] == ["semantic.embed.weight"]
    [fix] = s.fixes
    assert fix.code.startswith("cpu_offload_with_hook(self.semantic.embed, device)  # before bark.py:23: `semantic` "
                               "is offloaded by accelerate's hook (CpuOffload, put at "), fix.code
    assert "bark.py:24)" in fix.code
    assert ".data" not in fix.code and "torchdoctor" not in fix.code and fix.proven, fix.tried
    assert fix.diff is not None and "+        cpu_offload_with_hook(self.semantic.embed, device)\n" \
        "+        for m in (self.semantic, self.coarse):\n" in fix.diff
    _applied_clean(tmp_path, path, fix.diff, "offload_bark_fixed")


RACE = """\
    import threading

    import torch
    from torch import nn


    class Offloader:
        def __init__(self, blocks, device):
            self.blocks, self.device, self.pending, self.go = blocks, device, [], threading.Event()

        def _move(self, i, dev):
            self.go.wait(5)
            self.blocks[i].to(dev)

        def submit(self, i, dev):
            t = threading.Thread(target=self._move, args=(i, dev))
            t.start()
            self.pending.append(t)

        def prepare(self):
            for b in self.blocks:
                b.to(self.device)


    class DiT(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

        def forward(self, x, off):
            for i, b in enumerate(self.blocks):
                x = b(x)
                if i == 0 and not off.pending:
                    off.submit(0, "cpu")
            return x


    def main():
        model = DiT()
        off = Offloader(model.blocks, torch.device("cuda", 0))
        with torch.no_grad():
            for prompt in range(2):
                off.prepare()
                if prompt == 1:
                    off.go.set()
                    off.pending[0].join()
                model(torch.randn(1, 4, device="cuda:0"), off)
"""


def test_a_block_a_pending_transfer_moved_back_names_both_moves_and_their_threads(tmp_path: Path) -> None:
    # an offloader's transfer, still pending when the next prompt's prepare put every block back, lands after it
    path = tmp_path / "race.py"
    path.write_text(textwrap.dedent(RACE), encoding="utf-8")
    s = _run(path, "offload_race")
    assert {p.path for p in s.problems if p.kind == "device"} == {"blocks.0.weight", "blocks.0.bias"}
    [fix] = s.fixes
    assert fix.code.startswith("# `model`: blocks.0 was moved to cpu by `_move` at race.py:13 in another thread (a "
                               "transfer still pending), after `prepare` at race.py:22 had put it on cuda:0 in the "
                               "program's thread, and "), fix.code
    assert "race.py:47 uses it: wait for the pending transfers before this use" in fix.code
    assert "move it back after" not in fix.code and fix.diff is None and fix.proven, fix.tried

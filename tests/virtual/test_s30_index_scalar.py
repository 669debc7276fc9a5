"""A CPU 0-dim tensor is no scalar to the ops that select or write by an index (hunt 30, n3): a scheduler's
``torch.tensor(5)`` timestep fed to a cuda model's ``nn.Embedding`` raises on the GPU, and ``run`` said "no placement
error".

Evidence (torch's own source and build files, no GPU here): ``aten::embedding`` is CompositeExplicitAutograd and
calls ``weight.index_select(0, indices.reshape(-1))`` (``aten/src/ATen/native/Embedding.cpp``). In
``native_functions.yaml`` index_select, gather, scatter*, take, put_, index_add/index_copy/index_reduce and
``_embedding_bag`` keep the default ``device_check: ExactSame``; for a CUDA or XPU kernel torchgen
(``torchgen/dest/register_dispatch_key.py``, ``gen_device_check``) then makes the wrapper call
``c10::impl::check_and_update_common_device`` on every positional tensor, and that function
(``ATen/core/op_registration/adaption.h``) compares the devices with no exemption: "Expected all tensors to be on the
same device ... (when checking argument for argument index in method wrapper_CUDA__index_select)". The exemption of
CPU 0-dim tensors is TensorIterator's (``allow_cpu_scalars``), in ops marked ``device_check: NoCheck``: elementwise
ops, ``where``, ``masked_fill``. ``index.Tensor`` and ``index_put`` are NoCheck too and move CPU indices to the
device themselves, so ``x[idx_cpu]`` stays legal. ``index_fill_`` is NoCheck, but its index goes through a
TensorIterator that allows no CPU scalar, restrided to the filled tensor's rank; its value tensor is read with
``.item()``, on any device."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import torchdoctor
from run.test_run_cli import run, write
from support.apps import committed

Case = Callable[[torch.Tensor], Any]

REFUSED: dict[str, tuple[str, Case]] = {
    "embedding": ("aten.embedding.default", lambda w: F.embedding(torch.tensor(1), w)),
    "embedding_bag": ("aten._embedding_bag", lambda w: F.embedding_bag(torch.tensor([1, 2]), w, torch.tensor([0]))),
    "index_select": ("aten.index_select.default", lambda w: w.index_select(0, torch.tensor(1))),
    "gather": ("aten.gather.default", lambda w: w[0, 0].gather(0, torch.tensor(0))),
    "take": ("aten.take.default", lambda w: w.take(torch.tensor(3))),
    "scatter_": ("aten.scatter_.src", lambda w: w[0, 0].scatter_(0, torch.tensor(0), w[1, 1])),
    "index_copy_": ("aten.index_copy_.default", lambda w: w.index_copy_(0, torch.tensor([1]), w[:1])),
    "index_fill_": ("aten.index_fill_.int_Scalar", lambda w: w.index_fill_(0, torch.tensor(1), 0.0)),
    "put_": ("aten.put_.default", lambda w: w.put_(torch.tensor(1), w[0, 0])),
}
ALLOWED: dict[str, Case] = {
    "x[idx]": lambda w: w[torch.tensor(1)],
    "x[idx 1-d]": lambda w: w[torch.tensor([1, 2])],
    "index_put_": lambda w: w.index_put_((torch.tensor(1),), torch.tensor(0.0)),
    "x[idx] = v": lambda w: w.__setitem__(torch.tensor([1]), 0.0),
    "index_fill_ value": lambda w: w.index_fill_(0, torch.tensor([1], device=w.device), torch.tensor(0.0)),
    "mul": lambda w: w * torch.tensor(2.0),
    "where": lambda w: torch.where(w > 0, w, torch.tensor(0.0)),
    "masked_fill": lambda w: w.masked_fill(w > 0, torch.tensor(0.0)),
}


def _problems(case: Case) -> list[Any]:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as s:
        case(torch.randn(10, 3, device="cuda"))
    return list(s.problems)


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_cpu_0_dim_index_is_refused_by_an_index_op(name: str) -> None:
    op, case = REFUSED[name]
    [p] = _problems(case)
    assert (p.kind, p.found, p.expected) == ("device", "cpu", "cuda:0") and p.op.startswith(op), p.message
    assert "@cpu is on cpu while aten." in p.message and "made by torch.tensor in code outside the model" in p.message


@pytest.mark.parametrize("name", list(ALLOWED))
def test_advanced_indexing_and_elementwise_ops_take_cpu_scalars(name: str) -> None:
    assert _problems(ALLOWED[name]) == []


APP = """
    import torch
    import torch.nn as nn

    device = "cuda" if torch.cuda.is_available() else "cpu"

    class Denoiser(nn.Module):
        def __init__(self):
            super().__init__()
            self.temb = nn.Embedding(1000, 8)
            self.net = nn.Linear(8, 8)

        def forward(self, x, t):
            return self.net(x + self.temb(t))

    model = Denoiser().to(device)
    x = torch.randn(2, 8, device=device)
    with torch.no_grad():
        t = torch.tensor(5)
        eps = model(x, t)
    print("ok", eps.shape)
"""


def _run(folder: Path) -> Any:
    proc = run("--device", "cuda:0", "--json", "app.py", cwd=folder)
    return json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])


def test_run_finds_a_cpu_timestep_fed_to_an_embedding_and_fixes_its_maker(tmp_path: Path) -> None:
    write(tmp_path / "app.py", APP)
    committed(tmp_path)
    doc = _run(tmp_path)
    [p] = doc["problems"]
    assert (p["kind"], p["path"], p["op"], p["where"]) == ("device", "temb", "aten.embedding.default",
                                                           "app.py:14 in forward")
    assert p["message"] == ("t (an argument of the Denoiser call, made by torch.tensor at app.py:19) i64[]@cpu is on "
                            "cpu while aten.embedding.default runs on cuda:0 (in temb, Embedding)")
    assert "-    t = torch.tensor(5)\n+    t = torch.tensor(5, device=device)\n" in doc["patch"]
    (tmp_path / "fix.diff").write_text(doc["patch"])
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True, timeout=60)
    assert _run(tmp_path)["ok"]
    plain = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and "ok torch.Size([2, 8])" in plain.stdout, plain.stderr  # the cpu fallback too


SCHEDULER_APP = """
    import torch
    import torch.nn as nn
    from diffusers import DDPMScheduler

    device = "cuda" if torch.cuda.is_available() else "cpu"

    class Denoiser(nn.Module):
        def __init__(self):
            super().__init__()
            self.temb = nn.Embedding(1000, 8)
            self.net = nn.Linear(8, 8)

        def forward(self, x, t):
            return self.net(x + self.temb(t))

    model = Denoiser().to(device)
    sched = DDPMScheduler(num_train_timesteps=1000)
    sched.set_timesteps(3)  # timesteps stay on the cpu
    x = torch.randn(2, 8, device=device)
    with torch.no_grad():
        for t in sched.timesteps:
            x = sched.step(model(x, t), t, x).prev_sample
    print("ok", x.shape)
"""


def test_run_finds_a_schedulers_cpu_timestep_fed_to_an_embedding(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    write(tmp_path / "app.py", SCHEDULER_APP)
    doc = _run(tmp_path)
    assert [(p["kind"], p["path"], p["op"]) for p in doc["problems"]] == [("device", "temb", "aten.embedding.default")]
    assert "i64[]@cpu is on cpu while aten.embedding.default runs on cuda:0" in doc["problems"][0]["message"]

"""guard's proofs re-run a module on a copy; a module that holds a lock, an open file or an object holding a lock
cannot be deep-copied ("cannot pickle '_thread.lock' object"), and the proof failed on torchdoctor's own copy (the
report showed that TypeError as "fix unproven"). The copy now gets new, unheld locks (the program's may be held by the
very forward that failed: sharing it would wait forever) and shares only what cannot be copied otherwise (a file)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import torchdoctor
from torchdoctor._guard import trialcopy


class _Box:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0


class _Locked(nn.Module):
    """A layer whose forward holds its lock (and a box's lock) while it computes with a plain fp32 attribute."""

    def __init__(self, log: Path) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.w = torch.randn(4, 4)  # a plain attribute: .to(torch.bfloat16) leaves it float32
        self.lock, self.rlock, self.box = threading.Lock(), threading.RLock(), _Box()
        self.log = open(log, encoding="utf-8")  # noqa: SIM115  # an open file: cannot be copied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.lock, self.rlock, self.box.lock:
            self.box.calls += 1
            return self.fc(x) @ self.w


@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_module_holding_locks_and_a_file_is_proven_on_a_copy(tmp_path: Path, mode: str) -> None:
    (tmp_path / "log.txt").write_text("x", encoding="utf-8")
    net = _Locked(tmp_path / "log.txt").to(torch.bfloat16)
    x = torch.randn(2, 4, dtype=torch.bfloat16)
    with pytest.raises(torchdoctor.PlacementError) as err, torchdoctor.guard(net, mode=mode):
        net(x)
    text = str(err.value)
    assert "fix proven: the whole forward runs again on a copy of the model with w -> bfloat16" in text, text
    assert "pickle" not in text and "TypeError" not in text, text
    assert net.w.dtype == torch.float32 and net.box.calls == 1  # the program's module: untouched by the proof
    assert not net.lock.locked() and not net.box.lock.locked()
    net.log.close()


def test_the_copy_has_its_own_tensors_and_new_unheld_locks(tmp_path: Path) -> None:
    (tmp_path / "log.txt").write_text("x", encoding="utf-8")
    net = _Locked(tmp_path / "log.txt")
    net.lock.acquire()
    net.box.lock.acquire()
    twin = trialcopy.deepcopy(net)
    assert twin.fc.weight is not net.fc.weight and torch.equal(twin.fc.weight, net.fc.weight)
    assert twin.lock is not net.lock and not twin.lock.locked()
    assert twin.box is not net.box and not twin.box.lock.locked() and isinstance(twin.rlock, type(net.rlock))
    assert twin.log is net.log  # shared: a file cannot be copied
    net.log.close()

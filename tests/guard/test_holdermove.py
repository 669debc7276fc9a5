"""``_guard.holdermove``: the line that moved an object the program holds (an EMA copy) to the device its tensors
are met on, read from the program's source: ``.cpu()`` in the value bound, a later ``ema.to("cpu")``, the newest
before the line where the tensor was met; a move elsewhere or to another device is never named."""

from __future__ import annotations

import pathlib

from torchdoctor._guard.holdermove import describe, moved_at

PROGRAM = '''import copy
import torch


def train(m, device):
    m.to(device)
    ema = copy.deepcopy(m).cpu().requires_grad_(False)
    other = copy.deepcopy(m).to(device)
    for pe, pm in zip(ema.parameters(), m.parameters()):
        pe.lerp_(pm, 0.01)
    ema.to(torch.device("cpu"))
    for pe, pm in zip(ema.parameters(), m.parameters()):
        pe.lerp_(pm, 0.01)
    return other


def unrelated():
    ema = 1
    ema.to("cpu")
'''


def test_the_move_of_the_holder_is_named_newest_first(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "train.py"
    src.write_text(PROGRAM)
    assert describe(str(src), 10, "ema", "cpu") == ("ema was moved to cpu by `.cpu()` at train.py:7 "
                                                    "(`ema = copy.deepcopy(m).cpu().requires_grad_(False)`)")
    assert moved_at(str(src), 13, "ema", "cpu") == (str(src), 11, 'ema.to(torch.device("cpu"))',
                                                    ".to(torch.device('cpu'))")
    assert moved_at(str(src), 10, "ema", "cuda") is None  # moved to cpu, not cuda
    assert moved_at(str(src), 10, "other", "cpu") is None  # `.to(device)`: no literal device, never guessed
    assert moved_at(str(src), 7, "ema", "cpu") is None  # only lines before the one met
    assert moved_at(str(tmp_path / "missing.py"), 10, "ema", "cpu") is None

"""Windows that differ only in their digits (a time stamp on every line, a frame's line number) share what the
signature's patterns found, and only where that is exact: a message whose fields hold a digit (``cuda:1``) is read
again, so two errors that differ in a device index stay two diagnoses."""

from __future__ import annotations

import random

from torchdoctor._explain.api import explain
from torchdoctor._explain.prefilter import EXACT_BELOW

DEVICES = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, {} and cpu!"
TYPES = "RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same"


def _stamped(lines: list[str], seed: int = 0) -> str:
    rng = random.Random(seed)
    out, t = [], 0.0
    while sum(len(x) + 1 for x in out) < EXACT_BELOW + 50_000:  # a log, not a paste
        for line in lines:
            t += rng.random()
            out.append(f"2025-05-28T10:{int(t // 60) % 60:02d}:{t % 60:09.6f} - step {rng.randrange(1000, 10_000)} ok")
            out.append(f"2025-05-28T10:{int(t // 60) % 60:02d}:{t % 60:09.6f} - {line}")
    return "\n".join(out)


def test_stamped_repeats_of_one_error_are_one_diagnosis_with_every_repeat_counted() -> None:
    text = _stamped([TYPES])
    found = explain(text)
    assert [d.category for d in found] == ["input_weight_type_mismatch"]
    assert found[0].count == text.count("Input type (")
    assert found[0].what_happened == explain(TYPES)[0].what_happened


def test_errors_that_differ_in_a_device_index_stay_apart_under_time_stamps() -> None:
    text = _stamped([DEVICES.format("cuda:0"), DEVICES.format("cuda:1")])
    found = explain(text)
    assert sorted(d.what_happened for d in found) == sorted(
        explain(DEVICES.format(f"cuda:{i}"))[0].what_happened for i in (0, 1))
    for d in found:  # each counted where it was said, none folded into the other
        device = "cuda:1" if "cuda:1" in d.what_happened else "cuda:0"
        assert d.count == text.count(f"devices, {device} and cpu") > 100

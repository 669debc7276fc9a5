"""A window's fields remembered by its shape (``windows``): only for signatures whose patterns treat every digit
alike, and each window's fields are still its own (issue 43 point 5: logs of alike errors with other numbers)."""

from __future__ import annotations

from torchdoctor._explain.catalog import signatures
from torchdoctor._explain.prefilter import EXACT_BELOW
from torchdoctor._explain.scanner import BLOCK, Scanner
from torchdoctor._explain.windows import Shapes, find_fields, squeeze, uniform

SAME = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, {} and {}!"
SIGS = {s.name: s for s in signatures()}


def test_only_patterns_that_treat_every_digit_alike_are_remembered_by_shape() -> None:
    assert uniform(SIGS["device.expected_same"])  # its devices' "(?::\d{1,3})?" matches any digit alike
    assert not uniform(SIGS["device.first_device"])  # "devices\[0\]" tells 0 from 1
    assert not uniform(SIGS["unsupported.cublas_bf16"])  # "CUDA_R_16BF"
    assert not uniform(SIGS["unsupported.mps_bf16"])  # "(?!float8)"


def test_a_window_remembered_by_shape_keeps_its_own_digits() -> None:
    sig, shapes = SIGS["device.expected_same"], Shapes()
    first = find_fields(squeeze(SAME.format("cuda:0", "cuda:1")), sig, shapes)
    second = find_fields(squeeze(SAME.format("cuda:2", "cuda:7")), sig, shapes)
    assert len(shapes) == 1  # one shape, read once
    assert first == ({"a": "cuda:0", "b": "cuda:1"}, True) and second == ({"a": "cuda:2", "b": "cuda:7"}, True)
    assert second == find_fields(squeeze(SAME.format("cuda:2", "cuda:7")), sig, None)  # as read without the memo
    other = find_fields(squeeze(SAME.format("cuda:2", "cpu")), sig, shapes)
    assert other == ({"a": "cuda:2", "b": "cpu"}, True) and len(shapes) == 2


def test_a_time_stamped_log_of_alike_errors_keeps_each_error_apart() -> None:
    lines = [f"2025-05-28T10:{i // 60 % 60:02d}:{i % 60:09.6f} - " + SAME.format(f"cuda:{i % 4}", "cpu")
             + f"\n2025-05-28T10:{i // 60 % 60:02d}:{i % 60:09.6f} -   File \"run.py\", line {i % 97}, in step"
             for i in range(4 * EXACT_BELOW // 200)]
    log = "\n".join(lines)
    scanner = Scanner()
    for i in range(0, len(log), BLOCK // 4):
        scanner.feed(log[i: i + BLOCK // 4])
    scanner.feed("", final=True)
    counts = {g.fields.get("a"): g.count for g in scanner.groups.values() if g.sig.name == "device.expected_same"}
    assert counts == {f"cuda:{d}": len(range(d, len(lines), 4)) for d in range(4)}, counts
    assert len(scanner.shapes) < 20  # the time stamps and line numbers made no new shapes


def test_the_shape_memo_is_left_off_where_shapes_do_not_repeat() -> None:
    sig, shapes = SIGS["device.expected_same"], Shapes()
    for i in range(600):  # every window its own shape: the memo only costs
        text = squeeze(SAME.format(f"cuda:{i % 8}", "cpu") + " step" + "s" * i)
        assert find_fields(text, sig, shapes) == ({"a": f"cuda:{i % 8}", "b": "cpu"}, True)
    assert not shapes.on and len(shapes) == 512

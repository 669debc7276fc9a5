"""The scanner skips frames-only evidence once a message has been recognised (issue 43 point 5: a seventh of the
hits of a log made only of error texts), and reads it while none has: ``explain`` keeps frames-only diagnoses only
for a text without a recognised message, so the answers are the same either way."""

from __future__ import annotations

from torchdoctor import explain
from torchdoctor._explain.scanner import Scanner

FRAME = '  File "/site-packages/xformers/ops/fmha/__init__.py", line 223, in memory_efficient_attention\n'
MESSAGE = ("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
           "cpu! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)\n")


def _scanned(text: str) -> Scanner:
    s = Scanner()
    s.feed(text, final=True)
    return s


def test_frames_before_a_message_are_read_and_after_it_skipped() -> None:
    before = _scanned(FRAME + "step 1\n")
    assert [g.sig.name for g in before.groups.values()] == ["frames.xformers"]
    assert not before.spoken
    s = _scanned(FRAME + "step 1\n" + MESSAGE + "step 2\n" + FRAME.replace("223", "224") + "step 3\n")
    # the message's line also holds the cut-message anchor ("error: expected all te"), read before the full one
    names = [(g.sig.name, g.count) for g in s.groups.values()]
    assert names == [("frames.xformers", 1), ("partial.expected_same", 1), ("device.expected_same", 1)]
    assert s.spoken  # the second frame, after the message, was not examined (frames.xformers counted once) ...
    assert s.hits == 4  # ... but counted towards the examined-lines cap as before


def test_answers_are_the_frames_alone_or_the_message() -> None:
    only = explain(FRAME * 3)
    assert [d.signature for d in only] == ["frames.xformers"]
    both = explain(FRAME + MESSAGE + FRAME.replace("223", "224") * 50)
    assert [d.signature for d in both] == ["device.expected_same"]
    assert both[0].count == 1
    # the same message after a thousand frames: the frames are dropped, the message counted once per occurrence
    late = explain(FRAME * 1000 + MESSAGE + "step 9\n" + MESSAGE)
    assert [(d.signature, d.count) for d in late] == [("device.expected_same", 2)]

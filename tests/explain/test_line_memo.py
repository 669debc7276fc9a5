"""explain remembers what repeated lines hold (``Prefilter.lines``' memo, the scanner's per-line signatures and its
window memo): what it finds must be what the keys' walk over the whole text finds, line by line, and a window
remembered must never stand for one whose next line differs (issue 43 point 5)."""

from __future__ import annotations

from torchdoctor._explain.plaintext import fold
from torchdoctor._explain.prefilter import EXACT_BELOW, new_memo
from torchdoctor._explain.scanner import BLOCK, Scanner, _anchor_table

CPU_GPU = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and"
TYPES = "RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.FloatTensor) should be the same"


def walk_whole(text: str, start: int, cut: int) -> list[tuple[int, int]]:
    """The keys' walk over the whole text at once, each segment checked: what the prefilter found before it
    remembered lines."""
    pf, _ = _anchor_table()
    exact = len(text) < EXACT_BELOW
    source = fold(text).lower() if exact else text
    segments = pf._segments(source, text, start, cut)
    out: list[tuple[int, int]] = []
    for s in sorted(segments):
        e, which = segments[s]
        raw = source[s:e] if exact else text[s:e]
        out += [(s + f, i) for f, i in pf._check(raw, exact, (raw, tuple(sorted(which))))]
    return out


def mixed(lines: int) -> str:
    long_line = "x " * 1700 + TYPES + " y" * 600  # longer than a remembered line, the anchor past _BACK
    rows = [CPU_GPU, "cpu!", "  File \"train.py\", line 3, in step", TYPES, long_line, "\x1b[31m" + TYPES + "\x1b[0m",
            "step 12 loss 0.41", "torch.cuda.OutOfMemoryError: " + TYPES.lower(), "Input Type (float) And Bias Type"]
    return "\n".join(rows[i % len(rows)] for i in range(lines))


def test_remembered_lines_find_what_the_whole_walk_finds() -> None:
    pf, _ = _anchor_table()
    for text in (mixed(40), mixed(4000)):  # a paste (lower-cased whole) and a log (keys on the raw text)
        memo = new_memo()
        want = walk_whole(text, 0, len(text))
        assert len(want) > 10
        assert list(pf.hits(text, 0, len(text), memo)) == want
        assert memo[len(text) < EXACT_BELOW], "the repeated lines were remembered"
        assert list(pf.hits(text, 0, len(text), memo)) == want  # read again, from the memo
        # a range that starts and ends inside lines (a block's cut of one enormous line): never remembered whole
        mid = text.index(TYPES, len(text) // 2) + 5
        assert list(pf.hits(text, mid, len(text) - 7, memo)) == walk_whole(text, mid, len(text) - 7)


def test_a_window_remembered_never_stands_for_one_with_another_next_line() -> None:
    wrapped = CPU_GPU + "\ncpu! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)\n"
    cut_off = CPU_GPU + "\n  File \"x.py\", line 3, in f\n"
    noise = "step 1 loss 0.5 device=cuda:0\n" * 40
    log = (wrapped + noise + cut_off + noise) * (2 * EXACT_BELOW // len(wrapped + noise + cut_off + noise) + 1)
    scanner = Scanner()
    for i in range(0, len(log), BLOCK // 4):
        scanner.feed(log[i: i + BLOCK // 4])
    scanner.feed("", final=True)
    found = {(g.fields.get("a"), g.fields.get("b"), g.fields.get("method")): g.count for g in scanner.groups.values()}
    half = log.count(wrapped)
    assert found[("cuda:0", "cpu", "wrapper_CUDA_addmm")] == half, found
    assert found[("cuda:0", None, None)] == half, found  # the line after it is a frame: no second device

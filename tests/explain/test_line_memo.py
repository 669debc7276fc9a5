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


def stamped(lines: int) -> str:
    """A log whose every line carries its own time stamp or rank tag, as ComfyUI, ``logging`` and torchrun write."""
    rows = [CPU_GPU, "cpu!", "  File \"train.py\", line 3, in step", TYPES, "\x1b[31m" + TYPES + "\x1b[0m",
            "Traceback (most recent call last):", "torch.cuda.OutOfMemoryError: " + TYPES.lower()]
    heads = ("2025-05-28T10:00:{:09.6f} - ", "2025-03-01 12:00:{:06.3f} ERROR ", "[rank{:.0f}]: ", "[rank{:.0f}]:",
             "2025-03-01 12:00:{:06.3f} ", "2025-05-28T10:00:01Z | ", "[2025-03-01 12:00:{:06.3f}] INFO ",
             "12:00:{:06.3f} | ")
    return "\n".join(heads[i % len(heads)].format(i % 60 + i / 997) + rows[i % len(rows)] for i in range(lines))


def test_a_loggers_prefix_is_left_out_of_what_a_line_is_remembered_by() -> None:
    pf, _ = _anchor_table()
    text = stamped(20_000)
    assert len(text) > EXACT_BELOW
    memo = new_memo()
    got = list(pf.hits(text, 0, len(text), memo))
    assert got == walk_whole(text, 0, len(text))  # positions as the walk from each line's real start finds them
    # each distinct text after a prefix once per prefix length (a level name stays in it): not once per time stamp
    by_length = {k: len(v) for k, v in memo.items() if k < 0}
    assert set(by_length) == {-28, -25, -23, -22, -14, -9, -8}, by_length  # [rank10]: is one longer than [rank2]:
    assert sum(by_length.values()) <= 2 * 7 * 8 and not memo[False], by_length


def test_a_prefix_is_left_out_only_where_no_anchor_or_key_can_start_inside_it() -> None:
    pf, _ = _anchor_table()
    assert pf._inert("2025-05-28T10:00:01.123456 -") and pf._inert("[rank0]:[rank0]:")
    assert not pf._inert("2025-03-01 12:00:01,123 error")  # "error about meta tensor" may start in it
    assert not pf._inert("2025-03-01 12:00:01 tbd") and not pf._inert("12:00 \x1b[0m")  # a pass character, a colour
    assert not pf._inert("2025-03-01 12:00:01 ,")  # ", in stft" may start at its last character

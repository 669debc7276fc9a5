"""Two speed paths of explain that must give exactly what the plain reading gives (issue 43 point 5):
a string read in place (``_explain.inplace``: one copy per block, not three) against the same string fed to the
scanner block by block, and the rule words' look-ups (``_explain.present``: a long context read through its
lines' shape, a word skipped behind a shorter absent one) against ``find_word`` on the context itself."""

from __future__ import annotations

import pytest

from torchdoctor._explain import api
from torchdoctor._explain.catalog import context_rules
from torchdoctor._explain.inplace import Text, feed_span
from torchdoctor._explain.present import Present, plans
from torchdoctor._explain.prefilter import EXACT_BELOW
from torchdoctor._explain.scanner import BLOCK, Scanner
from torchdoctor._explain.tokens import find_word

DEVICE = ("Traceback (most recent call last):\n  File \"/site-packages/bitsandbytes/nn/modules.py\", line 12, in fwd\n"
          "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
          "cpu! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)\n")
TYPES = "RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.FloatTensor) should be the same\n"
BAR = " 41%|\u2588\u2588\u2588\u2588      | 412/1000 [02:13<03:10,  3.09it/s, loss=0.4121]"


def _by_blocks(text: str) -> list[object]:
    """The scanner's state after ``text`` fed as ``explain`` fed a string before: one slice per block."""
    sc = Scanner()
    for i in range(0, len(text), BLOCK):
        sc.feed(text[i: i + BLOCK])
    sc.feed("", final=True)
    return _state(sc)


def _in_place(text: str) -> tuple[list[object], bool]:
    sc = Scanner()
    seen: list[int | None] = []
    for i in range(0, len(text), BLOCK):
        feed_span(sc, text, i, min(i + BLOCK, len(text)))
        seen.append(sc.raw_at)
    sc.feed("", final=True)
    return _state(sc), all(at is not None for at in seen[:-1])


def _state(sc: Scanner) -> list[object]:
    return [sc.hits, sc.seq, sc.floor, sc.prev_end] + [
        (g.sig.name, g.fields, g.count, g.last, g.contexts, g.message, g.evidence) for g in sc.groups.values()]


def _app_log(size: int, crlf_at: int = -1, cr_end_at: int = -1) -> str:
    """Progress bars redrawn with carriage returns, an error now and then; ``crlf_at``: one Windows line end there;
    ``cr_end_at``: a block that ends in a carriage return whose next block starts with a line end."""
    parts, n, i = [], 0, 0
    while n < size:
        line = (DEVICE if i % 2 else TYPES) if i % 97 == 3 else "\r".join([BAR] * 6)
        parts.append(line)
        n += len(line) + 1
        i += 1
    text = "\n".join(parts)[:size]
    if crlf_at >= 0:
        text = text[:crlf_at] + "\r\n" + text[crlf_at + 2:]
    if cr_end_at >= 0:
        text = text[:cr_end_at - 1] + "\r\n" + text[cr_end_at + 1:]
    return text


@pytest.mark.parametrize("case", ["bars", "plain", "crlf late", "cr at a block's end", "short end"])
def test_a_string_read_in_place_leaves_the_scanner_as_its_blocks_do(case: str) -> None:
    size = 3 * BLOCK + (EXACT_BELOW // 2 if case == "short end" else 5000)
    text = {"bars": lambda: _app_log(size), "plain": lambda: _app_log(size).replace("\r", " "),
            "crlf late": lambda: _app_log(size, crlf_at=2 * BLOCK + 777),
            "cr at a block's end": lambda: _app_log(size, cr_end_at=BLOCK),
            "short end": lambda: _app_log(size)}[case]()
    assert text.count("\n") > 1000 and "Expected all tensors" in text
    state, whole = _in_place(text)
    assert state == _by_blocks(text)
    assert state[0] > 50 and len(state) > 5  # hits and groups were found
    # the two clean logs are read in place to their last block; a Windows line end (or one split by a block's
    # end) sends the rest the ordinary way
    assert whole == (case in ("bars", "plain", "short end"))
    # and explain's answers are the same through both paths (iterating a Text gives its slices)
    assert api._explain_blocks(Text(text), None) == api._explain_blocks(list(Text(text)), None)


def test_a_block_without_a_line_end_is_kept_aside_as_before() -> None:
    text = TYPES + "x" * (2 * BLOCK) + "\n" + TYPES
    state, _ = _in_place(text)
    assert state == _by_blocks(text)
    assert api._explain_blocks(Text(text), None)[0].category == "input_weight_type_mismatch"


def _words() -> list[str]:
    return sorted({w for r in context_rules() for w in r.words})


CONTEXTS = [
    "file \"/site-packages/bitsandbytes/autograd/_functions.py\", line 462\nruntimeerror: ...",  # short
    ("2025-05-28t10:00:01.5 - requested to load sdxl\n" + BAR.lower() + "\n") * 300 + "load_in_4bit=true\npeft_model",
    (BAR.lower() + "\n") * 400 + "c:/users/me/comfyui/custom_nodes/x.py\n" + "an mps device, timestamps: 3\n",
    ("x" * 5000) + "\nlinear8bitlt 9 nf4 arm64 \udcff surrogate\n" + "lora_up lora_down\n" * 50,
]


@pytest.mark.parametrize("context", CONTEXTS, ids=["short", "stamped", "bars", "digits"])
def test_present_answers_every_rule_word_as_find_word_does(context: str) -> None:
    table = plans(context_rules(), _words())
    look = Present(context, table)
    got = {w: look(w) for w in _words()}
    assert got == {w: find_word(context, w) != -1 for w in _words()}
    assert any(got.values()) and not all(got.values())
    # asked in another order (the shorter words after the longer ones that hold them): the same answers
    again = Present(context, table)
    assert {w: again(w) for w in reversed(_words())} == got


def test_present_skips_a_word_behind_a_shorter_absent_one_and_reads_a_long_context_by_its_shape() -> None:
    table = plans(context_rules(), _words())
    assert table["bnb_4bit"][0] == "4bit" and table["get_peft_model"][0] == "peft_model"  # behind the shorter
    assert table["bitsandbytes"][1] == b"bitsandbytes" and table["4bit"][1] is None  # a digit: read in full
    assert table[r"\bmps\b"][2] and table[r"\bmps\b"][0] is None
    long = (BAR.lower() + "\n") * 400
    look = Present(long, table)
    assert not look("bnb_4bit") and look.known == {"4bit": False, "bnb_4bit": False}
    assert not look("bitsandbytes") and look._shape is not None and len(look._shape) < len(long) // 20

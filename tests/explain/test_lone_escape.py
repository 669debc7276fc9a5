"""A paste with an escape character that starts no terminal sequence (a garbled colour code) is read: it was
stripped of nothing, read again, and so on until the recursion limit, and explain answered nothing at all. The
character set choice ``tput sgr0`` writes after every colour (``ESC ( B``) is a sequence, removed with the colours."""

from __future__ import annotations

import pytest

from torchdoctor._explain.api import classify, explain
from torchdoctor._explain.prefilter import EXACT_BELOW

CASES = [
    ("\x1b\x9f RuntimeError: Expected all tensors to be on the same device, but found at least two devices, "
     "cuda:0 and cpu!", "device_mismatch"),
    ("\x1b[31mRuntimeError\x1b[0m: \x1b mat1 and mat2 must have the same dtype, but got Half and Float",
     "dtype_mismatch"),
    ("\x1b[1mERROR\x1b(B\x1b[m RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'",
     "unsupported_dtype_on_device"),
]


@pytest.mark.parametrize(("text", "category"), CASES)
def test_a_lone_escape_in_a_paste_is_read(text: str, category: str) -> None:
    found = explain(text)
    assert found and found[0].category == category
    assert classify(text) == category


def test_a_lone_escape_at_the_end_of_a_log_is_read() -> None:
    # the end of a log (a piece shorter than EXACT_BELOW left after the last block) is read the paste's way
    noise = "step 12 loss 0.41 lr 2e-05\n" * (EXACT_BELOW // 27 + 10)
    found = explain(noise + CASES[0][0] + "\n\x1b(Bdone\n")
    assert [d.category for d in found] == ["device_mismatch"]


def test_tput_character_set_choices_are_colours_removed_from_the_evidence() -> None:
    # ``tput sgr0`` writes ESC ( B (back to the ASCII character set) after every colour: as a paste and in a log
    line = "\x1b[1m\x1b[31mERROR\x1b(B\x1b[m RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'"
    for text in (line, "step 1\n" * (EXACT_BELOW // 7 + 10) + line + "\n" + "step 2\n" * 100):
        found = explain(text)
        assert found[0].category == "unsupported_dtype_on_device"
        assert found[0].evidence[0] == "ERROR RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'"

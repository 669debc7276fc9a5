"""explain reads a log's repeated paragraphs once and replays what it did with them (``_explain.chunks``, issue 43
point 5): the scanner's state after a log (hits, groups with their counts, last sequence numbers, contexts and
fields, the context's floor) and the diagnoses must be exactly what reading every paragraph gives."""

from __future__ import annotations

import pytest

from torchdoctor._explain import api, chunks
from torchdoctor._explain.prefilter import EXACT_BELOW
from torchdoctor._explain.scanner import BLOCK, Scanner

DEVICE = ("Traceback (most recent call last):\n  File \"train.py\", line 12, in step\n    out = model(x)\n"
          "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
          "cpu! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)\n")
TYPES = "RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.FloatTensor) should be the same\n"
# a message whose ``follow`` lines run past its paragraph into the next one (what must follow it is recorded)
XFORMERS = ("NotImplementedError: No operator found for `memory_efficient_attention_forward` with inputs:\n"
            "     query       : shape=(1, 4096, 1, 512) (torch.float32)\n")
FRAMES = "  File \"/site-packages/bitsandbytes/autograd/_functions.py\", line 462, in forward\n"
NOISE = "step 12 loss 0.41 lr 2e-05\n"
HALF = "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'\n"


def _log(n: int) -> str:
    """Paragraphs (each followed by a blank line) in a fixed rotation with a few variations: most repeat with the
    same neighbours, some with others, one error appears only late."""
    paras = [DEVICE, TYPES, XFORMERS, FRAMES + NOISE, NOISE * 3, DEVICE.replace("mat1", "mat2"), TYPES]
    out = []
    for i in range(n):
        out.append(paras[i % len(paras)] if i % 97 else paras[(i * 7) % len(paras)])
        if i == n - 50:
            out.append(HALF)
    return "\n".join(out)


def _state(text: str, block: int) -> list[object]:
    sc = Scanner()
    for i in range(0, len(text), block):
        sc.feed(text[i: i + block])
    sc.feed("", final=True)
    return [sc.hits, sc.seq, sc.floor, sc.prev_end, sc.replayed] + [
        (g.sig.name, g.fields, g.count, g.last, g.contexts, g.message, g.evidence) for g in sc.groups.values()]


@pytest.mark.parametrize("block", [BLOCK, EXACT_BELOW + 1000])
def test_replayed_paragraphs_leave_the_scanner_as_reading_them_does(block: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    text = _log(30_000)
    assert len(text) > 2 * EXACT_BELOW  # a log, not a paste
    replayed = _state(text, block)
    assert replayed[4] > 20_000  # most paragraphs were replayed
    monkeypatch.setattr(chunks, "_TRY", -1)  # the first paragraph not replayed turns replays off
    read = _state(text, block)
    assert read[4] == 0
    assert replayed[:4] == read[:4] and replayed[5:] == read[5:]
    counts = {g[0]: g[2] for g in replayed[5:]}  # type: ignore[index]
    assert counts["unsupported.kernel"] == 1 and counts["backend.xformers"] > 2000  # the late one counted once


def test_replayed_paragraphs_give_the_same_diagnoses(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _log(30_000)
    fast = api.explain(text)
    monkeypatch.setattr(chunks, "_TRY", -1)
    slow = api.explain(text)
    assert [repr(d) for d in fast] == [repr(d) for d in slow]
    # the mat1 / mat2 errors come after the bitsandbytes frames' paragraph: read as the quantization layer's
    assert {d.category for d in fast} >= {"quantization_device", "input_weight_type_mismatch", "backend_op_missing",
                                          "unsupported_dtype_on_device"}
    assert sum(d.count for d in fast) > 15_000


def test_a_blank_line_ends_a_message_read_over_several_lines() -> None:
    """The xformers message is read over its next lines (``follow``), up to a blank line only: the error in the next
    paragraph is its own (counted every time, its dtype not read as the xformers message's), and every paragraph
    after the first reading is replayed (nothing it read reaches into the next one)."""
    text = "\n".join([XFORMERS, TYPES, XFORMERS, HALF] * 2000)
    sc = Scanner()
    for i in range(0, len(text), BLOCK):
        sc.feed(text[i: i + BLOCK])
    sc.feed("", final=True)
    counts = {g.sig.name: g.count for g in sc.groups.values()}
    assert counts == {"backend.xformers": 4000, "input_weight.types": 2000, "unsupported.kernel": 2000}
    xformers = next(g for g in sc.groups.values() if g.sig.name == "backend.xformers")
    assert "HalfTensor" not in str(xformers.fields) and "Half'" not in xformers.message
    assert sc.replayed > 7900 and sc.tried <= 4
    found = api.explain(text)
    assert [d.signature for d in found if d.count == 4000] == ["backend.xformers"]

"""explain never raises and stays linear: fuzzing, adversarial strings, a 50 MB log, block boundaries.

Speed targets live in bench/explain.py; the timeouts here are only hang guards.
"""

from __future__ import annotations

import functools
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdoctor._explain import api as _explain
from torchdoctor._explain import scanner as _explain_scan
from torchdoctor._explain.api import Diagnosis, ExplainReport, classify, explain
from torchdoctor._explain.catalog import CATEGORIES, signatures

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
ANCHORS = sorted({a for s in signatures() for a in s.anchors})
ANCHORS += [a.upper() for a in ANCHORS[:20]]
BNB_FRAME = '  File "/site-packages/bitsandbytes/autograd/_functions.py", line 462, in forward'
CPU_GPU = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


def body(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8").partition("\n---\n")[2]


def run_guarded(fn: Callable[[], Any], timeout: float = 120.0) -> Any:
    """Run fn in a thread; fail (instead of hanging the suite) if it does not finish in time."""
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.setdefault("out", fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"explain did not finish within {timeout} s"
    return box.get("out")


def check(result: object) -> None:
    assert isinstance(result, ExplainReport)
    for d in result:
        assert isinstance(d, Diagnosis) and d.category in CATEGORIES and 0.0 <= d.confidence <= 1.0
        assert d.fixes and d.likely_causes and d.evidence
        assert all(a.category in CATEGORIES and a.category != d.category and 0 <= a.confidence < d.confidence
                   for a in d.alternatives)
        assert "{" not in d.what_happened and "this backend" not in str(d)


pieces = st.one_of(st.sampled_from(ANCHORS), st.text(max_size=40),
                   st.sampled_from(["(", ")", ":", " ", "\n", "\r", "\x1b[31m", "cuda:0", "cpu", "meta", "'", "`",
                                    "c10::Half", "torch.cuda.FloatTensor", "[", "]", "!", "\\", "\x00", "é字"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pieces, max_size=60).map("".join))
def test_fuzz_never_raises(text: str) -> None:
    check(explain(text))
    classify(text)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=2000))
def test_fuzz_bytes(data: bytes) -> None:
    check(explain(data))


def test_odd_inputs() -> None:
    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no")

    class BrokenExc(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    a, b = RuntimeError(CPU_GPU[14:]), ValueError("loop")
    a.__context__, b.__context__ = b, a  # a cycle
    for obj in (None, 12, Broken(), BrokenExc(), a, b"\xff\xfe\x00", bytearray(b"Input type ("), "", "\n" * 1000):
        check(explain(obj))
    assert explain(a)[0].category == "device_mismatch"
    assert classify(None) is None  # type: ignore[arg-type]


def test_adversarial_strings_are_linear() -> None:
    n = 5_000_000
    cases = ["(" * n, ":" * n, " " * n, "Input type (" * (n // 12), "\n" * n, "cuda:0 and " * (n // 11),
             ("x" * 200 + " and must have the same dtype") * (n // 230), "'" * n + "arguments from the '" * 1000,
             ("Could not run '" + "a" * 119) * (n // 134), "[" * n + "is only available for these backends: [",
             "".join(a + " " for a in ANCHORS) * (n // 1500), "\x1b[" * (n // 2)]
    for text in cases:
        check(run_guarded(functools.partial(explain, text), timeout=60))


def test_fifty_megabyte_log() -> None:
    noise = ("Epoch 3/10:  41%|████      | 412/1000 [02:13<03:10,  3.09it/s, loss=0.4121]\n"
             '  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1553, in _call_impl\n'
             "2025-01-26T17:16:01.147679 - model weight dtype torch.bfloat16, manual cast: None\n") * 2000
    errors = [body(n) for n in ("quant__trl_2760.txt", "no_accel__nanoGPT_281.txt", "indexing__PET_4.txt",
                                "deserialize__Cutie_37.txt", "backend_op__ComfyUI-Impact-Pack_915.txt")]
    parts, size, i = [], 0, 0
    while size < 50_000_000:
        chunk = noise if i % 2 else errors[(i // 2) % len(errors)] + "\n" + noise
        parts.append(chunk)
        size += len(chunk)
        i += 1
    log = "".join(parts)
    found = run_guarded(lambda: explain(log), timeout=300)
    assert {d.category for d in found} == {"quantization_device", "no_accelerator", "cpu_gpu_indexing",
                                           "deserialize_device", "backend_op_missing"}
    assert all(d.count >= 5 for d in found)  # each error once, with how often it was seen


def test_error_across_block_boundary() -> None:
    """Frames in one block and the error line in the next (or the line cut in two) are still one error."""
    block = _explain_scan.BLOCK
    frames = BNB_FRAME + "\n"
    for split in (len(frames), len(frames) + 20):  # between frames and message / inside the message
        pad = "x" * 70 + "\n"
        head = pad * ((block - split) // len(pad))
        head += "y" * (block - split - len(head) - 1) + "\n"
        text = head + frames + CPU_GPU + "\n" + pad * 10
        assert text.index(CPU_GPU) == block - (split - len(frames))
        found = explain(text)
        assert [d.category for d in found] == ["quantization_device"], split


def test_file_stream_equals_string(tmp_path: pathlib.Path) -> None:
    text = "\n".join(body(p.name) for p in sorted(FIXTURES.glob("*.txt"))) * 3
    path = tmp_path / "all.log"
    path.write_text(text, encoding="utf-8")
    with open(path, encoding="utf-8", newline=None) as fh:
        streamed = _explain.explain_stream(fh)
    direct = explain(text)
    assert [(d.category, d.what_happened, d.count) for d in streamed] == \
        [(d.category, d.what_happened, d.count) for d in direct]
    assert len(direct) >= 60


def test_every_signature_reads_without_fields() -> None:
    """A message cut before its fields (a truncated paste) still gets a sentence: every field of ``what`` is
    optional or has a neutral default, and one failing diagnosis never hides the others in a log."""
    for sig in signatures():
        assert _explain._try(sig.what, {}) is not None, sig.name
    log = "\n".join(a for a in ANCHORS) + "\n" + CPU_GPU
    found = explain(log)
    check(found)
    assert "device_mismatch" in {d.category for d in found}


def test_one_pass_prefilter_finds_what_every_anchor_finds() -> None:
    """The fast path (a log: keys on the raw text) finds every anchor a plain lower-cased search finds, on every
    real text, also in title case and in capitals for the anchors written so (identifiers, titles)."""
    from torchdoctor._explain.prefilter import _BACK, EXACT_BELOW, key_of

    prefilter, _ = _explain_scan._anchor_table()
    assert all(a.find(key_of(a)) < _BACK for a in prefilter.anchors if key_of(a))
    texts = [_explain_scan.normalise(body(p.name)) for p in sorted(FIXTURES.glob("*.txt"))]
    texts += ["RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx`",
              "RuntimeError: Unhandled FakeTensor Device Propagation for aten.mm.default, found two different devices"]
    pad = "." * EXACT_BELOW + "\n"  # long enough to take the fast path
    # "RuntimeError: UR error" (an Intel GPU's bare runtime error, sigs_twelve) holds no case-stable key with a pass
    # character; the eighteenth collection's first text of it showed the fast path misses it in a long log (open)
    unkeyable = {i for i, a in enumerate(prefilter.anchors) if a == "runtimeerror: ur error"}
    for text in texts:
        low = text.lower()
        want = {i for i, a in enumerate(prefilter.anchors) if a in low} - unkeyable
        got = {i for _, i in prefilter.hits(pad + text, len(pad), len(pad) + len(text))}
        assert want <= got, (text[:200], {prefilter.anchors[i] for i in want - got})


def _cpu_time(fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(2):  # the shorter of two runs: a busy machine slows one run, rarely both
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


# Texts built against the prefilter's passes: keys without their anchors (near-matches), keys overlapping on one
# endless line, every anchor at once (both sizes take the fast path: over EXACT_BELOW), anchors repeated line after line, a pass character and nothing else.
NEAR = ["ted all tensor" * 40 + "\n", "t type (" * 500, "".join(a + " " for a in ANCHORS) + "\n",
        CPU_GPU + "\n", "t" * 1000, "_efficient_at" * 300 + "\n", "vailable " * 200 + "\n", "oes not exis" * 400,
        # escapes (issue 41): JSON-escaped quotes on one endless line and line after line, \uXXXX and HTML entities
        '\\"' * 2000, '\\"x\\\\n' * 50 + "\n", "\\u0027&#39;&quot;" * 400 + "\n", "&#x" * 1000,
        '{"exception_message": "\\"addmm_impl_cpu_\\" not implemented for \\u0027Half\\u0027"}\n']


def test_time_grows_linearly_on_adversarial_text() -> None:
    """Four times the text costs about four times the time (compared in this process, so the machine's speed and
    load cancel; the bound is generous, only a superlinear path fails it)."""
    for unit in NEAR:
        small = unit * (300_000 // len(unit) + 1)
        big = small * 4
        t1 = _cpu_time(lambda: run_guarded(functools.partial(explain, small), timeout=120))
        t4 = _cpu_time(lambda: run_guarded(functools.partial(explain, big), timeout=240))
        assert t4 < 4 * 2.5 * max(t1, 0.01), (unit[:40], t1, t4)


def test_a_log_is_folded_where_it_is_examined() -> None:
    """A log too long to be a paste is not folded whole (speed); the lines around an error are, so full-width
    punctuation and U+0130 (whose lower case is two characters) next to an error neither shift positions nor hide
    the fields."""
    noise = "İstanbul  step 12 loss 0.41\uff08ok\uff09 \u3000█████\n" * 20_000
    line = "RuntimeError\uff1aİ Expected all tensors to be on the same device\uff0c but found at least two devices\uff0c " \
           "cuda:0 and cpu\uff01"
    text = noise + BNB_FRAME + "\n" + line + "\n" + noise
    assert len(text) > _explain_scan.EXACT_BELOW
    found = explain(text)
    assert [d.category for d in found] == ["quantization_device"]
    assert "cuda:0 and cpu" in found[0].what_happened
    assert all("\uff0c" not in e for e in found[0].evidence)


def test_a_line_made_of_keys_still_shows_its_anchor() -> None:
    """Past 32 keys on one line the rest of the line is read in one call (speed on garbage); an anchor there is
    still found, on the fast path too."""
    from torchdoctor._explain.prefilter import EXACT_BELOW

    line = "ut type (" * 100 + "RuntimeError: expected scalar type Float but found Half"
    pad = "." * EXACT_BELOW + "\n"
    for text in (line, pad + line):
        found = explain(text)
        assert [d.category for d in found][:1] == ["dtype_mismatch"], text[-80:]

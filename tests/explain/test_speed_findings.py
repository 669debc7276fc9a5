"""Speed never costs a finding: the bench's 50 MB log (``bench/explain.py``) gets the same diagnoses (category,
signature, count, what happened) as before the speed work of issue 28 — ``golden_50mb.json`` was written by the
explain of commit 79519ec — in process, streamed from a file and through the CLI.

When the signature or cause tables change on purpose, rewrite the file with ``python bench/explain.py --golden``
and say why in the commit.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import subprocess
import sys
from types import ModuleType
from typing import Any

from torchdoctor._explain import api as _explain
from torchdoctor._explain.prefilter import EXACT_BELOW

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = pathlib.Path(__file__).parent / "golden_50mb.json"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_explain", ROOT / "bench" / "explain.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(diagnoses: Any) -> list[list[Any]]:
    return sorted([d["category"], d["signature"], d["count"], d["what_happened"]] if isinstance(d, dict) else
                  [d.category, d.signature, d.count, d.what_happened] for d in diagnoses)


def test_fifty_megabyte_bench_log_keeps_every_diagnosis(tmp_path: pathlib.Path) -> None:
    bench = _bench()
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    # 113: the log is drawn from fixtures/, which issue 41 grew; against the explain before issue 41 on the same log
    # the only changes are float8 on MPS (its own family), "BFloat16 is not supported on MPS" naming its dtype, a file of
    # MPS tensors loaded on Linux (deserialize_device), "Trying to deserialize" and the new MPS wordings; 114: the
    # webui launcher's own "Torch is not able to use GPU" is a family of its own since issue 40 point 6 (one row more);
    # 113: one error printed twice in a row, short then in full (a rich box's source line, then its message), is one
    # diagnosis since session 11 (two equal "meta device ... no value" rows became one with both counts); 114: a
    # generator on another device is a family of its own (it was told as a CUDA-only call, the wrong way round); 115:
    # autocast's "Current CUDA Device does not support bfloat16" is a family of its own (it was counted with cuBLAS's
    # bf16 matmul error: one row more, that row's count one less); 117: session 26 added 103 tuning texts to fixtures/,
    # which redraws the log (every count moves); on that log the explain before session 26 gives 115 rows and this one
    # the same 115 plus two new families' rows (an MPS kernel refusing int64, an Intel GPU's "Double type is not
    # supported on this platform" told as float64 on XPU); 132: session 26b added 90 tuning texts to fixtures/, which
    # redraws the log again; on that log the explain before session 26b gives 125 rows and this one 132: the new
    # families' rows (autocast for a device type torch lacks, DirectML's unbox check, NCCL's dense CUDA tensors,
    # torch.embedding's older wording, torch.where's operands, an Ascend NPU kernel's dtype, an extension library with an
    # undefined torch symbol), hipErrorNoBinaryForGpu and a quoted bitsandbytes ".to" counted with their families, and a
    # conv kernel reached with QuantizedCPU tensors filed as the quantized op it is (it was read as a device mismatch);
    # 159: session 26c added 84 tuning texts to fixtures/, which redraws the log; on that log the explain before
    # session 26c gives 152 rows and this one the same 152 plus seven rows of its new families (a sparse tensor's
    # indices and values on two devices, twice; a CUDA-only op's is_cuda() check; the legacy "expected backend ... and
    # dtype" wording; FakeTensor's device cross-check; a data-parallel wrapper's bucket on two devices; NCCL's dtypes);
    # 149: session 27 added 57 texts to fixtures/, which redraws the log; on that log the explain before session 27
    # gives 148 rows and this one the same 148 plus one row of its new families (bitsandbytes loading its CPU library);
    # 159: session 28 added 75 texts to fixtures/, which redraws the log; on that log the explain before session 28
    # gives 154 rows and this one the same 154 plus five rows of its new families (torch without its MPS backend,
    # IPEX's AVX512 binary, torch 1.x's "expected them to be on GPU", _scaled_mm's float scales, inductor lowering
    # for MPS), one of them reworded (the legacy input/weight sentence names the weight's type in brackets); 156:
    # session 29 added 57 texts to fixtures/, which redraws the log; on that log the explain before session 29 gives
    # 150 rows and this one the same 150 plus six rows of its new families (torch's sm_120 capability warning, three
    # rows; oneDNN's primitive and engine on an Intel GPU; flash-attn's pre-Ampere refusal); 152: session 31 added 43
    # texts to fixtures/, which redraws the log; on that log the explain before session 31 gives 148 rows, this one the
    # same less one false row (transformers' "Sliding Window Attention is enabled but not implemented for `sdpa`" read
    # as a kernel missing a dtype, three times) plus five rows of its new families (Torch-TensorRT's missing converter
    # and refused dtype, DGL's feature on another device, DirectML's PrivateUse1 assert, XPU devices not initialised)
    assert len(want) == 152
    log = bench.synthetic_log(50_000_000)
    assert _rows(_explain.explain(log)) == want
    path = tmp_path / "train.log"
    path.write_text(log, encoding="utf-8")
    del log
    with open(path, encoding="utf-8", errors="replace", newline=None) as fh:
        assert _rows(_explain.explain_stream(fh)) == want
    done = subprocess.run([sys.executable, "-m", "torchdoctor", "explain", str(path), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert _rows(json.loads(done.stdout)["diagnoses"]) == want


# What colours a line in real logs: loggers colour whole lines or level names; rich's highlighter colours brackets,
# quoted strings, numbers, ``name=``, True/False/None and paths inside a message.
_HIGHLIGHT = re.compile(r"""'[^'\n]{0,40}'|"[^"\n]{0,40}"|(?<!\w)-?\d+(?:\.\d+)?\b|[()\[\]{}]|\b\w{1,30}=|"""
                        r"""\b(?:True|False|None)\b|(?:/[-\w.+]+)+/""")


def _coloured(text: str) -> str:
    lines = [_HIGHLIGHT.sub(lambda m: "\x1b[1;36m" + m.group() + "\x1b[0m", line) for line in text.split("\n")]
    return "\n".join("\x1b[31m" + line + "\x1b[0m" if i % 3 == 0 else line for i, line in enumerate(lines))


def test_colours_inside_lines_of_a_log_hide_nothing() -> None:
    """A log keeps its colours until a line is examined (removing them was a fifth of the time): every real text
    (tuning and held-out), coloured as loggers and rich colour it and put in a log, gets the diagnoses it gets
    without colours."""
    bench = _bench()
    pad = ("\n".join(bench.NOISE) + "\n") * (EXACT_BELOW // 400)
    after = "\n" + "\n".join(bench.NOISE) * 20  # past the last lines, which are read whole (a short text)
    assert len(pad) > EXACT_BELOW
    paths = sorted((ROOT / "tests" / "explain").glob("fixtures/*.txt"))
    paths += sorted((ROOT / "tests" / "explain").glob("holdout/*.txt"))
    assert len(paths) > 400
    coloured = 0
    for path in paths:
        body = path.read_text(encoding="utf-8").partition("\n---\n")[2]
        plain = [(d.category, d.what_happened, d.count) for d in _explain.explain(pad + body + after)]
        text = _coloured(body)
        coloured += "\x1b[1;36m" in text
        got = [(d.category, d.what_happened, d.count) for d in _explain.explain(pad + text + after)]
        assert got == plain, path.name
    assert coloured > 350  # texts with a bracket, quote, number, name= or path inside a line

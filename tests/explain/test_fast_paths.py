"""Shortcuts of explain's diagnoses that must give exactly what the plain way gives (issue 43 point 5): the device
and dtype tokens found only where one can start, and filled templates remembered per text."""

from __future__ import annotations

import pathlib
import random

import pytest

from torchdoctor._explain import fill, tokens
from torchdoctor._explain.catalog import causes

HERE = pathlib.Path(__file__).parent
WORDS = ("torch. c10:: device(type='cuda', index=1) device(type=\"mps\") on CPU to be on GPU cuda:0 CUDA:1 Cuda cpu "
         "xpu:3 mps meta hpu npu XLA torch.cuda.HalfTensor torch.FloatTensor CUDABFloat16Type CPUFloatType "
         "torch.float16 c10::BFloat16 struct c10::Half long int Half half Float float Double Long Int Short Char Byte "
         "Bool fp16 bf16 fp32 Float8_e4m3fn float8_e5m2fnuz complex64 ComplexHalf int8 uint8 int64 bfloat16 .cuda( "
         "x.cpu() _cuda cuda_ cuda. :cuda cuda:x 1cuda a.float( Float.").split(" ")
SEPS = (" ", "", ".", "_", "(", ")", ":", "'", '"', ",", "\n", "x", "1", "\u00e9", "::", "/")


def _texts() -> list[str]:
    texts = [p.read_text(encoding="utf-8") for p in sorted(HERE.rglob("*.txt"))]
    rng = random.Random(0)
    texts += ["".join(rng.choice(WORDS) + rng.choice(SEPS) for _ in range(rng.randrange(1, 8)))
              for _ in range(20_000)]
    return texts


def test_tokens_are_found_where_the_full_pattern_finds_them() -> None:
    # the fast start pattern must hold every word a token can start with; a word added to _TOKEN alone fails here
    checked = 0
    for text in _texts():
        for variant in (text, text.upper(), text.swapcase()):
            want = [(m.span(), m.groupdict()) for m in tokens._TOKEN.finditer(variant)]
            assert [(m.span(), m.groupdict()) for m in tokens._tokens(variant)] == want, variant[:200]
            checked += 1
    assert checked > 60_000


@pytest.mark.parametrize("fields", [
    {"a": "cuda:0", "b": "cpu", "op": "aten::addmm"},
    {"a": "cuda:0"},
    {},
    {"a": "{b}", "b": "cpu", "target": "cuda:1", "low": "float16"},  # a brace in a value: filled the plain way
])
def test_filled_templates_are_what_filling_them_again_gives(fields: dict[str, str]) -> None:
    fill.forget()
    for cause in causes().values():
        for template, prose in [(cause.text, True), (cause.confirm, False)] + [
                (t, True) for t, _ in cause.fixes] + [(c, False) for _, c in cause.fixes]:
            first = fill.fill_or_none(template, fields, prose)
            again = fill.fill_or_none(template, fields, prose)  # from the memo now
            try:
                plain: str | None = fill._fill(template, fields, prose)
            except fill.Missing:
                plain = None
            assert first == again == plain, template

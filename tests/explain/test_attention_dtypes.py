"""scaled_dot_product_attention's "Expected query, key, and value to have the same dtype" is an attention error, not
a matrix multiply's: its own title and sentence name the query's dtype and the operand that differs (the key, or the
value where the key has the query's dtype), the category stays dtype_mismatch, the KV/prompt-cache cause stays first,
and the operand fix casts the odd operand to the query's dtype (the direction the cache fix takes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchdoctor import explain

ATTENTION = "Attention got query, key and value in different dtypes"
MATMUL = "Matrix multiply with two different dtypes"


def _sdpa_error(q: torch.dtype, k: torch.dtype, v: torch.dtype) -> RuntimeError:
    t = [torch.randn(1, 2, 3, 8, dtype=d) for d in (q, k, v)]
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same dtype") as info:
        F.scaled_dot_product_attention(*t)
    return info.value


def test_torchs_own_message_a_bfloat16_query_against_a_float32_cache() -> None:
    [d] = explain(_sdpa_error(torch.bfloat16, torch.float32, torch.float32))
    assert (d.category, d.title, d.signature) == ("dtype_mismatch", ATTENTION, "dtype.attention_qkv")
    assert d.what_happened == ("Attention (scaled_dot_product_attention) got query, key and value in different "
                               "dtypes: the query is bfloat16, the key float32. All three must share one dtype.")
    assert d.likely_causes[0].startswith("The query is in the model's dtype but key and value are in another: a KV")
    codes = [code for _, code in d.fixes]
    assert "k, v = k.to(q.dtype), v.to(q.dtype)" in codes
    # the odd operand is the float32 key, cast to the query's bfloat16; never the query to float32
    assert "t = t.bfloat16()  # t: the operand that is float32" in codes
    assert not any("t = t.float()" in c for c in codes)


def test_only_the_value_differs() -> None:
    [d] = explain(_sdpa_error(torch.float32, torch.float32, torch.float16))
    assert d.title == ATTENTION
    assert "the query is float32, the value float16." in d.what_happened


@pytest.mark.parametrize("text,query,other", [
    # MSVC spells c10 types "struct c10::Half"; a later wording puts commas between the three
    ("RuntimeError: Expected query, key, and value to have the same dtype, but got query.dtype: struct c10::Half "
     "key.dtype: float and value.dtype: float instead.", "float16", "the key float32"),
    ("Inference failed: Expected query, key, and value to have the same dtype, but got query.dtype: float, "
     "key.dtype: struct c10::Half, and value.dtype: struct c10::Half instead.", "float32", "the key float16"),
    ("!!! Exception during processing !!! Expected query, key, and value to have the same dtype, but got "
     "query.dtype: float key.dtype: float and value.dtype: struct c10::Half instead.", "float32", "the value float16"),
])
def test_quoted_wordings_name_the_query_and_the_odd_operand(text: str, query: str, other: str) -> None:
    [d] = explain(text)
    assert (d.category, d.title) == ("dtype_mismatch", ATTENTION)
    assert f"the query is {query}, {other}." in d.what_happened


@pytest.mark.parametrize("text", [
    "RuntimeError: Expected query, key, and value to have the same dtype",
    "Server execution error: expected query, key and value to have the same dtype",  # a paraphrase, no comma
])
def test_without_the_dtypes_one_attention_diagnosis(text: str) -> None:
    [d] = explain(text)
    assert (d.category, d.title) == ("dtype_mismatch", ATTENTION)
    assert d.what_happened == ("Attention (scaled_dot_product_attention) got query, key and value in different "
                               "dtypes. All three must share one dtype.")
    assert any(c.startswith("The query is in the model's dtype but key and value") for c in d.likely_causes[:2])


def test_matrix_multiplies_keep_their_title() -> None:
    with pytest.raises(RuntimeError) as info:
        F.linear(torch.randn(2, 3, dtype=torch.bfloat16), torch.randn(2, 3))
    texts = [str(info.value), "RuntimeError: mat1 and mat2 must have the same dtype, but got Float and BFloat16",
             "RuntimeError: Input tensors must have the same dtype",
             "RuntimeError: expected self and mat2 to have the same dtype, but got: c10::Half != float"]
    for text in texts:
        [d] = explain(text)
        assert (d.category, d.title, d.signature) == ("dtype_mismatch", MATMUL, "dtype.same_dtype"), text
    [d] = explain(texts[0])
    assert d.what_happened == "A matrix multiply (m1 @ m2) got two dtypes, bfloat16 and float32. Both operands must " \
                              "share one dtype."

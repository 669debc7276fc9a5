"""Which side of a layer is the odd one out, when an error names the dtype of its input and of its weights.

"Input type (c10::BFloat16) and bias type (float)" and "mat1 and mat2 must have the same dtype, but got BFloat16
and Float" say which tensor is the input and which the layer's: a fix then casts the side that differs, never a
tensor to the dtype the text says it already has (casting a bf16 input "to the model's dtype" does nothing when the
model is bf16 and only this bias stayed float32).

Flags: ``input_odd`` (a float32, float64 or integer input met reduced-precision or float32 weights: the input was
not cast), ``layer_odd`` (a reduced-precision input met weights in another float dtype: the cast left this layer
behind), ``weight_storage`` (integer or float8 weights: a storage dtype, never a cast target for activations and
never cast to a float by a plain ``.to``). Torch-free.
"""

from __future__ import annotations

__all__ = ["MATMUL_INPUT", "sides"]

_WIDE = ("float32", "float64")
_REDUCED = ("float16", "bfloat16")
# the names torch's matmul checks give the input of F.linear / mm / bmm ("mat1" of addmm, "m1" of the CPU blas
# check, "self" of mm): the other operand is the weight (or the second activation of a plain matmul)
MATMUL_INPUT = ("mat1", "m1", "self", "input")


def _is_float(t: str) -> bool:
    return t.startswith(("float", "bfloat")) and not t.startswith("float8")


def sides(ti: str, tw: str) -> frozenset[str]:
    """The flags for an input of dtype ``ti`` meeting weights of dtype ``tw`` (names as ``tokens`` gives them).

    >>> sorted(sides("bfloat16", "float32")), sorted(sides("float32", "float16")), sorted(sides("uint8", "float32"))
    (['layer_odd'], ['input_odd'], ['input_odd'])
    >>> sorted(sides("float32", "uint8")), sorted(sides("float16", "bfloat16")), sorted(sides("float32", "float64"))
    (['weight_storage'], ['layer_odd'], ['layer_odd'])
    """
    if not ti or not tw or ti == tw:
        return frozenset()
    if not _is_float(tw):  # integer / float8 weights: dequantized by their layer, never what the input is cast to
        return frozenset({"weight_storage"})
    if not _is_float(ti) or ti == "float64" or (ti in _WIDE and tw in _REDUCED):
        return frozenset({"input_odd"})
    return frozenset({"layer_odd"})

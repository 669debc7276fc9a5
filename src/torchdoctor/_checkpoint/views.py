"""A tensor record's sizes, strides and storage offset, checked as torch checks them when it loads the file.

``torch.load`` (``weights_only`` or not) rebuilds each tensor with ``Tensor.set_(storage, offset, size,
stride)``: sizes and strides must be as many, each a non-negative 64-bit integer, the element count must not
overflow 64 bits, and unless the tensor is empty the last element it can address must lie inside the storage.
A record that breaks one of these is refused here with the reason, as torch refuses the file; one that passes
loads. Big numbers are never printed whole (a 1,000-digit size is "more than 64 bits").

>>> check_view([2, 3], [3, 1], 0, 4, 24)
((2, 3), (3, 1), 0)
>>> check_view([1000, 1000], [1000, 1], 0, 4, 8)
Traceback (most recent call last):
torchdoctor._checkpoint.views.BadRecord: tensor of sizes [1000, 1000], strides [1000, 1], storage offset 0 needs 4,000,000 bytes of its storage, which holds 8 (torch.load refuses it: "Trying to resize storage that is not resizable")
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

__all__ = ["BadRecord", "I64", "check_sizes", "check_view", "dims_text"]

I64 = 1 << 63
_SMALL = 1 << 48  # sizes, strides and offsets below this take check_view's one-pass path (products still checked)


class BadRecord(pickle.UnpicklingError):
    """A tensor record torch would refuse to load (the file is refused, with this reason)."""


def dims_text(values: Sequence[Any], shown: int = 6) -> str:
    """``[2, 3]``; a long or huge list shortened (``[1, 1, 1, 1, 1, 1, ... 60,000 dims]``)."""
    def one(v: Any) -> str:
        return str(v) if type(v) is int and -I64 <= v < 2 * I64 else "<more than 64 bits>" if type(v) is int else "?"

    items = [one(v) for v in list(values[:shown])]
    if len(values) > shown:
        items.append(f"... {len(values):,} dims")
    return "[" + ", ".join(items) + "]"


def _ints(values: Any, what: str, allow_negative: bool = False) -> tuple[int, ...]:
    if not isinstance(values, (tuple, list)):
        raise BadRecord(f"tensor {what} is a {type(values).__name__}, not a list of integers")
    for v in values:
        if type(v) is not int:
            raise BadRecord(f"tensor {what} {dims_text(values)} holds a {type(v).__name__}")
        if not -I64 <= v < I64:
            raise BadRecord(f"tensor {what} {dims_text(values)} holds a value of more than 64 bits "
                                         "(torch.load refuses it: \"Overflow when unpacking long\")")
        if v < 0 and not allow_negative:
            raise BadRecord(f"tensor {what} {dims_text(values)} holds a negative value (torch.load "
                                         "refuses it)")
    return tuple(values)


def check_sizes(size: Any) -> tuple[tuple[int, ...], int]:
    """Sizes as torch accepts them, and the element count (at most 2**63 - 1)."""
    shape = _ints(size, "sizes")
    numel = 1
    for s in shape:
        if s == 0:
            return shape, 0
    for s in shape:
        numel *= s
        if numel >= I64:
            raise BadRecord(f"tensor of sizes {dims_text(shape)} has more than 2**63 elements "
                                         "(torch.load refuses it: \"numel: integer multiplication overflow\")")
    return shape, numel


def check_view(size: Any, stride: Any, offset: Any, itemsize: int, storage_nbytes: int | None
               ) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(sizes, strides, offset) of a record torch would load over a storage of ``storage_nbytes`` bytes
    (None: a record without storage, sizes and strides only); ``pickle.UnpicklingError`` with the reason."""
    if type(size) is tuple and type(stride) is tuple and type(offset) is int and len(size) == len(stride) \
            and storage_nbytes is not None:  # the common record, in one pass; anything odd takes the full path
        last, numel = offset, 1
        for s, st in zip(size, stride):
            if type(s) is not int or type(st) is not int or not 0 < s < _SMALL or not 0 <= st < _SMALL:
                break
            numel *= s
            last += (s - 1) * st
        else:
            if 0 <= offset < _SMALL and numel < I64 and (last + 1) * itemsize <= storage_nbytes:
                return size, stride, offset
    shape, numel = check_sizes(size)
    strides = _ints(stride, "strides")
    if len(strides) != len(shape):
        raise BadRecord(f"tensor has {len(shape):,} sizes and {len(strides):,} strides (torch.load "
                                     f"refuses it: \"unequal size length ({len(shape)}) and stride length "
                                     f"({len(strides)})\")")
    if type(offset) is not int or not 0 <= offset < I64:
        raise BadRecord("tensor storage offset is not a non-negative 64-bit integer (torch.load "
                                     "refuses it)")
    if storage_nbytes is None or numel == 0:
        return shape, strides, offset
    last = offset + sum((s - 1) * st for s, st in zip(shape, strides))
    need = (last + 1) * itemsize
    if need > storage_nbytes:
        what = f"{need:,} bytes" if need < I64 else "more than 2**63 bytes"
        raise BadRecord(
            f"tensor of sizes {dims_text(shape)}, strides {dims_text(strides)}, storage offset {offset:,} needs "
            f"{what} of its storage, which holds {storage_nbytes:,} (torch.load refuses it: \"Trying to resize "
            "storage that is not resizable\")"
        )
    return shape, strides, offset

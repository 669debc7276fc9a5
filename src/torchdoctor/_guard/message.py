"""What a torch error message says about placement: whether it is a placement error at all (explain's categories,
then guard's own short list), its kind (device, dtype, meta) and the dtypes or devices it names."""

from __future__ import annotations

import logging
import re
from typing import Any

import torch

from torchdoctor._explain.tokens import devices_in, dtypes_in
from torchdoctor._placement import norm_device

log = logging.getLogger("torchdoctor.guard")

_PLACEMENT = re.compile(
    r"same device|two devices|expected device|is on the expected device|should be the same|same dtype|"
    r"expected scalar type|mixed dtype|expected m1 and m2|Input type \(|indices should be either on cpu|"
    r"meta tensor|not compiled with|is not linked with support|found at least two devices|to match query dtype|"
    r"must have the same (?:scalar )?type|expected both vectors|with arguments from the '\w+' backend|"
    r"not implemented for '(?:BFloat16|Half|Float8\w*|Double|ComplexHalf)'|FakeTensor Device|"
    r"deserialize object on a CUDA device|Expected all tensors", re.IGNORECASE)


def placement_category(message: str) -> str | None:
    """The explain category of a placement error message (``torchdoctor._explain``), ``"placement"`` when only
    the guard's own short list knows it, None when it is not a placement error."""
    try:
        from torchdoctor._explain.api import classify

        category = classify(message)
    except Exception:  # explain missing or confused: the short list below still knows the common messages
        log.debug("classify failed", exc_info=True)
        category = None
    if category:
        return category
    return "placement" if _PLACEMENT.search(message) else None


def _devices_named(message: str) -> list[torch.device]:
    """Devices a message names, in order (``cuda:0 and cpu``, ``CUDABFloat16Type``, ``torch.cuda.FloatTensor``,
    ``on CPU, but expected it to be on GPU``), read by explain's one token parser."""
    out: list[torch.device] = []
    for name in devices_in(message):
        try:
            out.append(norm_device(torch.device(name)))
        except (RuntimeError, ValueError):  # a device type this build does not know (npu, hpu)
            continue
    return out


def kind_of(message: str) -> str:
    low = message.lower()
    if re.search(r"\bmeta\b", low):
        return "meta"
    types_named = {d.type for d in _devices_named(message)}
    if len(types_named) > 1 or re.search(r"\bdevices?\b|not compiled with|not linked with|generator of type", low):
        return "device"
    return "dtype"


def mentioned(message: str, kind: str) -> set[Any]:
    """Dtypes or devices an error message names (``c10::BFloat16 != float``, ``cuda:0 and cpu``)."""
    if kind == "device":
        return set(_devices_named(message))
    out: set[Any] = set()
    if kind == "dtype":
        for name in dtypes_in(message):
            dt = getattr(torch, name, None)
            if isinstance(dt, torch.dtype):
                out.add(dt)
    return out

"""torch's factories (``torch.zeros``, ``torch.linspace`` ...) as its own C functions: a factory call's result is
named by its maker in a virtual run whoever has since put a wrapper in ``torch.<name>``."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._device as _device_mod

__all__ = ["constructors"]

_CONSTRUCTORS: list[frozenset[Any]] = []


def constructors() -> frozenset[Any]:
    """torch's factories as its C functions, whoever has put a wrapper in ``torch.linspace`` since: torch's own set
    (``torch.utils._device._device_constructors``) is cached the first time a device context asks, and transformers'
    ``from_pretrained`` asks inside a patch of its own (``meta_device_safe_creation_ops``), so that cache can hold
    the wrapper for the rest of the process and miss every later ``torch.linspace`` (which then loses its maker).
    torch's cache still decides where ``set_default_device`` puts a factory's tensor, as it does on the machine."""
    if not _CONSTRUCTORS:
        # torch's function itself, never its cache: filling that cache here, before the program runs, would keep
        # a later wrapper out of it, which the machine would not (a virtual run must not mend the program's bug)
        listed = getattr(_device_mod._device_constructors, "__wrapped__", _device_mod._device_constructors)()
        own = {getattr(torch._C._VariableFunctions, getattr(f, "__name__", ""), None) for f in listed}
        own |= {getattr(getattr(torch._C, "_fft", None), n, None) for n in ("fft_fftfreq", "fft_rfftfreq")}
        own |= {getattr(torch._C._VariableFunctions, n, None) for n in
                ("empty", "empty_permuted", "empty_strided", "ones", "zeros", "full", "arange", "range", "linspace",
                 "logspace", "eye", "rand", "randn", "randint", "randperm", "tensor", "as_tensor", "asarray",
                 "scalar_tensor", "tril_indices", "triu_indices")}
        own |= set(listed)  # (its Python ones: torch.nested.nested_tensor)
        _CONSTRUCTORS.append(frozenset(own - {None}))
    return _CONSTRUCTORS[0]

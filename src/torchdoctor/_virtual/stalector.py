"""A factory that ignored the program's default device (``torch.set_default_device("cuda")``, ``with
torch.device(...)``) because torch's factory set no longer holds it: torch caches that set
(``torch.utils._device._device_constructors``) the first time a device context asks, and transformers'
``from_pretrained`` asks while its own wrapper stands in ``torch.linspace`` (``meta_device_safe_creation_ops``) —
from then on, in that process, ``torch.linspace`` under a default device stays on the cpu. The fix of such a
factory says why, measured on this process's cache (the wrapper named by its module), and passes the default device
the program set (``device=torch.get_default_device()``) instead of a device written out."""

from __future__ import annotations

import re
from typing import Any

import torch

__all__ = ["left_out", "stale_factory_fix"]


def left_out(name: str) -> Any:
    """The function torch's cached factory set holds in place of ``torch.<name>`` (a library's wrapper), or None
    when the set holds torch's own, or has not been filled in this process."""
    import torch.utils._device as device_mod

    cached = device_mod._device_constructors
    info = getattr(cached, "cache_info", None)
    if info is None or info().currsize == 0:  # never filled: asking would fill it here
        return None
    own = getattr(torch._C._VariableFunctions, name, None)
    held = cached()
    if own is None or own in held:
        return None
    return next((f for f in held if getattr(f, "__name__", "").endswith(name) and f is not own), False)


def _sets_default(f: Any) -> bool:
    """The program's file of the factory, or the script run, sets a default device (``set_default_device``, a
    ``with torch.device(...)`` block): read from its text, since a run puts the default device back at its end."""
    import sys

    files = {f.remake[0]} if f.remake is not None else set()
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    files |= {main} if isinstance(main, str) else set()
    for file in files:
        try:
            with open(file, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
        if "set_default_device(" in text or re.search(r"with\s+torch\.device\(", text):
            return True
    return False


def stale_factory_fix(f: Any) -> Any:
    """``f`` (a ``device=`` fix at a ``torch.<factory>`` line the default device did not reach) with the reason said
    and the default device passed; None for any other fix."""
    m = re.match(r"# torch\.(\w+) made it on (\w+): pass device=", f.code)
    if m is None or m.group(2) != "cpu" or not _sets_default(f):
        return None
    wrapper = left_out(m.group(1))
    if wrapper is None:
        return None
    who = f"{getattr(wrapper, '__module__', '?')}.{getattr(wrapper, '__qualname__', '?')}" if wrapper else \
        "another function"
    name = m.group(1)
    f.code = (f"# torch.{name} made it on cpu although the program set a default device: torch caches its factory set "
              f"(torch.utils._device._device_constructors) the first time a device context asks, and in this process "
              f"it holds {who} in place of torch.{name} (transformers' from_pretrained fills that cache while its "
              f"wrapper stands in torch.{name}), so the default device never reaches torch.{name}: pass it "
              f"(torch.{name}(..., device=torch.get_default_device()))")
    if f.diff:
        f.diff = re.sub(r"device=(['\"])[\w:]+\1\)", "device=torch.get_default_device())", f.diff)
    return f

"""Objects ``simulate`` cannot copy (ComfyUI's ModelPatcher and BaseModel: their config objects answer None for any
attribute, so ``copy.deepcopy`` calls None) are run in place in a virtual session and put back afterwards: every
module's own dictionaries (attributes, parameters, buffers, submodules) and every tensor slot the walk found are
restored to the objects they held before, so the user's tensors, never written by the run, are theirs again."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn

_STORES = ("_parameters", "_buffers", "_modules")


@contextlib.contextmanager
def put_back(found: Any) -> Iterator[None]:
    """Run the block on the objects of ``found`` (a walk), then restore what the walk saw, whatever the block did
    (the session's twins replace tensors in their slots; ``.to`` replaces parameters)."""
    modules: list[tuple[nn.Module, dict[str, Any], dict[str, dict[str, Any]]]] = []
    for _, m in found.modules:
        d = m.__dict__
        modules.append((m, dict(d), {k: dict(d[k]) for k in _STORES if isinstance(d.get(k), dict)}))
    slots = [(e, e.tensor) for e in found.entries if e.alias_of is None and e.slot not in ("param", "buffer")]
    try:
        yield
    finally:
        from torchdoctor._walk import set_tensor

        for m, attrs, stores in modules:
            d = m.__dict__
            for k in [k for k in d if k not in attrs]:
                del d[k]
            for k, v in attrs.items():
                if k not in stores:
                    d[k] = v
            for k, saved in stores.items():
                held = attrs[k]  # the dict object the module had: refilled with what it held
                held.clear()
                held.update(saved)
                d[k] = held
        for e, t in slots:
            with contextlib.suppress(TypeError, AttributeError, KeyError, IndexError):
                set_tensor(e, t)

"""What a virtual run's module stack says about the moment: the running module, its path, and a tensor as a plain
attribute of it (``blocks.0.scale``) — the hooks the recorder answers with (docs/architecture.md, _virtual)."""

from __future__ import annotations

import sys
from typing import Any

import torch

_SKIP = ("site-packages", "dist-packages", "/torch/", "/torchdoctor/", "<frozen")  # machinery, not the program


class StackView:
    """Mixed into the recorder: ``modules`` is its ``ModuleStack``."""

    modules: Any

    def running(self) -> Any:
        return self.modules.stack[-1] if self.modules.stack else None

    def path_of(self, module: Any) -> str | None:
        return self.modules.paths.get(id(module))  # type: ignore[no-any-return]

    def attribute_of(self, tensor: torch.Tensor, holders: bool = True) -> str | None:
        """``blocks.0.scale``: ``tensor`` as a plain attribute of the innermost running module; else (``holders``:
        a tensor with no maker on record) of the object whose method of the program's own code reads it
        (``TeaCache.previous_residual``: a caching wrapper patched in as ``model.forward``); or None."""
        mod = self.running()
        name = next((k for k, v in vars(mod).items() if v is tensor), None) if mod is not None else None
        if name is not None:
            path = self.path_of(mod)
            return f"{path}.{name}" if path else name
        if not holders:  # its maker's line names it better (``made by Tensor.to at app.py:16``)
            return None
        frame: Any = sys._getframe(1)
        while frame is not None and any(s in frame.f_code.co_filename for s in _SKIP):
            frame = frame.f_back
        holder = frame.f_locals.get("self") if frame is not None else None
        attrs = getattr(holder, "__dict__", None)
        if not isinstance(attrs, dict) or isinstance(holder, torch.nn.Module):
            return None
        name = next((k for k, v in list(attrs.items()) if v is tensor), None)
        return f"{type(holder).__name__}.{name}" if name is not None else None

"""What a virtual run's module stack says about the moment: the running module, its path, and a tensor as a plain
attribute of it (``blocks.0.scale``) — the hooks the recorder answers with (docs/architecture.md, _virtual)."""

from __future__ import annotations

from typing import Any

import torch


class StackView:
    """Mixed into the recorder: ``modules`` is its ``ModuleStack``."""

    modules: Any

    def running(self) -> Any:
        return self.modules.stack[-1] if self.modules.stack else None

    def path_of(self, module: Any) -> str | None:
        return self.modules.paths.get(id(module))  # type: ignore[no-any-return]

    def attribute_of(self, tensor: torch.Tensor) -> str | None:
        """``blocks.0.scale``: ``tensor`` as a plain attribute of the innermost running module, or None."""
        mod = self.running()
        name = next((k for k, v in vars(mod).items() if v is tensor), None) if mod is not None else None
        if name is None:
            return None
        path = self.path_of(mod)
        return f"{path}.{name}" if path else name

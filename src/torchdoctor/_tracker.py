"""The one module stack: which module is running right now, in this thread (global forward hooks, removed by
handle; ``module.forward`` is never rewritten). guard's session and the virtual-device runtime both build on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

class ModuleStack:
    """The innermost running module of the copy (global forward hooks, removed by handle), so a problem names
    its module; parameters put on a module during the run (an adapter loaded in ``call``) get their path too."""

    def __init__(self, roles: dict[str, str]) -> None:
        self.stack: list[torch.nn.Module] = []
        self.paths: dict[int, str] = {}  # id(module of the copy) -> its path ("" for the root)
        self.roles = roles

    def where(self) -> tuple[str | None, str | None]:
        """(path, type name) of the innermost running module with a known path."""
        for mod in reversed(self.stack):
            path = self.paths.get(id(mod))
            if path is not None:
                return path, type(mod).__name__
        return None, None

    def _pre(self, mod: torch.nn.Module, args: Any) -> None:
        self.stack.append(mod)
        path = self.paths.get(id(mod))
        if path is None:
            return
        for store, role in ((mod._parameters, "parameter"), (mod._buffers, "buffer")):
            for name, t in store.items():
                if getattr(t, "_td_path", False) is None:  # a virtual tensor not named yet
                    t._td_path = f"{path}.{name}" if path else name
                    self.roles.setdefault(t._td_path, role)

    def _post(self, mod: torch.nn.Module, args: Any, out: Any) -> None:
        if self.stack and self.stack[-1] is mod:
            self.stack.pop()

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post,
                                                                                            always_call=True)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

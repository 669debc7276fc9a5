"""The one module stack: which module is running right now, with its inputs, the modules that started in this
forward, and whose backward is running (global forward hooks, removed by handle; ``module.forward`` is never
rewritten). guard's session (one stack per ``with guard`` per thread) and the virtual-device runtime both use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

class ModuleStack:
    """The innermost running module (global forward hooks, removed by handle), so a problem names its module;
    parameters put on a module during the run (an adapter loaded in ``call``) get their path too. Paths are
    resolved when needed: a module injected after the run started (LoRA layers added after ``.to()``) is found
    under the outermost running module. ``on_enter(module, path, args)`` runs when a module with a path starts."""

    def __init__(self, roles: dict[str, str] | None = None) -> None:
        self.stack: list[torch.nn.Module] = []
        self.inputs: list[Any] = []  # the positional inputs of each running module, parallel to ``stack``
        self.ran: list[torch.nn.Module] = []  # modules started in this forward, first first
        self.bw: list[torch.nn.Module] = []  # modules whose backward is running
        self.paths: dict[int, str] = {}  # id(module) -> its path ("" for the root)
        self.roles = roles if roles is not None else {}
        self.on_enter: Any = None
        self._missed: set[int] = set()
        self._keep: list[torch.nn.Module] = []  # ids in ``paths`` stay unique while the stack lives
        self.outermost: list[torch.nn.Module] = []  # the modules that started a forward, first first

    def path_of(self, mod: torch.nn.Module) -> str | None:
        """``mod``'s path; unknown modules are looked up under the outermost running module (once per module)."""
        path = self.paths.get(id(mod))
        if path is None and self.stack and id(mod) not in self._missed:
            self._missed.add(id(mod))
            root = self.stack[0]
            base = self.paths.get(id(root))
            if base is None and root is mod:
                base = ""  # the outermost module of a run: it names its own tree
            if base is not None:
                try:
                    for name, sub in root.named_modules(remove_duplicate=False):
                        if id(sub) not in self.paths:
                            self.paths[id(sub)] = f"{base}.{name}" if base and name else (name or base)
                            self._keep.append(sub)
                except Exception:  # a strange module tree must not break the run it watches
                    pass
            path = self.paths.get(id(mod))
            if path is None and len(self.stack) >= 2 and self.stack[-1] is mod:
                path = self._via_replaced_forward(mod, self.stack[-2])
        return path

    def _via_replaced_forward(self, mod: torch.nn.Module, parent: torch.nn.Module) -> str | None:
        """A module run by another module's replaced ``forward`` (sd-scripts' LoRA network sets
        ``org_module.forward = lora.forward``): named under ``<parent>.forward.__self__``, as the walker names it."""
        base = self.paths.get(id(parent))
        owner = getattr(parent.__dict__.get("forward"), "__self__", None)
        if base is None or not isinstance(owner, torch.nn.Module) or owner is parent:
            return None
        head = f"{base}.forward.__self__" if base else "forward.__self__"
        try:
            for name, sub in owner.named_modules(remove_duplicate=False):
                if id(sub) not in self.paths:
                    self.paths[id(sub)] = f"{head}.{name}" if name else head
                    self._keep.append(sub)
        except Exception:  # a strange module tree must not break the run it watches
            return None
        return self.paths.get(id(mod))

    def where(self) -> tuple[str | None, str | None]:
        """(path, type name) of the innermost running module with a known path."""
        for mod in reversed(self.stack):
            path = self.paths.get(id(mod))
            if path is not None:
                return path, type(mod).__name__
        return None, None

    # -- the stack itself (guard drives it from its own hooks) ---------------------------------------------------
    def push(self, mod: torch.nn.Module, args: Any) -> bool:
        """``mod`` starts; True when it is the outermost (a new forward: the last backward is over)."""
        stack = self.stack
        first = not stack
        if first:
            self.ran.clear()
            self.bw.clear()
        stack.append(mod)
        self.inputs.append(args)
        self.ran.append(mod)
        return first

    def pop(self, mod: torch.nn.Module) -> None:
        """``mod`` returned; after an exception caught inside a forward, the stale entries above it go too."""
        stack = self.stack
        if stack and stack[-1] is mod:
            stack.pop()
            self.inputs.pop()
            return
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is mod:
                del stack[i:], self.inputs[i:]
                return

    def enter_backward(self, mod: torch.nn.Module) -> None:
        self.bw.append(mod)

    def leave_backward(self, mod: torch.nn.Module) -> None:
        for i in range(len(self.bw) - 1, -1, -1):
            if self.bw[i] is mod:
                del self.bw[i]
                return

    def current(self, root: Any = None) -> tuple[torch.nn.Module | None, Any]:
        """(innermost module, root) right now; in a backward, the module whose backward is running."""
        if root is None and self.stack:
            root = self.stack[0]
        if self.bw and torch._C._current_graph_task_id() != -1:
            return self.bw[-1], root if root is not None else self.bw[0]
        return (self.stack[-1] if self.stack else None), root

    def inputs_of(self, mod: torch.nn.Module) -> Any:
        for m, a in zip(reversed(self.stack), reversed(self.inputs)):
            if m is mod:
                return a
        return ()

    # -- global hooks (the virtual runtime) --------------------------------------------------------------------
    def _pre(self, mod: torch.nn.Module, args: Any) -> None:
        if not self.stack and not any(m is mod for m in self.outermost):
            self.outermost.append(mod)
        self.push(mod, args)
        path = self.paths.get(id(mod))
        if path is None:
            path = self.path_of(mod)
            if path is None:
                return
        for store, role in ((mod._parameters, "parameter"), (mod._buffers, "buffer")):
            for name, t in store.items():
                if getattr(t, "_td_path", False) is None:  # a virtual tensor not named yet
                    named = f"{path}.{name}" if path else name
                    t._td_path = named  # type: ignore[union-attr]
                    self.roles.setdefault(named, role)
        if self.on_enter is not None:
            self.on_enter(mod, path, args)

    def _post(self, mod: torch.nn.Module, args: Any, out: Any) -> None:
        self.pop(mod)

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

"""The one module stack: which module is running right now, with its inputs, the modules that started in this
forward, and whose backward is running (global forward hooks, removed by handle; ``module.forward`` is never
rewritten). guard's session (one stack per ``with guard`` per thread) and the virtual-device runtime both use it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import torch

# frames of the module machinery and of torchdoctor: never where the caller holds its model
_MACHINERY = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
              os.path.dirname(os.path.abspath(__file__)) + os.sep)
_LIVE: weakref.WeakSet[ModuleStack] = weakref.WeakSet()  # the stacks alive now: ``held_names`` reads their names


class ModuleStack:
    """The innermost running module (global forward hooks, removed by handle), so a problem names its module;
    parameters put on a module during the run (an adapter loaded in ``call``) get their path too. Paths are
    resolved when needed: a module injected after the run started (LoRA layers added after ``.to()``) is found
    under the outermost running module. ``on_enter(module, path, args)`` runs when a module with a path starts;
    when the outermost module starts, ``on_enter.call(module, args, kwargs)`` (if it has one) sees the caller's
    arguments and may return replacements for the positional ones."""

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
        # id(module) -> (module, the keyword arguments of its outermost call), kept while that call runs or after it
        # failed (a diagnosis re-runs other modules as outermost ones meanwhile); a few at most
        self.outer_kwargs: dict[int, tuple[torch.nn.Module, dict[str, Any]]] = {}
        self._replaced: Any = None  # positional arguments ``_pre`` replaced for the call starting now
        # name -> module of the callers' own frames when an outermost forward started: ``net`` in
        # ``def main(): net = build(); net(x)``, the name a fix is written with once ``main`` has returned
        self.held: dict[str, torch.nn.Module] = {}
        _LIVE.add(self)

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
            # a model called with keywords (``model(input_ids=ids)``, as every Hugging Face model is): its inputs,
            # for a proof that runs the whole forward again (once per outermost call)
            self.outer_call(mod, sys._getframe(1))
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
            if not stack:  # returned: its inputs are no longer held for a diagnosis
                self.outer_kwargs.pop(id(mod), None)
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

    def outer_call(self, mod: torch.nn.Module, frame: Any) -> None:
        """``mod`` starts as the outermost module (``frame``: the hook's caller's): its keyword arguments kept."""
        kept = self.outer_kwargs
        kept.pop(id(mod), None)
        if len(kept) >= 4:
            del kept[next(iter(kept))]
        kept[id(mod)] = (mod, dict(_call_kwargs(mod, frame)))

    def given(self, mod: torch.nn.Module) -> tuple[Any, ...]:
        """What ``mod`` was called with as the outermost module: its positional arguments, then its keywords'."""
        return (*self.inputs_of(mod), *self.kwargs_of(mod).values())

    def kwargs_of(self, mod: torch.nn.Module) -> dict[str, Any]:
        """The keyword arguments ``mod`` was called with as the outermost module (running, or failed); else {}."""
        got = self.outer_kwargs.get(id(mod))
        return got[1] if got is not None and got[0] is mod else {}

    # -- global hooks (the virtual runtime) --------------------------------------------------------------------
    def _hook(self, mod: torch.nn.Module, args: Any) -> Any:
        """The registered pre-hook: ``_pre`` (which a subclass may extend without returning its result), then the
        positional arguments it replaced, if any."""
        self._replaced = None
        self._pre(mod, args)
        out, self._replaced = self._replaced, None
        return out

    def _pre(self, mod: torch.nn.Module, args: Any) -> Any:
        outer = not self.stack
        if outer and not any(m is mod for m in self.outermost):
            self.outermost.append(mod)
            self._note_held(sys._getframe(1))
            self._reroot(mod, sys._getframe(1))
        self.push(mod, args)
        replaced = None
        call = getattr(self.on_enter, "call", None) if outer else None
        if call is not None:
            replaced = call(mod, args, _call_kwargs(mod, sys._getframe(1)))
            if replaced is not None:
                self.inputs[-1] = args = self._replaced = replaced
        path = self.paths.get(id(mod))
        if path is None:
            path = self.path_of(mod)
            if path is None:
                return replaced
        for store, role in ((mod._parameters, "parameter"), (mod._buffers, "buffer")):
            for name, t in store.items():
                if getattr(t, "_td_path", False) is None:  # a virtual tensor not named yet
                    named = f"{path}.{name}" if path else name
                    t._td_path = named  # type: ignore[union-attr]
                    self.roles.setdefault(named, role)
        if self.on_enter is not None:
            self.on_enter(mod, path, args)
        return replaced

    def _note_held(self, frame: Any) -> None:
        """The modules the callers' own frames (the innermost first, at most four) hold in local variables, by
        name; once per module that starts a forward, and at most 32 names."""
        frames, f = 0, frame
        while f is not None and frames < 4 and len(self.held) < 32:
            if not f.f_code.co_filename.startswith(_MACHINERY):
                frames += 1
                if f.f_locals is not f.f_globals:  # a module's globals are the program's names already
                    try:
                        for name, value in list(f.f_locals.items()):
                            if isinstance(value, torch.nn.Module) and name != "self" and not name.startswith("_"):
                                self.held.setdefault(name, value)
                    except Exception:  # a frame whose locals cannot be read: nothing to learn from it
                        pass
            f = f.f_back

    def _reroot(self, mod: torch.nn.Module, frame: Any) -> None:
        """``mod`` starts a forward as its own root (path ``""``) while a module that holds it is in the caller's
        hands: ``model.forward(x)`` (a Sequential whose own call no hook saw), or the test calling ``model[0]``
        first or looping over ``model.layers``. The holder names the tree (``0.bias``, not ``bias``), as scan
        would name it; tensors already named by the old paths are renamed. Once per module that starts a run."""
        if self.paths.get(id(mod), "") != "":
            return  # named under a known root already (simulate names every module of its copy)
        best: torch.nn.Module | None = None
        size, frames, f = 0, 0, frame
        while f is not None and frames < 6:
            if not f.f_code.co_filename.startswith(_MACHINERY):
                frames += 1
                try:
                    held = [v for v in f.f_locals.values() if isinstance(v, torch.nn.Module)]
                except Exception:  # a frame whose locals cannot be read: nothing to learn from it
                    held = []
                for v in held:
                    if v is mod or v is best or id(v) in self.paths:
                        continue
                    subs = list(v.modules())
                    if len(subs) > size and any(s is mod for s in subs):
                        best, size = v, len(subs)
            f = f.f_back
        if best is None:
            return
        try:
            named = list(best.named_modules(remove_duplicate=False))
        except Exception:  # a strange module tree must not break the run it watches
            return
        # the holder is what the run's culprits are judged in (the policy's paths are the same as these)
        self.outermost[:] = [best if m is mod else m for m in self.outermost if m is not best]
        for name, sub in named:
            old = self.paths.get(id(sub))
            self.paths[id(sub)] = name
            self._keep.append(sub)
            if old is None or old == name:
                continue
            for store in (sub._parameters, sub._buffers):
                for key, t in store.items():
                    if t is not None and getattr(t, "_td_path", None) == (f"{old}.{key}" if old else key):
                        t._td_path = f"{name}.{key}" if name else key  # type: ignore[union-attr]

    def _post(self, mod: torch.nn.Module, args: Any, out: Any) -> None:
        self.pop(mod)

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        handles = [register_module_forward_pre_hook(self._hook), register_module_forward_hook(self._post,
                                                                                            always_call=True)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def _call_kwargs(mod: torch.nn.Module, frame: Any) -> dict[str, Any]:
    """The keyword arguments of ``mod``'s call, read from ``Module._call_impl`` (a global pre-hook sees only the
    positional ones): the dict the forward will be called with, so replacing a value in it replaces it there."""
    f = frame
    for _ in range(4):
        if f is None:
            break
        if f.f_code.co_name in ("inner", "_call_impl") and f.f_code.co_filename.startswith(_MACHINERY[0]):
            loc = f.f_locals
            if loc.get("self") is mod and isinstance(loc.get("kwargs"), dict):
                return loc["kwargs"]  # type: ignore[no-any-return]
        f = f.f_back
    return {}


def held_names() -> dict[str, torch.nn.Module]:
    """The modules the program's functions held by name when their forwards started, over every live stack (the
    innermost frame's name first): what a fix written ``model.<path>`` is resolved against besides the program's
    module globals."""
    out: dict[str, torch.nn.Module] = {}
    for stack in list(_LIVE):
        for name, mod in stack.held.items():
            out.setdefault(name, mod)
    return out

"""What a virtual run's module stack says about the moment: the running module, its path, and a tensor as a plain
attribute of it (``blocks.0.scale``) — the hooks the recorder answers with (docs/architecture.md, _virtual)."""

from __future__ import annotations

import sys
from typing import Any

import torch

_MAX_ITEMS = 100_000  # a container bigger than this is not searched (a name is a courtesy, never a cost)
_SKIP = ("site-packages", "dist-packages", "/torch/", "/torchdoctor/", "<frozen")  # machinery, not the program


class StackView:
    """Mixed into the recorder: ``modules`` is its ``ModuleStack``."""

    modules: Any
    roots: list[Any]
    _model_dtype: torch.dtype | None

    def model_dtype(self) -> torch.dtype | None:
        """The model's dtype as the placement policy decides it for the first root (in ``virtual_devices``, the
        module the user's code called; looked up once, at the first dtype problem): cast so by the program's own
        code, else declared, else a vote."""
        roots = self.roots or self.modules.outermost
        if self._model_dtype is None and roots:
            from torchdoctor._scan.policy import Policy
            from torchdoctor._walk import walk

            from torchdoctor._virtual.castlog import declared

            # the program's own cast of the model (layers it adds later, a LoRA's in float32, are the odd ones even
            # where they are as many as the layers it cast), else the policy's components
            self._model_dtype = declared(roots[0])
            if self._model_dtype is None:
                comps = Policy(walk(roots[0]), None, None, False).components
                self._model_dtype = next((c.dtype for c in reversed(comps) if c.dtype is not None), torch.float32)
        return self._model_dtype

    def running(self) -> Any:
        return self.modules.stack[-1] if self.modules.stack else None

    def path_of(self, module: Any) -> str | None:
        return self.modules.paths.get(id(module))  # type: ignore[no-any-return]

    def library_made(self, origin: Any) -> bool:
        """A record whose maker's line is a library's own (diffusers' ``EMAModel.to``), not the program's, or a
        module's own move (``ema.to("cpu")``, ``takenback``): the program's frames name its tensor better
        (``ema.weight``)."""
        return origin is not None and (any(s in (getattr(origin, "at", None) or "") for s in _SKIP)
                                       or getattr(origin, "by_module", False) or _built_apart(origin)
                                       or _moved_by_library(origin))

    def attribute_of(self, tensor: torch.Tensor, kept: Any = None) -> str | None:
        """``blocks.0.scale``: ``tensor`` as a plain attribute of the innermost running module; else, when no maker
        of the program's own code is on record (``kept``: the run's record of it), of the object whose method of
        the program reads it: ``TeaCache.previous_residual`` (a caching wrapper patched in as ``model.forward``);
        or None (``held_locally`` names it when a problem is recorded: ``ema.shadow_params[0]``)."""
        mod = self.running()
        name = next((k for k, v in vars(mod).items() if v is tensor), None) if mod is not None else None
        if name is not None:
            path = self.path_of(mod)
            return f"{path}.{name}" if path else name
        if kept is not None and (not self.library_made(kept[1]) or _built_apart(kept[1])):
            return None  # its maker's line in the program names it better (``made by Tensor.to at app.py:16``)
        frame: Any = sys._getframe(1)
        while frame is not None and any(s in frame.f_code.co_filename for s in _SKIP):
            frame = frame.f_back
        holder = frame.f_locals.get("self") if frame is not None else None
        hit = _held(holder, tensor) if holder is not None else None
        return f"{type(holder).__name__}.{hit}" if hit is not None else None


def _built_apart(origin: Any) -> bool:
    """A parameter of a module the program built outside any forward (``torch.nn.Conv2d`` at app.py:7) met as a
    real tensor at an op: that module was never moved, or this is a copy of its parameter an object keeps (an EMA's
    ``shadow_params[0]``, cloned before the model's move); the program's frames name which."""
    op = getattr(origin, "op", None)
    return isinstance(op, str) and op.startswith("torch.nn.") and getattr(origin, "module", 1) is None and \
        getattr(origin, "at", None) is not None


def _moved_by_library(origin: Any) -> bool:
    from torchdoctor._virtual.deepheld import library_move

    return library_move(origin)


def held_locally(tensor: torch.Tensor, origin: Any = None) -> str | None:
    """``ema.shadow_params[0]``: ``tensor`` as an object in the program's own frames (innermost first) holds it,
    one container deep (diffusers' EMAModel, a cache dict); asked only when a problem is recorded."""
    frame: Any = sys._getframe(1)
    movable = _built_apart(origin)  # a copy of a built module's parameter (its record): named by a holder its fix
    # can move (``.to``)
    while frame is not None:
        if not any(s in frame.f_code.co_filename for s in _SKIP):
            for local, obj in list(frame.f_locals.items()):
                hit = _held(obj, tensor) if local != "self" and (not movable or callable(getattr(obj, "to", None))) \
                    else None
                if hit is not None:
                    return f"{local}.{hit}"
        frame = frame.f_back
    return None



def held_as(tensor: torch.Tensor) -> str | None:
    """``master['lin.weight']``, ``ema[0]``: ``tensor`` as a dict, list or tuple the program's own frames hold it
    (innermost first), else as ``held_locally`` finds it; asked only when a problem is recorded."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        if not any(s in frame.f_code.co_filename for s in _SKIP):
            for local, obj in list(frame.f_locals.items()):
                if local.startswith("__"):
                    continue
                if isinstance(obj, dict) and len(obj) <= _MAX_ITEMS:
                    k = next((k for k, v in obj.items() if v is tensor), None)
                    if k is not None:
                        return f"{local}[{k!r}]"
                elif isinstance(obj, (list, tuple)) and len(obj) <= _MAX_ITEMS:
                    i = next((i for i, v in enumerate(obj) if v is tensor), None)
                    if i is not None:
                        return f"{local}[{i}]"
        frame = frame.f_back
    return held_locally(tensor)


def _held(obj: Any, tensor: torch.Tensor) -> str | None:
    """``shadow_params[0]``: where ``obj`` (not a module, not a tensor) holds ``tensor``, one container deep."""
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict) or isinstance(obj, (torch.nn.Module, torch.Tensor, type)):
        return None
    for name, value in list(attrs.items()):
        if value is tensor:
            return name  # type: ignore[no-any-return]
        if isinstance(value, (list, tuple)) and len(value) <= _MAX_ITEMS:
            i = next((i for i, v in enumerate(value) if v is tensor), None)
            if i is not None:
                return f"{name}[{i}]"
        elif isinstance(value, dict) and len(value) <= _MAX_ITEMS:
            k = next((k for k, v in value.items() if v is tensor), None)
            if k is not None:
                return f"{name}[{k!r}]"
    return None

"""The legacy ONNX exporter of a model with nothing on a virtual device runs on the real machine, outside the run.

``torch.onnx.export(..., dynamo=False)`` traces the model with TorchScript's tracer and reads its constants' values
in C++; under the run's function mode a CPU model's weights were traced as virtual tensors with no storage, and the
exporter died (``basic_string: construction from null is not valid``, then ``... data is not allocated yet``) where
plain python exports. An export of CPU tensors only places nothing, so it runs as without the run: this thread set
aside, torch's function modes off. A model or input on a virtual device still goes through the run (it needs values
the run does not hold: the report says it could not check past that line).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from torchdoctor._virtual.tensor import VirtualTensor

_NAME = "torch.onnx"


def install(installs: Any) -> None:
    """``torch.onnx.export`` wrapped for this run (``Installs.set``): now if the program imported it, else when it
    does (a finder ahead of the others, removed with the run's other installs)."""
    module = sys.modules.get(_NAME)
    if module is not None:
        _wrap(installs, module)
        return
    sys.meta_path.insert(0, _Finder(installs))


def _remove(finder: Any) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)


def _wrap(installs: Any, module: ModuleType) -> None:
    export = module.__dict__.get("export")
    if export is None or getattr(export, "_td_aside", False):
        return

    def aside_export(model: Any, args: Any = (), *rest: Any, **kwargs: Any) -> Any:
        if kwargs.get("dynamo", True) is not False or _any_virtual(model, args, kwargs.get("kwargs")):
            return export(model, args, *rest, **kwargs)
        from torchdoctor._virtual.deferred import real_machine

        with real_machine():
            return export(model, args, *rest, **kwargs)

    aside_export._td_aside = True  # type: ignore[attr-defined]
    aside_export.__doc__ = export.__doc__
    installs.set(module, "export", aside_export, shared=True)


def _any_virtual(model: Any, args: Any, kwargs: Any) -> bool:
    tensors: list[Any] = []
    if isinstance(model, torch.nn.Module):
        tensors += list(model.parameters()) + list(model.buffers())
    stack = [args, kwargs]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            tensors.append(v)
        elif isinstance(v, (list, tuple)):
            stack += list(v)
        elif isinstance(v, dict):
            stack += list(v.values())
    return any(isinstance(t, VirtualTensor) for t in tensors)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps ``torch.onnx.export`` once the program imports ``torch.onnx`` during the run."""

    def __init__(self, installs: Any) -> None:
        self.installs = installs

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if not self.installs.keys:  # the run has ended (its installs released): the finder goes too
            _remove(self)
            return None
        if name != _NAME:
            return None
        _remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, installs = spec.loader, self.installs

        class _Then(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)  # type: ignore[union-attr]
                _wrap(installs, module)

        spec.loader = _Then()
        return spec

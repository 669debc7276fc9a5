"""A graph torch built from the guarded model (``torch.compile`` with any backend, ``make_fx``): where a failure
inside it belongs in the model, and which of the model's tensors it read.

Such a graph is an ``fx.GraphModule`` that is not one of the model's modules: dynamo's graph (class
``GraphModule``), or, under ``aot_eager`` / ``make_fx``, a graph whose class is named after the traced function
(``<lambda>``) and that keeps the model's tensors as its own constants (``_tensor_constant0`` ...). Which of the two
a failure's traceback ends in depends on which call compiled first (outside the guard or inside it) and on the
kernels the machine takes; both are reported the same way: the failure is in the compiled model (path ``""``), a
graph constant is named by the model path of the tensor it is, and since a compiled graph may read any of the
model's tensors (its module hooks never ran), every off-policy tensor whose value the failing op found wrong is a
culprit.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchdoctor._guard.provenance import Flow


def is_graph_of_model(mod: Any, maps: Any) -> bool:
    """True when ``mod`` is a graph torch traced from the guarded model (not one of its own modules)."""
    return maps is not None and isinstance(mod, torch.fx.GraphModule) and id(mod) not in maps.modules


def label(root: Any) -> str:
    """``Net compiled by torch.compile``: the type shown for a failure inside a graph of the model."""
    return type(getattr(root, "_orig_mod", root)).__name__ + " compiled by torch.compile"


def constants(mod: nn.Module, maps: Any) -> list[tuple[str, torch.Tensor]]:
    """(model path, tensor) for each tensor the graph holds that is one of the model's (by identity, as a view, or
    by memory); a graph tensor that is no model tensor is left out."""
    from torchdoctor._walk import walk

    out: list[tuple[str, torch.Tensor]] = []
    seen: set[str] = set()
    for e in walk(mod).entries:
        if e.alias_of is not None or e.role not in ("parameter", "buffer", "attribute"):
            continue
        hit = maps.tensor_path(e.tensor)
        if hit is not None and hit[0] not in seen:
            seen.add(hit[0])
            out.append((hit[0], e.tensor))
    return out


def reads_everything(maps: Any) -> Flow:
    """A data flow in which every module of the model is running code that reads all its tensors: what is known
    of a compiled graph, whose module hooks never ran."""
    modules = {p: m for p, m in maps.walk.modules}
    return Flow(modules, set(), {p: None for p in modules}, set())

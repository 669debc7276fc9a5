"""Provenance of tensors made in a virtual run: which op made a tensor, in which module, and from which model
tensors (by path) its device and dtype came, so a problem far downstream names its source, not only the op where
it surfaced ("made by aten.cat in `<root>` from params.0 … params.3").

One ``Made`` per result that took its device and dtype from named tensors or from an earlier made tensor; a chain
of made tensors is followed up to ``DEPTH`` links (beyond that a result shares its parent's record, so memory stays
bounded however long the forward). Module paths are resolved only when a problem is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DEPTH = 8  # links of made-from-made kept per chain
NAMES = 16  # source paths kept per record


class Made:
    """How a tensor made in a run got its device and dtype."""

    __slots__ = ("op", "module", "paths", "count", "via", "depth")

    def __init__(self, op: str, module: Any, paths: tuple[str, ...] = (), count: int = 0, via: Made | None = None,
                 depth: int = 1) -> None:
        self.op = op  # "aten.cat", "torch.ones"
        self.module = module  # the innermost running module (None: outside any module)
        self.paths = paths  # the named tensors (model tensors, inputs) it came from, first NAMES of them
        self.count = count or len(paths)  # how many there were
        self.via = via  # the made tensor it came from, when no named one
        self.depth = depth

    @property
    def source(self) -> Made:
        """The first link of the chain: the op that made it from named tensors (or a factory)."""
        link = self
        while link.via is not None:
            link = link.via
        return link

    @property
    def first_path(self) -> str | None:
        """The model tensor the chain started from, if any."""
        paths = self.source.paths
        return paths[0] if paths else None

    def describe(self, module_path: Callable[[Any], str | None]) -> str:
        """``a tensor made by aten.mul in `lin`, 2 ops after aten.cat in `<root>` from params.0 … params.3``."""
        src = self.source
        head = f"a tensor made by {_link(src, module_path)}"
        if src is self:
            return head
        here = f"a tensor made by {self.op} in {_where(self.module, module_path)}"
        if self.depth == 2:
            return f"{here} from {head}"
        return f"{here}, {self.depth - 1} ops after {_link(src, module_path)}"


def _where(module: Any, module_path: Callable[[Any], str | None]) -> str:
    if module is None:
        return "code outside the model"
    path = module_path(module)
    return f"`{path or '<root>'}`" if path is not None else f"a {type(module).__name__} outside the model"


def _link(m: Made, module_path: Callable[[Any], str | None]) -> str:
    text = f"{m.op} in {_where(m.module, module_path)}"
    if not m.paths:
        return text
    if m.count == 1:
        return f"{text} from {m.paths[0]}"
    if m.count == 2 and len(m.paths) == 2:
        return f"{text} from {m.paths[0]} and {m.paths[1]}"
    return f"{text} from {m.paths[0]} … {m.paths[-1]}" + (f" ({m.count} tensors)" if m.count > len(m.paths) or
                                                            m.count > 4 else "")


def made_from(op: str, module: Any, tensors: Any, dtype: Any, device: Any) -> Made | None:
    """The record of a result of ``op`` with ``dtype`` on ``device``: the arguments that share both gave it."""
    paths: list[str] = []
    count = 0
    via = None
    cast = None  # a cast's source (``torch.arange(n).float()``): same device, the dtype set by the op
    for t in tensors:
        if t.dtype != dtype or t._td_device != device:
            if cast is None and t._td_device == device:
                cast = t
            continue
        path = t._td_path
        if path is not None:
            count += 1
            if count <= NAMES:
                paths.append(path)
        elif via is None:
            via = t._td_origin
    if count:
        return Made(op, module, tuple(paths), count)
    if via is None and cast is not None:
        if cast._td_path is not None:
            return Made(op, module, (cast._td_path,), 1)
        via = cast._td_origin
    if via is None:
        return None
    if via.depth >= DEPTH:
        return via
    return Made(op, module, via=via, depth=via.depth + 1)


def ran_as_asked(dtype: Any, roots: list[Any]) -> list[Any]:
    """A run asked for a dtype (``dtype=float16``) that the code's own weights do not have (``call=`` runs the
    user's objects as they are): a problem saying in which dtype it ran, so the report never reads as if the run
    checked the dtype asked for."""
    import torch

    from torchdoctor._placement import dtype_str
    from torchdoctor._report.model import Problem

    if dtype is None:
        return []
    sizes: dict[Any, int] = {}
    for root in roots:
        if isinstance(root, torch.nn.Module):
            for t in root.parameters():
                if t.is_floating_point():
                    sizes[t.dtype] = sizes.get(t.dtype, 0) + t.nelement() * t.element_size()
    ran = max(sizes, key=sizes.__getitem__) if sizes else None
    if ran is None or ran == dtype:
        return []
    asked, got = dtype_str(dtype), dtype_str(ran)
    return [Problem("dtype", "<run>", "run", got, asked, f"the code ran with {got} weights, not {asked}: this run "
                    f"does not show whether it works in {asked} (call= runs your objects as they are; cast them "
                    f"first, e.g. model.to(torch.{asked}))", op="simulate")]

"""Metadata-only twins of tensors, and the names a fix may call them by: what a failing op's operands are kept as
(``atop``) and what a torch layer is first given (``entry``). Loaded with the first module a virtual run enters; the
proof machinery (``atop``) only with a fix to prove."""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._virtual.origin import DEPTH, LINES

class Operand:
    """A metadata-only twin of one operand and the names a fix may call it by."""

    __slots__ = ("meta", "device", "tags", "named", "far", "through")

    def __init__(self, t: torch.Tensor, tags: tuple[str, ...], named: bool) -> None:
        with torch._C.DisableTorchFunction():
            try:
                self.meta = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")
            except (RuntimeError, TypeError):  # a layout without strides (sparse, nested): its shape is enough
                self.meta = torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")
        self.device = getattr(t, "_td_device", t.device)
        self.named = named
        self.tags = tuple(x[len(FAR):] if x.startswith(FAR) else x for x in tags)
        # the arguments and factories it was computed from through other ops: a cast of them is no cast of it
        self.far = tuple(x[len(FAR):] for x in tags if x.startswith(FAR))
        # a caller's argument it is a view of (``x[:, 0]``, ``x.view(...)``): the ops a cast of it is carried through
        self.through = viewed(getattr(t, "_td_origin", None))[1] if any(
            x.startswith(("input ", "kwarg ")) for x in self.tags) else ()

    def tensor(self, device: torch.device | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A new meta tensor standing for this operand (moved to ``device``, cast to ``dtype``)."""
        with torch._C.DisableTorchFunction():
            out = self.meta.to(dtype) if dtype is not None and dtype != self.meta.dtype else self.meta.detach()
        out.__dict__["_td_device"] = device or self.device  # the rules read it as the device (tensor_device)
        return out


# one op between a factory and the operand that cannot change its dtype: its dtype fix is judged at the op still
_KEEPS_DTYPE = frozenset({"Tensor.to", "aten.view", "aten._unsafe_view", "aten.reshape", "aten.clone", "aten.expand",
                          "aten.unsqueeze", "aten.squeeze", "aten.t", "aten.transpose", "aten.permute", "aten.slice",
                          "aten.select", "aten.contiguous", "aten.detach", "aten._to_copy"})
FAR = "far "  # a name's mark in ``tags_of``: an argument or factory the operand was computed from through other ops


def tags_of(t: Any, module_paths: dict[int, str]) -> tuple[tuple[str, ...], bool]:
    """The names a fix may call operand ``t`` by (its path, the program's name for it, the named tensors, maker,
    cast line or caller's argument it was made from, the line that moved a copy of it), and whether it is a model
    tensor. The caller's arguments and the factories it was computed from through other ops are marked ``FAR`` (a cast
    of such an argument can be undone on the way: a bf16 timestep times fp32 frequencies is fp32 again, so only a
    re-run proves it). The same names the recorder writes into a problem's sources, so a fix's ``sets`` meet them."""
    from torchdoctor._virtual.moveby import is_own
    from torchdoctor._virtual.tensor import held_by

    path = getattr(t, "_td_path", None)
    tags: list[str] = []
    if path:
        tags.append(path)
    else:
        held = held_by(t)
        if held:
            tags.append(held)
    o = getattr(t, "_td_origin", None)
    if o is not None:
        # made from them by one op, or it itself; or a caller's argument it views through ops that keep its dtype
        # (``x[:, 0]``, a linear's ``x.view(-1, n)``): a cast of the argument is a cast of the view
        near = o.paths if o.via is None else viewed(o)[0]
        for src in dict.fromkeys((o.source, o.placed_by)):  # what set its dtype, what placed it (through casts)
            # a cast at a line several ops upstream (``w.float() + delta`` then more): another operand may set the
            # dtype on the way, so only a re-run proves its fix
            # a model tensor an op combined with an unnamed one of its dtype (``image_embeds = proj(h)`` from the
            # weight and an fp32 activation): casting the weight alone does not cast what the op makes
            tags.extend(FAR + x if x.startswith("cast at ") and not _near(o, src) or src.mixed else x
                        for x in src.paths)
            if str(src.op).startswith("torch.") and not src.paths:
                mp = module_paths.get(id(src.module)) if src.module is not None else None
                tags.append((FAR if not _near(o, src) else "") + (
                    f"factory {src.op} in `{mp or '<root>'}`" if src.module is not None else
                    f"factory {src.op}") + (f" at {src.at}" if src.at else ""))
        src = o.source
        if src.site is not None and src.module is not None and not is_own(src.site.file):  # a library's cast
            from torchdoctor._virtual.libout import OUTPUT
            tags.append(("" if o.module is src.module else FAR) +  # made in that module: its output as it is
                        f"{OUTPUT}`{module_paths.get(id(src.module), '')}` {type(src.module).__name__} cast at "
                        f"{src.site.at}")
        if not path and not o.paths and o.at and str(o.op).startswith(("Tensor.", "torch.")) and \
                not any("factory " in x for x in tags) and is_own(LINES.get(o.at, ("", 0))[0]):  # the op of the
            tags.append(f"made {o.op} at {o.at}")  # program's line that made it (``madeline``)
        if o.op == "Tensor.to" and o.at and path:
            tags.append(f"moved {path} at {o.at}")
        pb = o.placed_by
        if not path and pb.op == "Tensor.to" and pb.at:  # a copy moved by the program's own line (``.cuda()``)
            near_move = pb is o or (o.via is pb and str(o.op) in _KEEPS_DTYPE)
            tags.append(("" if near_move else FAR) + f"moved a tensor at {pb.at}")
        tags = [FAR + x if x.startswith(("input ", "kwarg ")) and x not in near and x != path else x for x in tags]
    return tuple(tags), isinstance(path, str) and bool(path) and not path.startswith(("input ", "kwarg "))


def viewed(o: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the caller's arguments, the ops from them in order) when origin record ``o`` was made from a caller's
    argument through ops that keep its dtype and device only (views, copies); else ((), ())."""
    link, ops = o, list[str]()
    while link is not None and link.via is not None and str(link.op) in _KEEPS_DTYPE and len(ops) < DEPTH:
        if link.depth >= DEPTH:  # a record past the chain's last kept link stands for any number of ops
            return (), ()
        ops.append(str(link.op))
        link = link.via
    if link is None or link.via is not None or not ops or str(link.op) != "argument":
        return (), ()
    return tuple(p for p in link.paths if p.startswith(("input ", "kwarg "))), tuple(reversed(ops))


def _near(o: Any, src: Any) -> bool:
    """``src`` made ``o`` itself, or ``o`` came from it through ops that keep a dtype and a device (views, copies)."""
    link, n = o, 0
    while link is not src:
        # a record past the chain's last kept link stands for any number of ops: never near what it came from
        # (the caller's argument cast as it was moved, ``x.to(device, dtype=...)``: the argument is that cast's tensor)
        if link is None or str(link.op) not in _KEEPS_DTYPE and not (link.op == "argument" and link.moves) or \
                n > 8 or link.depth >= DEPTH:
            return False
        link, n = link.via, n + 1
    return True

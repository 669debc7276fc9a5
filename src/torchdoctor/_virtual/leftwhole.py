"""A module never moved as a whole (a layer a LoRA unload rebuilt from a cpu backup, a helper kept in a plain
list ``Module.to`` never reaches): moved whole, once, in the model's dtype too when it was made again in another
one (``torchdoctor.move(unet.conv_in, 'cuda:1', torch.bfloat16)``), never a line per tensor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchdoctor._virtual.prove import Fix

__all__ = ["left_whole"]


def left_whole(problems: Sequence[Any], have: dict[str, tuple[Any, Any]], shadowed: set[str] | None = None
               ) -> Fix | None:
    """A module never moved: every tensor it holds was met on the device its problems found — the model, or a
    helper it keeps in a list (``self.helpers = [aux]``, which ``Module.to`` never reaches) — moved whole, once,
    never a line per tensor or a ``device=`` in its class's ``__init__`` for the buffer it registers there. None
    when part of it did move. ``shadowed``: paths a module held apart reported at its own root, which the run
    records once (the model's tensor of that path is not named again): counted as met when on that device."""
    from torchdoctor._guard.maps import code_path
    from torchdoctor._placement import device_str, dtype_str, parse_device
    from torchdoctor._virtual.prove import Fix

    dev = [p for p in problems if p.kind == "device" and p.path in have]
    if any(p.role not in ("parameter", "buffer") for p in dev):  # a plain tensor or a list of them: no module's
        return None  # move reaches it, its own line moves it
    if not dev or len({p.expected for p in dev}) != 1 or len({p.found for p in dev}) != 1 or \
            len(dev) != len([p for p in problems if p.kind == "device"]):
        return None
    parts = [p.path.split(".") for p in dev]
    common = next((i for i in range(min(map(len, parts))) if len({x[i] for x in parts}) > 1), min(map(len, parts)))
    prefix = ".".join(parts[0][:min(common, len(parts[0]) - 1)])  # a module's path: never a tensor's own
    under = {k: d for k, (_, d) in have.items() if not prefix or k.startswith(prefix + ".")}
    if set(under) != {p.path for p in dev} | (set(under) & (shadowed or set())) or {device_str(d) for d in under.values()} != {dev[0].found} or \
            len(under) < 2:  # each of its tensors was met on the wrong device: none is placed by a hook at its call
        return None
    try:
        target = parse_device(dev[0].expected)
    except (ValueError, TypeError, RuntimeError):
        return None
    cast = _odd_dtype(set(under), have)  # made again in another dtype too (a layer restored from a float32 backup)
    to: Any = (target, cast) if cast is not None else target
    return Fix(f"torchdoctor.move({code_path(prefix)}, {device_str(target)!r}{f', torch.{dtype_str(cast)}' if cast else ''})  "
               f"# none of its {len(under)} tensors moved: it was left on {dev[0].found}" +
               (f" in {under_dtype(set(under), have)}" if cast else ""), "path", to, sets=tuple((k, to) for k in under))


def under_dtype(paths: set[str], have: dict[str, tuple[Any, Any]]) -> str:
    from torchdoctor._placement import dtype_str

    return "/".join(sorted({dtype_str(have[k][0]) for k in paths}))


def _odd_dtype(paths: set[str], have: dict[str, tuple[Any, Any]]) -> Any:
    """The floating dtype the rest of the model holds when the tensors ``paths`` all hold another one, else None."""
    mine = {have[k][0] for k in paths if have[k][0].is_floating_point}
    rest = {d for k, (d, _) in have.items() if k not in paths and d.is_floating_point}
    return next(iter(rest)) if len(mine) == 1 and len(rest) == 1 and rest != mine else None

"""An operand fixed at the program's call (``inputs_embeds.masked_scatter(mask, image_features.to(
inputs_embeds.device))``, ``loss_fn(out, target.to(torch.float32))``: ``makers.operand_fix``) proven by a re-run:
while it runs, a torch call at that line that is given the tensor the program names there gets it moved or cast as
the fixed line would (to the device of the other operand the line names, or to the dtype)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

__all__ = ["reoperand", "reoperated"]


def reoperand(source: str, target: Any) -> tuple[str, int, str, str | None, Any] | None:
    """(file, line, the operand's name, the other operand's name, the dtype or device) of ``source`` (``operand
    image_features at app.py:17``) for a re-run; None when its line is not on record."""
    from torchdoctor._virtual.origin import LIKE, LINES

    name, _, at = source.removeprefix("operand ").partition(" at ")
    file, line = LINES.get(at, ("", 0))
    if not file or not name.isidentifier():
        return None
    return file, line, name, LIKE.get(source), target


class _Operands(torch.overrides.TorchFunctionMode):
    def __init__(self, sites: dict[tuple[str, int], list[tuple[str, str | None, Any]]]) -> None:
        super().__init__()
        self.sites = sites

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torchdoctor._virtual.origin import user_frame

        kwargs = dict(kwargs or {})
        f = user_frame(2)
        wants = self.sites.get((f.f_code.co_filename, f.f_lineno)) if f is not None else None
        for name, like, target in wants or ():
            t = f.f_locals.get(name)
            if not isinstance(t, torch.Tensor):
                continue
            other = f.f_locals.get(like) if like else None
            to = other.device if isinstance(other, torch.Tensor) and not isinstance(target, torch.dtype) else target
            args = tuple(a.to(to) if a is t else a for a in args)
            kwargs = {k: v.to(to) if v is t else v for k, v in kwargs.items()}
        return func(*args, **kwargs)


@contextlib.contextmanager
def reoperated(fixes: Sequence[Any]) -> Iterator[None]:
    """While a re-run runs: each operand a fix moves or casts at its line is given so there."""
    sites: dict[tuple[str, int], list[tuple[str, str | None, Any]]] = {}
    for f in fixes:
        if (r := getattr(f, "reoperand", None)) is not None:
            sites.setdefault((r[0], r[1]), []).append(r[2:])
    if not sites:
        yield
        return
    with _Operands(sites):
        yield

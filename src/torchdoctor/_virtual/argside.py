"""A model placed over several devices (a device map, accelerate's hooks, parts moved by hand) computes each part
where it sits; a tensor made from what the caller passed in (``labels``, ``input_ids``) stays where the caller made
it. At an op where the two meet (a loss inside the forward: ``losses.sum() / (labels != -100).sum()``), the
argument's side is the odd one out: the model's side is on the device its weights were put, which the program chose,
and moving it (or the weights) would undo the split.
"""

from __future__ import annotations

from typing import Any

_ARG = ("input ", "kwarg ")


def side(t: Any) -> str | None:
    """``"model"`` for a model tensor or one made from model tensors, ``"argument"`` for a caller's argument or one
    made from it alone, None when the record says neither (a factory, a tensor made before the run)."""
    path = getattr(t, "_td_path", None)
    if isinstance(path, str) and path:
        return "argument" if path.startswith(_ARG) else "model"
    link = getattr(t, "_td_origin", None)
    while link is not None:
        if link.arg is not None:
            return "argument"
        paths = link.made_of if link.site is not None else link.paths
        if paths:
            if all(p.startswith(_ARG) for p in paths):
                return "argument"
            return "model" if not any(p.startswith(_ARG) for p in paths) else None
        link = link.via
    return None


def model_made(t: Any) -> bool:
    """``t`` is a parameter of a model, a model tensor, or made from model tensors alone."""
    import torch

    return isinstance(t, torch.nn.Parameter) or side(t) == "model"


def computed(t: Any) -> bool:
    """``t`` was computed from model tensors inside a module's forward (a loss's ``losses`` in the model's own loss
    function), not a copy of them taken outside (an EMA's ``deepcopy(model).to("cpu")``)."""
    origin = getattr(t, "_td_origin", None)
    return getattr(t, "_td_path", None) is None and origin is not None and origin.module is not None \
        and side(t) == "model"


def model_side(groups: dict[Any, list[Any]], call: Any) -> tuple[list[Any], Any] | None:
    """Of two devices' operands, the ones made from the caller's arguments (to go where the other group, made from
    the model's tensors, is) and that device; None unless one group is the model's side and the other the
    arguments' side throughout."""
    if len(groups) != 2:
        return None
    sides = {dev: {side(call.at(k)) for k in keys} for dev, keys in groups.items()}
    model = [dev for dev, s in sides.items() if s == {"model"}]
    args = [dev for dev, s in sides.items() if s == {"argument"}]
    if len(model) != 1 or len(args) != 1:
        return None
    return groups[args[0]], model[0]


def local_at(t: Any) -> str | None:
    """``labels at app.py:17``: the one local of the program's frame running now that is on ``t``'s device and is
    written on its line (``losses.sum() / (labels != -100).sum()``: ``labels``), the name a fix moves there; None
    when there is not exactly one."""
    import linecache
    import re

    import torch

    from torchdoctor._placement import norm_device, tensor_device
    from torchdoctor._virtual.origin import LINES, short_at, user_frame

    f = user_frame(2)
    if f is None:
        return None
    line = linecache.getline(f.f_code.co_filename, f.f_lineno)
    dev = norm_device(tensor_device(t))
    hits = [n for n, v in f.f_locals.items() if isinstance(v, torch.Tensor) and re.search(
        rf"(?<![\w.]){re.escape(n)}\b", line) and norm_device(tensor_device(v)) == dev]
    if len(hits) != 1:
        return None
    at = short_at(f)
    LINES[at] = (f.f_code.co_filename, f.f_lineno)
    return f"{hits[0]} at {at}"

"""A network patched into a model's forward, named as the program holds it.

sd-scripts-style LoRA networks keep their modules apart from the model and hand each one to a base layer as its
``forward`` (``base.forward = lora.forward``). A run meets those modules only through the base layer, so the walk
names their tensors ``4.forward.__self__.lora_up.weight``: true, but no user wrote it. While a problem on such a
tensor is recorded, the program's frames are still alive; the module the program itself holds (a local or global
``network`` whose modules include the patched one) gives the path the user knows: ``network.loras.4.lora_up.weight``.
"""

from __future__ import annotations

import contextlib
import sys
from types import FrameType
from typing import Any

import torch

MARK = ".forward.__self__."


def _patched(roots: list[torch.nn.Module], head: str) -> torch.nn.Module | None:
    """The module whose ``forward`` the layer at ``head`` now calls."""
    for root in roots:
        with contextlib.suppress(Exception):
            layer = root.get_submodule(head) if head else root
            obj = getattr(layer.forward, "__self__", None)
            if isinstance(obj, torch.nn.Module) and obj is not layer:
                return obj
    return None


def held_path(path: str, roots: list[torch.nn.Module], frame: FrameType | None,
              cache: dict[int, tuple[str, str] | None]) -> tuple[str, str] | None:
    """``(program path, the holder's name)`` for a ``MARK`` path, from the first frame (innermost first) whose
    locals hold a module containing the patched one; None when none does."""
    head, _, tail = path.partition(MARK)
    obj = _patched(roots, head)
    if obj is None:
        return None
    if id(obj) not in cache:
        cache[id(obj)] = None
        seen: set[int] = {id(r) for r in roots}
        f = frame
        while f is not None and cache[id(obj)] is None:
            for name, v in list(f.f_locals.items()):
                if not isinstance(v, torch.nn.Module) or id(v) in seen or name.startswith("_") or v is obj:
                    continue
                seen.add(id(v))
                sub = next((n for n, m in v.named_modules() if m is obj), None)
                if sub is not None:
                    cache[id(obj)] = (f"{name}.{sub}" if sub else name, name)
                    break
            f = f.f_back
    found = cache[id(obj)]
    return None if found is None else (f"{found[0]}.{tail}", found[1])


def rename(problems: list[Any], renames: dict[str, str]) -> list[Any]:
    """The problems with their patched paths as the program holds them (messages included)."""
    from dataclasses import replace

    # the module paths too: ``10.forward.__self__.lora_down`` is ``network.loras.10.lora_down``
    prefixes = {old[:-len(old.partition(MARK)[2])]: new[:-len(old.partition(MARK)[2])]
                for old, new in renames.items() if old.partition(MARK)[2] and new.endswith(old.partition(MARK)[2])}

    def said(text: str | None) -> str | None:
        for a, b in prefixes.items():
            text = text.replace(a, b) if text else text
        return text

    out = []
    for p in problems:
        new = renames.get(p.path)
        if new is None and not any(a in (p.message or "") for a in prefixes):
            out.append(p)
            continue
        out.append(replace(p, path=new or p.path, message=said(p.message.replace(p.path, new) if new else p.message),
                           module_path=said(p.module_path)))
    return out


def apart(made: Any, roots: list[torch.nn.Module]) -> tuple[tuple[str, ...], str, str] | None:
    """The parameters a record's op took from a module patched into a layer's ``forward`` (a LoKr / LoRA network the
    program holds apart from the model): named by their walk paths (``attn.forward.__self__.w1``, as ``made.paths``);
    returned with every tensor of that network's patched modules (the sources of its fix: the whole network is
    cast or moved where it is built), what to say of it, and its key (one problem per network)."""
    if not made.loose or made.paths:
        return None
    patched: dict[int, tuple[str, torch.nn.Module]] = {}
    for root in roots:
        with contextlib.suppress(Exception):
            for name, layer in root.named_modules():
                obj = getattr(layer.forward, "__self__", None)
                if isinstance(obj, torch.nn.Module) and obj is not layer:
                    patched[id(obj)] = (name, obj)
    names, owner = [], None
    for t in made.loose:
        for name, obj in patched.values():
            rel = next((n for n, p in obj.named_parameters() if p is t), None)
            if rel is not None:
                names.append(f"{name}{MARK}{rel}" if name else f"forward.__self__.{rel}")
                owner = owner or (name, obj)
                break
    if owner is None:
        return None
    made.paths, made.count = tuple(names), len(names)
    held = held_path(f"{owner[0]}{MARK}", roots, sys._getframe(1), {})
    holder = held[1] if held is not None else None
    group = [(n, o) for n, o in patched.values() if holder is None or o is owner[1] or _holds(sys._getframe(1), holder, o)]
    every = tuple(f"{n}{MARK}{r}" for n, o in group for r, _ in o.named_parameters())
    said = (f"{held[0].rstrip('.')} as the program holds it, " if held is not None else "") + (
        f"a {type(owner[1]).__name__} patched into {owner[0] or '<root>'}.forward: the model does not hold it")
    return every, said, holder or owner[0]


def _holds(frame: FrameType | None, holder: str, obj: torch.nn.Module) -> bool:
    """The program's module called ``holder`` (a local of a live frame) holds ``obj``."""
    while frame is not None:
        v = frame.f_locals.get(holder)
        if isinstance(v, torch.nn.Module):
            return any(m is obj for m in v.modules())
        frame = frame.f_back
    return False

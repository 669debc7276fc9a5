"""A network patched into the model's forwards (sd-scripts / LyCORIS style: ``org.forward = lora.forward``) whose
parameters are in another dtype than the model: its modules are no submodules of the model, so ``model.to(...)``
never reaches them and the model's path to them (``attn.forward.__self__``) is nothing the user wrote. Explained by
the network as the program holds it (``network``, a local of the calling code), the layers it is patched into, its
parameters and the line in its forward that reads them, with the fix ``network.to(<model dtype>)`` after the line
that made it, proven by re-running the model with the network's parameters so cast (put back after).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def explain_network(session: Any, exc: BaseException, tb: Any, mod: Any, maps: Any, root: Any) -> Any:
    """The report (a ``PlacementError``) when the failing module is such a network's, else None."""
    from torchdoctor._guard.frames import user_frames
    from torchdoctor._guard.remedy import with_patch
    from torchdoctor._report.model import PlacementError
    from torchdoctor._report.text import format_error

    told = network_told(session, mod, maps, root, user_frames(exc.__traceback__ or tb))
    if told is None:
        return None
    head, lines, fix, patch, problems, kind = told
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lines = [*lines, f"original error: {type(exc).__name__}: {first}"]
    err = PlacementError(format_error(head, lines, fix), module_path=None, module_type=kind, op=None,
                         problems=problems, fix=fix)
    return with_patch(err, patch, lines)


def network_told(session: Any, mod: Any, maps: Any, root: Any, frames: list[Any]) -> Any:
    """(headline, lines ending in the proof, fix, diff, problems, the network's module type) when ``mod`` belongs
    to a network patched into ``root``'s forwards whose parameters differ from the model's dtype, else None."""
    if not isinstance(mod, nn.Module) or not isinstance(root, nn.Module) or maps is None \
            or any(m is mod for m in root.modules()):
        return None
    layers = [p or "<root>" for p, m in root.named_modules() if getattr(m.__dict__.get("forward"), "__self__", None)
              is mod]
    want = maps.dtype_for("")
    odd = [(n, p) for n, p in mod.named_parameters() if p.is_floating_point() and p.dtype != want]
    if not layers or not isinstance(want, torch.dtype) or not odd:
        return None
    from torchdoctor._guard.computed import replaying
    from torchdoctor._guard.maps import value_code
    from torchdoctor._guard.remedy import own_file, rerun
    from torchdoctor._placement import dtype_str
    from torchdoctor._report.diff import line_patch
    from torchdoctor._report.model import Problem
    from torchdoctor._rules import registry as _rules

    held = _holder(frames, mod, root)
    name, sub, frame, net = held if held is not None else ("network", "", None, mod)
    patched = [p or "<root>" for p, m in root.named_modules() if any(
        getattr(m.__dict__.get("forward"), "__self__", None) is x for x in net.modules())]
    kind = type(mod).__name__
    head = (f"dtype mismatch in `{name}` ({kind} patched into `{'`, `'.join(patched[:3])}`): its parameters are "
            f"{dtype_str(odd[0][1].dtype)} while the model is {dtype_str(want)}")
    lines = [f"culprit `{name}`: a network outside the model, patched into the model's forwards "
             f"({', '.join(patched[:4])}{', ...' if len(patched) > 4 else ''}); model.to(...) never reaches it"]
    where = f"{name}.{sub}." if sub else f"{name}."
    lines += [f"culprit {where}{n}: {_rules._compact(p)}  (expected {dtype_str(want)})" for n, p in odd[:4]]
    read = _reads(mod, [n for n, _ in odd])
    if read is not None:
        lines.append(f"{', '.join(n for n, _ in odd[:2])} read by `{read[2]}` at {read[0]}:{read[1]}")
    fix = f"{name}.to({value_code(want)})"
    made = _assigned(frame, name) if frame is not None else None
    patch = None
    if made is not None and own_file(made[0]):
        fix += f"  # after {os.path.basename(made[0])}:{made[1]}"
        patch = line_patch(made[0], made[1], f"{made[2].strip()}\n{name}.to({value_code(want)})")
    tried = f"`{name}` -> {value_code(want)}"
    inputs = tuple(session.frames.inputs_of(root))
    with replaying(session):
        proof = rerun(root, inputs, session.frames, tried, _cast(net, want)) if inputs else None
    proof = proof or \
        f"fix unproven: {tried} not re-run (the model's inputs are not known)"
    problems = [Problem("dtype", f"{where}{n}", "parameter", dtype_str(p.dtype), dtype_str(want),
                        f"{where}{n} is {dtype_str(p.dtype)} in a network patched into the model's forwards, expected "
                        f"{dtype_str(want)}", module_type=kind) for n, p in odd]
    return head, lines + [proof], fix, patch, problems, kind


def _holder(frames: list[Any], mod: nn.Module, root: nn.Module) -> tuple[str, str, Any, nn.Module] | None:
    """(name, path inside it, frame, module) of the program's own local module holding ``mod`` (not the model)."""
    for f in reversed(frames):
        for name, v in list(f.f_locals.items()):
            if isinstance(v, nn.Module) and v is not root and not name.startswith("_") and name != "self":
                sub = next((p for p, m in v.named_modules() if m is mod), None)
                if sub is not None:
                    return name, sub, f, v
    return None


def _assigned(frame: Any, name: str) -> tuple[str, int, str] | None:
    """(file, line, source line) of the newest ``<name> = ...`` in the frame's function."""
    import ast

    from torchdoctor._guard.maker import _parsed as parsed_code

    parsed = parsed_code(frame.f_code)
    if parsed is None:
        return None
    tree, off, path, lines = parsed
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.lineno == n.end_lineno
            and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    if not hits:
        return None
    n = max(hits, key=lambda n: n.lineno)
    return path, n.lineno + off, lines[n.lineno - 1].rstrip("\r\n")


def _reads(mod: nn.Module, names: list[str]) -> tuple[str, int, str] | None:
    """(file name, line, source) of the first line of the module's forward that reads ``self.<name>``."""
    try:
        lines, start = inspect.getsourcelines(type(mod).forward)
        path = inspect.getsourcefile(type(mod).forward) or ""
    except (OSError, TypeError):
        return None
    for i, line in enumerate(lines):
        if any(f"self.{n}" in line for n in names):
            return os.path.basename(path), start + i, line.strip()
    return None


@contextlib.contextmanager
def _cast(net: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """The network's floating parameters and buffers cast to ``dtype`` for a re-run, put back after."""
    kept = [(t, t.data) for t in [*net.parameters(), *net.buffers()] if t.is_floating_point()]
    try:
        for t, data in kept:
            t.data = data.to(dtype)
        yield
    finally:
        for t, data in kept:
            t.data = data

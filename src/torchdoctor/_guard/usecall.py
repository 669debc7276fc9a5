"""The program's line that hands a component its input: the call at a frame's line on a module holding the failing
layer (``self.vae.decode(latents / s)``, ``vae(latents)``), the component as that line names it, the local tensors it
passes in the odd dtype or on the odd device, and the line rewritten with those cast or moved where they are handed
over (``latents.to(self.vae.dtype)``). Read from live frames (a virtual run's failing op, guard's traceback): names
are looked up in instance dicts and submodules only, never a property, and the line is parsed, never run.

A component the program keeps in its dtype or on its device on purpose is fixed there (``_virtual/keptside``,
``kept``): casting the component undoes the program's choice, and the input's maker feeds other components too."""

from __future__ import annotations

import ast
import linecache
import textwrap
from typing import Any

import torch

from torchdoctor._virtual.usesite import resolve

__all__ = ["Site", "fed_elsewhere", "site_call", "use_site"]



class Site:
    """One call that hands a component its input: the component, its name at the line, the input's local names, the
    line's body fixed, the line's file and number, and whether the input is cast on that line itself."""

    __slots__ = ("comp", "recv", "names", "new", "file", "line", "cast")

    def __init__(self, comp: torch.nn.Module, recv: str, names: tuple[str, ...], new: str, file: str,
                 line: int, cast: bool = False) -> None:
        self.comp, self.recv, self.names, self.new, self.file, self.line = comp, recv, names, new, file, line
        self.cast = cast  # the input is cast on this line itself: its only reader is the component


def site_call(frame: Any, line: int, layer: torch.nn.Module, kind: str, other: Any) -> Site | None:
    """The call at ``line`` of ``frame`` on a module holding ``layer`` given local tensors in ``other`` (a dtype,
    or a device as ``norm_device`` writes it); None when the line holds no such call or is not the program's own."""
    from torchdoctor._guard.ownfile import own_file

    file = frame.f_code.co_filename
    if not own_file(file):
        return None
    body = linecache.getline(file, line).strip()
    try:
        tree = ast.parse(body) if body.isascii() else None
    except SyntaxError:
        return None
    if tree is None or _inside(frame, layer):
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for recv_node in (node.func, getattr(node.func, "value", None)):
            if recv_node is None or not _chain(recv_node):
                continue
            recv = ast.unparse(recv_node)
            comp = _resolve(recv, frame)
            if not isinstance(comp, torch.nn.Module) or not any(m is layer for m in comp.modules()):
                continue
            if recv_node is not node.func and not _method(comp, node.func.attr):  # type: ignore[attr-defined]
                continue  # ``s.blocks(h)``: a submodule called, not a method of ``s``
            spots = [n for a in (*node.args, *(k.value for k in node.keywords)) for n in ast.walk(a)
                     if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and
                     _odd(frame.f_locals.get(n.id, frame.f_globals.get(n.id)), kind, other)]
            want = f"{recv}.{kind}" if isinstance(getattr(type(comp), kind, None), property) else \
                f"next({recv}.parameters()).{kind}"
            if not spots:
                return _cast_arg(node, kind, want, body, comp, recv, file, line) or \
                    _made_inline(node, kind, other, want, body, comp, recv, file, line, frame)
            new = body
            for n in sorted(spots, key=lambda n: n.col_offset, reverse=True):
                new = new[:n.col_offset] + f"{n.id}.to({want})" + new[n.end_col_offset or n.col_offset:]
            return Site(comp, recv, tuple(dict.fromkeys(n.id for n in spots)), new, file, line)
    return None


def _cast_arg(node: ast.Call, kind: str, want: str, body: str, comp: torch.nn.Module, recv: str, file: str,
              line: int) -> Site | None:
    """The call's argument cast at the line itself (``vae.encode(batch["x"].to(device, dtype=weight_dtype))``): its
    dtype written as the component's (``dtype=vae.dtype``); None when no argument is such a cast."""
    if kind != "dtype":
        return None
    for a in (*node.args, *(k.value for k in node.keywords)):
        if not isinstance(a, ast.Call) or not isinstance(a.func, ast.Attribute) or a.func.attr != "to":
            continue
        dt = next((k.value for k in a.keywords if k.arg == "dtype"), a.args[1] if len(a.args) == 2 else None)
        if dt is None or dt.end_col_offset is None:
            continue
        new = body[:dt.col_offset] + want + body[dt.end_col_offset:]
        return Site(comp, recv, (ast.unparse(a.func.value),), new, file, line, cast=True)
    return None


def _made_inline(node: ast.Call, kind: str, other: Any, want: str, body: str, comp: torch.nn.Module, recv: str,
                 file: str, line: int, frame: Any) -> Site | None:
    """The call's argument is another component's output made on that line (``lm(inputs_embeds=projector(feats))``):
    that call, whose module is whole in ``other``, wrapped as it is handed over (``projector(feats).to(lm.dtype)``);
    None when no argument is such a call."""
    for a in (*node.args, *(k.value for k in node.keywords)):
        if not isinstance(a, ast.Call) or not _chain(a.func) or a.end_col_offset is None:
            continue
        made = _resolve(ast.unparse(a.func), frame)
        if not isinstance(made, torch.nn.Module) or any(m is comp for m in made.modules()) or \
                any(m is made for m in comp.modules()):
            continue
        own = [t for t in (*made.parameters(), *made.buffers()) if kind == "device" or t.is_floating_point()]
        if not own or not all(_odd(t, kind, other) for t in own):
            continue
        text = body[a.col_offset:a.end_col_offset]
        new = body[:a.col_offset] + f"{text}.to({want})" + body[a.end_col_offset:]
        return Site(comp, recv, (f"{ast.unparse(a.func)}(...)",), new, file, line)
    return None


def use_site(tb: Any, layer: torch.nn.Module, kind: str, other: Any) -> Site | None:
    """The innermost frame of the program's own code on traceback ``tb`` whose line hands ``layer``'s component an
    input in ``other`` (``site_call``); None when none does."""
    from torchdoctor._guard.frames import lineno, user_frames

    try:
        for f in reversed(user_frames(tb)):
            site = site_call(f, lineno(f), layer, kind, other)
            if site is not None:
                return site
    except Exception:  # a diagnostic never breaks the program it watches: no use site
        return None
    return None


def fed_elsewhere(frame: Any, names: tuple[str, ...], layer: torch.nn.Module) -> bool:
    """A local in ``names`` is handed, at another line of the frame's function, to a module that does not hold
    ``layer`` (``self.transformer(latents, t)`` before ``self.vae.decode(latents / s)``): the input has another
    consumer, which needs it as its maker makes it."""
    import inspect

    code = frame.f_code
    try:
        if code.co_name == "<module>":
            lines, start = linecache.getlines(code.co_filename), 1
        else:
            lines, start = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, ValueError):
        return False
    here = frame.f_lineno - start + 1
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or node.lineno == here or not _chain(node.func):
            continue
        if not any(isinstance(n, ast.Name) and n.id in names for a in (*node.args, *(k.value for k in node.keywords))
                   for n in ast.walk(a)):
            continue
        for recv in (node.func, getattr(node.func, "value", None)):
            obj = _resolve(ast.unparse(recv), frame) if recv is not None and _chain(recv) else None
            if isinstance(obj, torch.nn.Module) and not any(m is layer for m in obj.modules()):
                return True
    return False


def _inside(frame: Any, layer: torch.nn.Module) -> bool:
    """The frame runs a method of a module holding ``layer`` (the model's own forward calling its parts): the model
    hands its parts their inputs, not the program."""
    code = frame.f_code
    me = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
    if not isinstance(me, torch.nn.Module) or not any(m is layer for m in me.modules()):
        return False
    return any(getattr(k.__dict__.get(code.co_name), "__code__", None) is code for k in type(me).__mro__)


def _method(comp: torch.nn.Module, name: str) -> bool:
    """``name`` is a method of ``comp``'s class (``decode``), not a submodule or a plain attribute."""
    return name not in comp._modules and callable(getattr(type(comp), name, None))


def _chain(node: Any) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _resolve(text: str, frame: Any) -> Any:
    """The object ``a.b.c`` names in ``frame``, read from instance dicts and submodules only."""
    return resolve(text, frame.f_locals, frame.f_globals)


def _odd(v: Any, kind: str, other: Any) -> bool:
    from torchdoctor._placement import norm_device, tensor_device

    if not isinstance(v, torch.Tensor):
        return False
    return v.dtype == other if kind == "dtype" else norm_device(tensor_device(v)) == other

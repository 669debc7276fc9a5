"""Where the program uses a module it calls itself: the line of its own code that called a module starting a forward
outside any other (``emb = self.clip.model(ids)`` in a node, ``self.semantic.input_embeds_layer(input_ids)`` in a
``generate``), with the call as that line writes it and the tensor it passes first. A model that an offloading
mechanism moved away between two uses (a manager's free-memory call, an accelerate hook) is fixed there, where the
program uses it (``offloaduse``), never inside the mechanism.

Noted when such a module starts, in a virtual run only: the line is parsed once, the call's names are looked up in
the frame (instance dicts and submodules only: no property runs), and the run's module moves recorded so far are
counted, so a fix reads the moves that came before the use and not those after it.
"""

from __future__ import annotations

import ast
import linecache
import sys
import threading
import weakref
from typing import Any

import torch

_MISSING = object()
_OWN: dict[str, bool] = {}  # file -> own_file's answer, for the run's process
_CALLS: dict[tuple[str, int], tuple[tuple[str, int, int, str], ...] | None] = {}  # a line's calls, parsed once


class Use:
    """One use: the program's ``file:line``, its function's code, the call's text and span in the line's body (its
    indent apart), the text of the tensor it passes first ("" when it is no plain name), the indent, how many module
    moves each active run had recorded when it started (by a weak reference to the run's ``modcast.Casts``), the code
    of the program's own frames that called it (innermost first), and its thread. A plain class: a dataclass would
    compile its methods at import, on the path of every virtual run. ``lines``: the line each of ``callers`` was
    at."""

    __slots__ = ("file", "line", "at", "code", "func", "span", "arg", "indent", "moved", "callers", "thread", "lines",
                 "outer", "owner")

    def __init__(self, file: str, line: int, at: str, code: Any, func: str, span: tuple[int, int], arg: str,
                 indent: str, moved: tuple[tuple[Any, int], ...] = (), callers: tuple[Any, ...] = (),
                 thread: int = 0, lines: tuple[int, ...] = ()) -> None:
        self.file, self.line, self.at, self.code, self.func = file, line, at, code, func
        self.span, self.arg, self.indent, self.moved, self.callers, self.thread = span, arg, indent, moved, callers, \
            thread
        self.lines = lines
        self.outer: Use | None = None  # a use in a method of the model (``decode``): the program's call of it
        self.owner: Any = None  # (on such an outer use) a weak reference to that model

    def moved_in(self, casts: Any) -> int | None:
        """How many module moves ``casts`` had recorded when this use started; None when it was not recording."""
        return next((n for ref, n in self.moved if ref() is casts), None)


_USES: weakref.WeakKeyDictionary[torch.nn.Module, Use] = weakref.WeakKeyDictionary()


def own_cached(file: str) -> bool:
    hit = _OWN.get(file)
    if hit is None:
        from torchdoctor._guard.ownfile import own_file

        hit = _OWN[file] = own_file(file) if not file.startswith("<") else False
        if len(_OWN) > 4096:
            _OWN.clear()
    return hit


def _calls(file: str, line: int) -> tuple[tuple[str, int, int, str], ...] | None:
    """(the callee's text, its start and end in the body, the first argument's text when a name) of each call at the
    line whose callee is a name or a chain of attributes; None when the line does not parse alone."""
    key = (file, line)
    if key in _CALLS:
        return _CALLS[key]
    body = linecache.getline(file, line).strip()
    out: tuple[tuple[str, int, int, str], ...] | None
    try:
        tree = ast.parse(body) if body.isascii() else None
    except SyntaxError:
        tree = None
    if tree is None:
        out = None
    else:
        found = []
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and (_chain(n.func) is not None or _getter(n.func)) and \
                    n.func.end_col_offset is not None:
                first = n.args[0] if n.args else next((k.value for k in n.keywords if k.arg), None)  # (input_ids=)
                arg = ast.unparse(first) if first is not None and _chain(first) is not None else ""
                found.append((ast.unparse(n.func), n.func.col_offset, n.func.end_col_offset, arg))
        out = tuple(found)
    if len(_CALLS) < 4096:
        _CALLS[key] = out
    return out


def _chain(node: Any) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _getter(node: Any) -> bool:
    """``a.b.get_input_embeddings()``: a method called with no argument on a chain (it hands back a submodule)."""
    return isinstance(node, ast.Call) and not node.args and not node.keywords and \
        isinstance(node.func, ast.Attribute) and _chain(node.func.value) is not None


def _under(text: str, mod: torch.nn.Module, frame_locals: Any, frame_globals: Any) -> bool:
    """``text`` is a getter call (``_getter``) on a module that holds ``mod``: the getter is never run, the module
    is found under the chain it is called on."""
    if not text.endswith("()") or "." not in text:
        return False
    owner = resolve(text[:-2].rpartition(".")[0], frame_locals, frame_globals)
    return isinstance(owner, torch.nn.Module) and any(m is mod for _, m in zip(range(4096), owner.modules()))


def _method(calls: Any, mod: torch.nn.Module, frame_locals: Any, frame_globals: Any) -> tuple[Any, Any]:
    """(the call as ``_calls`` gives it, cut to the model it is called on, and that model) for a call of a method
    (``vae.decode(z)``, ``pipe.unet.forward(x)``) of a module that holds ``mod``; (None, mod) when there is none."""
    for text, start, _, arg in calls:
        owner_text, _, name = text.rpartition(".")
        if not owner_text or owner_text.endswith("()"):
            continue
        owner = resolve(owner_text, frame_locals, frame_globals)
        if isinstance(owner, torch.nn.Module) and name not in owner._modules and \
                any(m is mod for _, m in zip(range(4096), owner.modules())):
            return (owner_text, start, start + len(owner_text), arg), owner
    return None, mod


def resolve(text: str, frame_locals: Any, frame_globals: Any) -> Any:
    """The object ``a.b.c`` names in a frame, read from instance dicts and submodules only; ``_MISSING`` when not."""
    parts = text.split(".")
    obj = frame_locals.get(parts[0], _MISSING)
    if obj is _MISSING:
        obj = frame_globals.get(parts[0], _MISSING)
    for p in parts[1:]:
        if obj is _MISSING:
            break
        d = getattr(obj, "__dict__", None)
        val = d.get(p, _MISSING) if isinstance(d, dict) else _MISSING
        if val is _MISSING and isinstance(obj, torch.nn.Module):
            val = obj._modules.get(p, _MISSING)
        obj = val
    return obj


def note(mod: torch.nn.Module, moved: tuple[tuple[Any, int], ...], depth: int = 2) -> None:
    """``mod`` starts a forward outside any other: remember the program's line that called it, if that line calls
    it by a name the frame holds. ``moved``: the module moves each active run had recorded (``modcast.counts``)."""
    try:
        f: Any = sys._getframe(depth)
        n = 0
        while f is not None and n < 40 and not own_cached(f.f_code.co_filename):
            f, n = f.f_back, n + 1
        if f is None or n >= 40:
            return
        calls = _calls(f.f_code.co_filename, f.f_lineno)
        if not calls:
            return
        key = mod
        hit = next((c for c in calls if resolve(c[0], f.f_locals, f.f_globals) is mod), None) or next(
            (c for c in calls if _under(c[0], mod, f.f_locals, f.f_globals)), None)
        outer = None
        if hit is None:  # a method of a model that holds it (``vae.decode(z)``): the use is that model's
            hit, key = _method(calls, mod, f.f_locals, f.f_globals)
        elif f.f_code.co_name != "forward" and isinstance(me := f.f_locals.get("self"), torch.nn.Module):
            g = f.f_back  # the model's own method (``def decode(self, z): return self.dec(z)``) called by the
            while g is not None and not own_cached(g.f_code.co_filename):  # program: that call is the use too
                g = g.f_back
            up = _method(_calls(g.f_code.co_filename, g.f_lineno) or (), mod, g.f_locals, g.f_globals) \
                if g is not None else (None, mod)
            outer = _use(g, up[0], moved) if up[0] is not None and up[1] is me else None
            if outer is not None:
                outer.owner = weakref.ref(me)
        if hit is None:
            return
        use = _use(f, hit, moved)
        use.outer = outer
        _USES[key] = use
    except Exception:  # a diagnostic never breaks the program it watches: no use is noted
        return


def _use(f: Any, hit: tuple[str, int, int, str], moved: tuple[tuple[Any, int], ...]) -> Use:
    """The use at frame ``f``'s line of the call ``hit`` (as ``_calls`` gives it)."""
    from torchdoctor._virtual.origin import short_at

    file, line = f.f_code.co_filename, f.f_lineno
    arg = hit[3] if hit[3] and isinstance(resolve(hit[3], f.f_locals, f.f_globals), torch.Tensor) else ""
    raw = linecache.getline(file, line).rstrip("\r\n")
    callers: list[Any] = []
    lines: list[int] = []
    g, n = f.f_back, 0
    while g is not None and n < 32 and len(callers) < 8:
        if own_cached(g.f_code.co_filename):
            callers.append(g.f_code)
            lines.append(g.f_lineno)
        g, n = g.f_back, n + 1
    return Use(file, line, short_at(f), f.f_code, hit[0], (hit[1], hit[2]), arg,
               raw[:len(raw) - len(raw.lstrip(" \t"))], moved, tuple(callers), threading.get_ident(), tuple(lines))


def use_of(mod: Any) -> Use | None:
    """The last use noted of ``mod``."""
    try:
        return _USES.get(mod)
    except TypeError:  # an unhashable module
        return None


__all__ = ["Use", "note", "own_cached", "resolve", "use_of"]

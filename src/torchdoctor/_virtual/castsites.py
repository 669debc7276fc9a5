"""Where a forward cast a tensor to another dtype: the cast as the user wrote it (``h.float()``,
``w.to(self.compute_dtype)``), its line, and where the dtype it was cast to was read from (an attribute of the
module, a class attribute, a config), so a dtype problem is fixed where its dtype entered.

A site is recorded once per line (``SITES``, bounded): the record of a made tensor names it by ``at``
(``app.py:12``), and ``fixes`` reads it back to write the fix (``patched_line``: the line rewritten for a diff);
the frame is read only when a cast changes a dtype. Kept apart from ``makers`` (the function mode) so that
``origin`` can name a cast's site without importing the mode that imports it.
"""

from __future__ import annotations

import linecache
import re
import types
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from torchdoctor._report.records import MutableRecord

# ops a dtype cast dispatches to (``.float()``, ``.to(dtype)``, ``.type(...)``, ``type_as``)
CAST_OPS = frozenset({"aten._to_copy", "aten.to", "aten._to_dtype", "aten.type_as", "aten.to_dtype"})
_LIMIT = 512  # sites kept (a forward has few cast lines; the bound keeps a long program's memory flat)
# patterns, compiled by ``re`` (and kept in its cache) when a cast first changes a dtype, not when a run starts
_METHOD = r"\.(float|half|double|bfloat16)\(\s*\)"
_TO = r"\.(?:to|type)\(([^()]*(?:\([^()]*\))?[^()]*)\)"
_KW = r"dtype\s*=\s*([\w.\[\]'\"]+)"


@dataclass(init=False, repr=False, eq=False)
class CastSite(MutableRecord):
    """A line of the user's code that cast a tensor to ``dtype``."""

    at: str  # ``app.py:12`` as reports write it
    file: str  # the absolute path (what a diff and a re-run match)
    lineno: int
    text: str  # the line, stripped
    cast: str  # the cast as written: ``.float()``, ``.to(self.compute_dtype)``
    dtype: torch.dtype
    read_from: str | None = None  # ``the class attribute Deq.compute_dtype``, ``the config self.config.dtype``
    attr: str | None = None  # the attribute the dtype was read from, set on the module to fix it
    module: Any = None  # a weak reference to the module whose attribute it is
    _fields = ("at", "file", "lineno", "text", "cast", "dtype", "read_from", "attr", "module")

    def __init__(self, at: str, file: str, lineno: int, text: str, cast: str, dtype: torch.dtype,
                 read_from: str | None = None, attr: str | None = None, module: Any = None) -> None:
        self.at, self.file, self.lineno, self.text, self.cast, self.dtype = at, file, lineno, text, cast, dtype
        self.read_from, self.attr, self.module = read_from, attr, module

    def owner(self) -> Any:
        return self.module() if self.module is not None else None

    def describe(self) -> str:
        """``h.float() at app.py:24`` and where its dtype came from."""
        src = f" (dtype read from {self.read_from})" if self.read_from else ""
        return f"`{self.cast}` at {self.at}{src}"


SITES: dict[str, CastSite] = {}


def cast_site(frame: Any, at: str, dtype: torch.dtype) -> CastSite | None:
    """The site of the cast running in ``frame`` (the first frame of the user's code), recorded under ``at``."""
    known = SITES.get(at)
    if known is not None and known.dtype == dtype:
        if known.attr is not None and known.owner() is not frame.f_locals.get("self"):
            _read_from(known, frame)  # another instance (a fresh copy) runs the same line: it holds the attribute
        return known
    file, lineno = frame.f_code.co_filename, frame.f_lineno
    text = linecache.getline(file, lineno).strip()
    site = CastSite(at, file, lineno, text, _written(text), dtype)
    _read_from(site, frame)
    from torchdoctor._virtual.devvars import DEVICE_NAMES, device_vars

    if at not in DEVICE_NAMES and len(DEVICE_NAMES) < 4096:  # the program's device names there (``handover``)
        DEVICE_NAMES[at] = device_vars(frame)
    if len(SITES) >= _LIMIT:
        SITES.pop(next(iter(SITES)))
    SITES[at] = site
    return site


def _written(text: str) -> str:
    """The cast as written on the line (the whole line when no cast call is found)."""
    m = re.search(_METHOD, text) or re.search(_TO, text)
    return m.group(0).lstrip(".") if m else text


def _read_from(site: CastSite, frame: Any) -> None:
    """Where ``.to(<expr>)`` read its dtype: ``self.compute_dtype`` is the module's attribute or a class attribute
    of its class; ``self.config.x`` / ``config.x`` a config."""
    method = re.search(_METHOD, site.text)
    if method is not None and method.group(0).lstrip(".") == site.cast:  # ``x.float()``: written in the call, read
        return  # from nothing (a ``.to(x.dtype)`` beside it on the line is another cast)
    m = re.search(_TO, site.text)
    expr = m.group(1).strip() if m else ""
    kw = re.search(_KW, expr)
    expr = kw.group(1) if kw else expr.split(",")[-1].strip()
    parts = expr.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        return
    obj = frame.f_locals.get(parts[0])
    if isinstance(obj, types.ModuleType):  # ``torch.float16`` at a module's top level: written out, read from nothing
        return
    for name in parts[1:-1]:
        obj = getattr(obj, name, None)
    attr = parts[-1]
    if obj is None or isinstance(obj, torch.Tensor) or not isinstance(getattr(obj, attr, None), torch.dtype):
        return  # (a tensor's own dtype, ``x.dtype``, is no attribute a fix sets)
    if "config" in expr.lower() or type(obj).__name__.endswith("Config"):
        site.read_from = f"the config {expr}"
    elif attr in getattr(obj, "__dict__", {}):
        site.read_from = f"the attribute {expr} of {type(obj).__name__}"
    elif any(attr in vars(k) for k in type(obj).__mro__):
        owner = next(k for k in type(obj).__mro__ if attr in vars(k))
        site.read_from = f"the class attribute {owner.__name__}.{attr}"
    else:
        return
    if isinstance(obj, torch.nn.Module) and len(parts) == 2:
        site.attr, site.module = attr, weakref.ref(obj)


def patched_line(site: CastSite, want: torch.dtype, layer: str | None = None) -> str | None:
    """The cast's line with the cast writing ``want`` instead (``h.float()`` -> ``h.to(torch.bfloat16)``), for the
    diff; None when the line holds no cast this can rewrite. Where the cast feeds a layer of the module whose forward
    casts (``self.fc1(h.float())``) held in ``want`` (``layer``: the path of the layer whose op failed), the layer's
    dtype as the program names it (``h.to(self.fc1.weight.dtype)``): right under whatever dtype the program picks."""
    from torchdoctor._placement import dtype_str

    line = linecache.getline(site.file, site.lineno).rstrip("\r\n")
    if len(re.findall(_METHOD, line)) + sum(bool(re.search(r"dtype|float|half|bfloat16|double", a))
                                            for a in re.findall(_TO, line)) > 1:
        return None  # both operands cast on purpose (``q.float() @ k.float()``): one rewritten mixes them (a move,
        # ``.to(x.device)``, is no cast)
    named = _layer_dtype(site, line, want, layer)
    new = f".to({named or 'torch.' + dtype_str(want)})"
    if named is not None and re.search(_METHOD, line):
        return re.sub(_METHOD, new, line, count=1)
    if re.search(_METHOD, line):
        return re.sub(_METHOD, new, line, count=1)
    m = re.search(_TO, line)
    if m is None:
        return None
    kept = _dtype_only(m.group(1), f"torch.{dtype_str(want)}")  # a device beside the dtype stays as written
    return line[:m.start()] + (f".to({kept})" if kept is not None else new) + line[m.end():]


def _dtype_only(args: str, want: str) -> str | None:
    """The arguments of ``.to(...)`` with only the dtype rewritten, the rest as written (``device, dtype=weight_dtype``
    -> ``device, dtype=torch.float32``; ``device, weight_dtype`` -> ``device, torch.float32``); None when the call
    gives the dtype alone (or nothing it can tell), so the whole call becomes ``.to(want)``."""
    import ast

    if not args.isascii():  # offsets are bytes: only plain ASCII is cut by them
        return None
    try:
        call = ast.parse(f"f({args})", mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call) or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    kw = [k.value for k in call.keywords if k.arg == "dtype"]
    node = kw[0] if kw else call.args[1] if len(call.args) >= 2 else \
        call.args[0] if call.keywords and len(call.args) == 1 else None  # ``.to(dtype, non_blocking=True)``
    if node is None or node.end_col_offset is None:
        return None
    return args[:node.col_offset - 2] + want + args[node.end_col_offset - 2:]


def _layer_dtype(site: CastSite, line: str, want: torch.dtype, layer: str | None) -> str | None:
    """``self.fc1.weight.dtype`` where the line hands the cast to ``self.fc1(...)``, the layer whose op failed in
    ``want`` (or, its module known, a layer whose weight is in ``want``); else None."""
    m = re.search(r"\bself\.(\w+)\(([^()]*(?:\([^()]*\))?[^()]*)\)", line)
    if m is None or site.cast not in m.group(2):
        return None
    owner = site.owner()
    weight = getattr(getattr(owner, m.group(1), None), "weight", None) if owner is not None else None
    ok = weight.dtype == want if isinstance(weight, torch.Tensor) else (layer or "").rsplit(".", 1)[-1] == m.group(1)
    return f"self.{m.group(1)}.weight.dtype" if ok else None

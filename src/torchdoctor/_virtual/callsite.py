"""A factory that passes its function's own ``device`` parameter (``torch.randn(..., device=device)`` in
``def load(self, model, device=None)``) made its tensor on the cpu because one call of that function left the
parameter out (``loader.load(m)`` where another call says ``loader.load(m, device=device)``): the fix is at that
call (``device=`` passed, a diff), never a device hard-coded into the factory. Proven by a re-run where the factory
calls of that function, called from that line, make their tensors on the device (``recalled``)."""

from __future__ import annotations

import ast
import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Recall", "caller_fix", "recalled"]

_FACTORIES = frozenset({"randn", "rand", "randint", "zeros", "ones", "empty", "full", "arange", "linspace", "eye",
                        "tensor", "as_tensor", "randperm", "logspace", "normal"})


@dataclass
class Recall:
    """The call at ``file:line`` fixed: the factories of ``function`` (called from there) make on ``device``."""

    note: str
    diff: str
    file: str
    line: int
    function: str
    device: Any
    keys: tuple[str, ...]  # the maker label of every factory in the function that reads the parameter


@functools.lru_cache(maxsize=64)
def _tree(file: str) -> tuple[ast.Module, tuple[str, ...]] | None:
    try:
        with open(file, encoding="utf-8") as fh:
            text = fh.read()
        return ast.parse(text), tuple(text.split("\n"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def caller_fix(key: str, file: str, line: int, at: str, target: Any) -> Recall | None:
    """``key`` (``factory torch.randn ... at app.py:10``): the call of its function that leaves out the device
    parameter the factory passes, fixed there; None unless there is exactly one such call in the file."""
    from torchdoctor._guard.maps import value_code
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch

    from torchdoctor._virtual.loaded import loader_fix  # torch.load / a library loader at the program's line

    if (loaded := loader_fix(key, at, target)) is not None:  # its device parameter, map_location= / device=
        return Recall(loaded[0], loaded[1], file, line, "", target, (key,))
    parsed = _tree(file) if file and isinstance(target, torch.device) and own_file(file) else None
    if parsed is None:
        return None
    tree, lines = parsed
    fn = min((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and
              n.lineno <= line <= (n.end_lineno or 0)), key=lambda n: (n.end_lineno or 0) - n.lineno, default=None)
    if fn is None:
        return None
    param = _device_param(fn, line)
    if param is None:
        return None
    name, index = param
    missing = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and _calls(c, fn.name) and
               not any(k.arg in (name, None) for k in c.keywords) and
               len(c.args) <= index - (1 if isinstance(c.func, ast.Attribute) and fn.args.args and
                                       fn.args.args[0].arg == "self" else 0) and
               not any(isinstance(a, ast.Starred) for a in c.args)]
    if len(missing) != 1 or missing[0].lineno != missing[0].end_lineno:
        return None
    call = missing[0]
    raw = lines[call.lineno - 1]
    if not raw.isascii() or call.end_col_offset is None:
        return None
    outer = min((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and
                 n.lineno <= call.lineno <= (n.end_lineno or 0)), key=lambda n: (n.end_lineno or 0) - n.lineno,
                default=None)
    known = outer is not None and name in {a.arg for a in (*outer.args.args, *outer.args.kwonlyargs)}
    expr = name if known else value_code(target)
    end = call.end_col_offset - 1
    sep = "" if raw[call.col_offset:end].rstrip().endswith("(") else ", "
    fixed = raw[:end] + f"{sep}{name}={expr}" + raw[end:]
    diff = line_patch(file, call.lineno, fixed.strip())
    if diff is None:
        return None
    short = at.rsplit(":", 1)[0]
    shown = fixed[call.col_offset:end + len(sep) + len(name) + len(expr) + 2]
    maker = key[8:].split(" ", 1)[0]
    note = (f"# {fn.name}(...) at {short}:{call.lineno} is called without {name}= ({name} defaults to None, so "
            f"{maker} at {at} and the factories beside it make their tensors on the cpu): pass it ({shown})")
    ctx = _context(key)
    keys = tuple(f"factory torch.{f}{' ' + ctx if ctx else ''} at {short}:{ln}" for f, ln in _factories(fn, name))
    return Recall(note, diff, file, call.lineno, fn.name, target, keys)


def _context(key: str) -> str:
    """``in code outside the model`` of ``factory torch.randn in code outside the model at app.py:10``."""
    said = key[8:].rsplit(" at ", 1)[0]
    return said.split(" ", 1)[1] if " " in said else ""


def _device_param(fn: Any, line: int) -> tuple[str, int] | None:
    """(the parameter's name, its position) when a factory call at ``line`` passes ``device=<a parameter of fn>``
    that defaults to None."""
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(args.defaults):], args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Call) and node.lineno == line and _factory(node)):
            continue
        for k in node.keywords:
            if k.arg == "device" and isinstance(k.value, ast.Name):
                d = defaults.get(k.value.id)
                if isinstance(d, ast.Constant) and d.value is None:
                    names = [a.arg for a in positional]
                    return k.value.id, names.index(k.value.id) if k.value.id in names else 10 ** 6
    return None


def _factories(fn: Any, name: str) -> list[tuple[str, int]]:
    return sorted({(str(_factory(n)), n.lineno) for n in ast.walk(fn) if isinstance(n, ast.Call) and _factory(n) and
                   any(k.arg == "device" and isinstance(k.value, ast.Name) and k.value.id == name
                       for k in n.keywords)}, key=lambda x: x[1])


def _factory(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr in _FACTORIES and isinstance(f.value, ast.Name) and \
            f.value.id == "torch":
        return f.attr
    return None


def _calls(call: ast.Call, name: str) -> bool:
    f = call.func
    return (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name)


class _Recalled(torch.overrides.TorchFunctionMode):
    def __init__(self, sites: dict[tuple[str, int, str], Any]) -> None:
        super().__init__()
        self.sites = sites

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if getattr(func, "__name__", None) in _FACTORIES and kwargs.get("device") is None:
            from torchdoctor._virtual.origin import user_frame

            f = user_frame(2)
            back = f.f_back if f is not None else None
            want = self.sites.get((back.f_code.co_filename, back.f_lineno, f.f_code.co_name)) \
                if back is not None else None
            if want is not None:
                kwargs["device"] = want
        return func(*args, **kwargs)


@contextlib.contextmanager
def recalled(fixes: Sequence[Any]) -> Iterator[None]:
    """While a re-run runs: the factories of each fixed call's function, called from that line, make their tensors
    on the device the fix passes."""
    sites = {(r.file, r.line, r.function): r.device for f in fixes if (r := getattr(f, "recall", None)) is not None}
    if not sites:
        yield
        return
    from torchdoctor._virtual.loaded import remapped  # a load's map_location= fix (function ""): at that load

    with remapped({(file, line): dev for (file, line, fn), dev in sites.items() if not fn}), _Recalled(sites):
        yield

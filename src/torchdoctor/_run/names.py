"""A virtual run's fix written with the names the program itself holds.

A fix of a virtual run reads ``model.<path>`` -- ``model`` standing for the model the run found. A program run by
``torchdoctor run`` has its own names: its network may be ``net`` (and ``model`` another object, or nothing), and a
problem's path may already be one of its names (``gen.mean``, not a path inside ``model``). Each ``model.<path>`` of a
fix is resolved against the program's module globals, from the tables of the objects (a Module's parameters, buffers,
submodules, an object's ``__dict__``, a list or dict's items) -- never ``eval``, never a property of the program's own:
kept when ``model`` holds it, else written as the program's own name that does (``gen.mean``, ``net.pos_embed``).
A path no name of the program resolves is left as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# a part followed by "(" is a method called on the path (``model.out.to(torch.bfloat16)``), not a part of it
_EXPR = re.compile(r"\bmodel((?:\.[A-Za-z_]\w*(?![\w(])|\[\d+\]|\['[^'\]]*'\])+)")
_PART = re.compile(r"\.([A-Za-z_]\w*)|\[(\d+)\]|\['([^'\]]*)'\]")
_MISSING = object()


def _member(obj: Any, part: str | int) -> Any:
    """``obj.part`` / ``obj[part]`` read from tables only; ``_MISSING`` when it is not there."""
    import torch

    if isinstance(part, int):
        if isinstance(obj, (list, tuple, torch.nn.ModuleList, torch.nn.Sequential)) and -len(obj) <= part < len(obj):
            return obj[part]
        return _MISSING
    if isinstance(obj, Mapping):
        return obj.get(part, _MISSING)
    if isinstance(obj, torch.nn.Module):
        for table in ("_parameters", "_buffers", "_modules"):
            got = vars(obj).get(table, {})
            if part in got:
                return got[part]
    try:
        return vars(obj).get(part, _MISSING)
    except TypeError:  # no __dict__
        return _MISSING


def _resolve(root: Any, parts: Sequence[str | int]) -> Any:
    """What ``parts`` reach from ``root``; a tensor reached early ends it (``.data`` is the tensor's own)."""
    import torch

    for part in parts:
        if isinstance(root, torch.Tensor):
            return root
        root = _member(root, part)
        if root is _MISSING:
            return _MISSING
    return root


def _parts(text: str) -> list[str | int]:
    return [m.group(1) if m.group(1) else int(m.group(2)) if m.group(2) else m.group(3) for m in _PART.finditer(text)]


def _spelled(parts: Sequence[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" if p.isidentifier() else f"[{p!r}]" for p in parts)


def held_name(expr: str, names: Mapping[str, Any]) -> str | None:
    """``expr`` (``.gen.mean`` after ``model``) as the program holds it, or None when ``model`` holds it or nothing
    of the program does."""
    import torch

    parts = _parts(expr)
    if not parts or parts[-1] in ("device", "dtype"):  # ``model.device``: what the program's `model` says it is on
        return None
    model = names.get("model", _MISSING)
    if model is not _MISSING and _resolve(model, parts) is not _MISSING:
        return None  # the program's own `model` holds it: the fix reads as printed
    first = parts[0]
    if isinstance(first, str) and first in names and _resolve(names[first], parts[1:]) is not _MISSING:
        return first + _spelled(parts[1:])  # the path starts with the program's own name
    found: tuple[str, Any] | None = None
    for name, value in names.items():  # the module the program holds that has the path
        if isinstance(value, torch.nn.Module) and not name.startswith("_") and \
                (value is found[1] if found else isinstance(_resolve(value, parts), (torch.Tensor, torch.nn.Module))):
            # the first module that has it; of the names bound to that one object, the last bound: the program's
            # current name for it (``merged = pm.merge_and_unload()`` is ``base`` itself)
            found = (name, value)
    return found[0] + _spelled(parts) if found else None


def held_code(code: str, names: Mapping[str, Any] | None, spell: bool = True) -> str:
    """``code`` with each ``model.<path>`` the program holds under another name written with that name, and a module
    named by a method's locals when it started (``s.text_encoder``, ``s`` the pipeline's ``self``) by the program's
    own global name for it (``pipe.text_encoder``); ``spell``: a device or dtype written out too, by the program's
    name for it (``_run.spelled``)."""
    if not names:
        return code
    from torchdoctor._run.spelled import spelled

    code = _global_named(code, names)
    code = spelled(code, names) if spell else code
    if "model" not in code:
        return code
    try:
        return _EXPR.sub(lambda m: held_name(m.group(1), names) or m.group(0), code)
    except Exception:  # a name is an extra: the fix stands as printed
        return code


def _global_named(code: str, names: Mapping[str, Any]) -> str:
    """``code`` with each module name a frame's locals gave (``apart.NAMES``) whose first part is no global of the
    program written as a global holds that module: bound to a name, or one attribute of an object bound to one."""
    try:
        from torchdoctor._virtual.apart import NAMES

        for ref, name in list(NAMES.values()):
            mod = ref()
            if mod is None or "." not in name or name.split(".", 1)[0] in names or name not in code:
                continue
            better = next((n for n, v in names.items() if v is mod and not n.startswith("_")), None) or next(
                (f"{n}.{k}" for n, v in names.items() if not n.startswith("_") and not isinstance(v, type)
                 for k, w in list(_table(v).items()) if w is mod), None)
            if better is not None:
                code = re.sub(rf"(?<![\w.]){re.escape(name)}\b", better, code)
    except Exception:  # a name is an extra: the fix stands as printed
        return code
    return code


def _table(obj: Any) -> dict[str, Any]:
    """An object's attributes, or a module's submodules, read from their tables."""
    import torch

    if isinstance(obj, torch.nn.Module):
        return dict(vars(obj).get("_modules", {}))
    got = getattr(obj, "__dict__", None)
    return got if isinstance(got, dict) and not isinstance(obj, type(re)) else {}


def as_held(fixes: Sequence[Any], names: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """The fixes with each ``model.<path>`` the program holds under another name written with that name."""
    from torchdoctor._run.spelled import spelled_fix

    for f in fixes:
        if getattr(f, "kind", None) in ("path", "note", "apart") and f.code:
            f.code = held_code(f.code, names, spell=False)
    kept = tuple(f for f in fixes if not (names and _no_op(getattr(f, "code", "") or "", names)))
    for f in kept:
        spelled_fix(f, names)  # the program's names for its device and dtype, in the code and its patch alike
    return kept


# a whole module cast, as a fix writes it: ``torchdoctor.move(unet, torch.bfloat16)``, ``vae.to(torch.float16)``
_CAST = re.compile(r"(?:torchdoctor\.move\(([A-Za-z_][\w.]*), torch\.(\w+)\)|([A-Za-z_][\w.]*)\.to\(torch\.(\w+)\))\s*(?:#|$)")


def _no_op(code: str, names: Mapping[str, Any]) -> bool:
    """Is ``code`` one cast of a module the program holds whose every floating tensor already has that dtype (the
    fix would change nothing: never printed)?"""
    import torch

    m = _CAST.match(code.split("\n", 1)[0].strip())
    if m is None:
        return False
    name, dtype = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    parts = name.split(".")
    mod = _resolve(names.get(parts[0], _MISSING), _parts("." + ".".join(parts[1:]))) if parts[0] in names \
        else _MISSING
    want = getattr(torch, dtype, None)
    if not isinstance(mod, torch.nn.Module) or not isinstance(want, torch.dtype):
        return False
    floats = [t.dtype for t in (*mod.parameters(), *mod.buffers()) if t.is_floating_point()]
    return bool(floats) and all(d == want for d in floats)


def program_names(exc: BaseException | None, result: Any = None) -> dict[str, Any]:
    """The program's module globals: what ``runpy`` returned, else those of its ``__main__`` frame in the traceback of
    the exception that ended it."""
    if isinstance(result, dict):
        return result
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        g = tb.tb_frame.f_globals
        if g.get("__name__") == "__main__":
            return dict(g)
        tb = tb.tb_next
    return {}

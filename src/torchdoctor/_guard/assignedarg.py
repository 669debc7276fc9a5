"""A caller's argument made inside a library callable the program called (a feature extractor, a processor, a
tokenizer: ``input_features = fe(audio, return_tensors="pt").input_features``): its maker is the program's line
that assigned it, not the ``torch.from_numpy`` deep in the library. Read from the caller's frames and their source,
never run; the fix casts that line's value (``.to(torch.float16)``), which ``remedy`` writes as a diff."""

from __future__ import annotations

import ast
from typing import Any

import torch

from torchdoctor._guard.maker import Maker

__all__ = ["LIBCALL", "assigned_maker"]

LIBCALL = "(...)"  # a Maker's op ends so: the program's call of a callable whose result holds the tensor
_CASTS = frozenset(("float", "half", "bfloat16", "double", "to", "type"))


def assigned_maker(frames: Any, t: torch.Tensor) -> Maker | None:
    """The program's assignment of ``t`` to a local (innermost frame first) from a call's result, as a ``Maker``
    whose span is the assigned value (one line); None when no frame names it so."""
    from torchdoctor._guard.maker import _parsed
    from torchdoctor._guard.ownfile import own_file

    stack = list(frames)
    up = stack[0].f_back if stack else None
    while up is not None:  # the callers of the outermost frame a traceback shows: the program's own lines
        stack.insert(0, up)
        up = up.f_back
    for f in reversed(stack):
        names = [n for n, v in f.f_locals.items() if v is t]
        got = _parsed(f.f_code) if names and own_file(f.f_code.co_filename) else None
        if got is None:
            continue
        tree, off, file, lines = got
        best = None
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and node.targets[0].id in names and node.lineno + off <= f.f_lineno \
                    and (best is None or node.lineno > best.lineno):
                best = node
        if best is None or (best.value.end_lineno or 0) != best.lineno or best.value.end_col_offset is None:
            continue
        call = next((c for c in ast.walk(best.value) if isinstance(c, ast.Call)), None)
        if call is None:
            continue
        callee = ast.unparse(call.func)
        if callee.startswith("torch."):  # a torch factory: the maker's own finder names it
            continue
        if isinstance(call.func, ast.Attribute) and call.func.attr in _CASTS:  # ``...(ids).float()``: a cast the
            continue  # program wrote is its own choice, no library call's result to cast after
        raw = lines[best.lineno - 1].rstrip("\r\n")
        shift = len(raw) - len(raw.lstrip(" \t")) - best.col_offset  # the parse was dedented
        return Maker(f"{callee}{LIBCALL}", file, best.lineno + off, raw.strip(), factory=True,
                     span=(best.value.col_offset + shift, best.value.end_col_offset + shift),
                     component=_component(call.func, f))
    return None


def _component(func: ast.expr, frame: Any) -> tuple[str, Any] | None:
    """(the program's name for it, the module) when the call's callee is a module held by a chain of names
    (``self.text_encoder``, ``pipe.vae``), ``self`` written as the global the program holds the object by; else
    None. Nothing is called: attributes are read as they are."""
    chain: list[str] = []
    node: Any = func
    while isinstance(node, ast.Attribute):
        chain.insert(0, node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or not chain:
        return None
    loc, glob = frame.f_locals, frame.f_globals
    head = loc[node.id] if node.id in loc else glob.get(node.id)
    obj = head
    for name in chain:
        obj = vars(obj).get(name) if hasattr(obj, "__dict__") else None
        if isinstance(obj, torch.nn.Module) or obj is None:
            obj = obj if obj is not None else getattr(head, "_modules", {}).get(name)
    if not isinstance(obj, torch.nn.Module):
        return None
    first = node.id
    if node.id in loc and loc is not glob:  # a local (``self``): the program's global for the same object
        first = next((n for n, v in glob.items() if v is head and not n.startswith("_")), node.id)
    return ".".join([first, *chain]), obj


def component_fix(makers: Any, target: Any) -> str | None:
    """A caller's argument in the other half dtype (float16 / bfloat16) made by a component held whole in it (a
    pipeline's float16 text encoder feeding its bfloat16 transformer): the component is the odd one out among its
    neighbours, so the fix loads or casts it, not the data it hands on. A float32 component stays (kept so on
    purpose, as a VAE is): its output is cast where it is handed over. None when no maker is such a call."""
    from torchdoctor._guard.maps import value_code

    half = (torch.float16, torch.bfloat16)
    for label, m in makers:
        if m.component is None or target not in half:
            continue
        name, mod = m.component
        kinds = {p.dtype for p in mod.parameters() if p.is_floating_point()}
        if len(kinds) != 1 or (odd := next(iter(kinds))) == target or odd not in half:
            continue
        want = value_code(target)
        return (f"{name}.to({want})  # {name} computes in {str(odd)[6:]}, the rest of the pipeline in "
                f"{str(target)[6:]}: load or cast it in {str(target)[6:]} (it made {label})")
    return None


def root_named(fix: str, root: Any, tb: Any) -> str:
    """``fix`` (``model.to(torch.float16)``, the guarded module as ``model``) written with the program's own
    expression for that module at the line that called it (``self.image_proj.to(...)`` in a plugin's node, with
    that line), when the program holds it by no global name; else as it was."""
    import linecache

    from torchdoctor._guard.frames import lineno, user_frames
    from torchdoctor._guard.ownfile import own_file

    if not fix.startswith("model.") or not isinstance(root, torch.nn.Module):
        return fix
    try:
        frames = user_frames(tb)
    except Exception:  # a name is an extra: the fix stands as printed
        return fix
    for f in reversed(frames):
        if f.f_locals.get("self") is root or not own_file(f.f_code.co_filename):
            continue
        if any(v is root for v in f.f_globals.values()):
            return fix  # a global holds it: run writes the fix with that name
        line = linecache.getline(f.f_code.co_filename, lineno(f)).strip()
        try:
            calls = [c for c in ast.walk(ast.parse(line.rstrip(":") if line.endswith(":") else line))
                     if isinstance(c, ast.Call)]
        except SyntaxError:
            continue
        for c in calls:
            got = _component(c.func, f)
            if got is not None and got[1] is root:
                where = f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{lineno(f)}"
                first, _, rest = fix.partition("\n")
                code, _, note = first.partition("  # ")
                return f"{got[0]}{code[len('model'):]}  # at {where}" + (f"; {note}" if note else "") + (
                    "\n" + rest if rest else "")
        return fix
    return fix


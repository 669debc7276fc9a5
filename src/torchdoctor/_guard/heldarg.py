"""An operand the failing forward got from an object the program holds, not from the model: a KV cache handed in as
an argument (``k, v = cache.insert(...)``: a view of ``cache.k``), transformers' ``DynamicCache`` (the layer's
``keys`` the forward's ``cache.update`` returned), an object kept on the module (``self.cache``). The forward made
none of it, so no maker line of its own exists: the operand is named by where it is held (``cache.k``,
``cache.layers[0].keys``), the object by the program's own name for it (``cache`` of the function that made it, or
``prompt_cache`` whose copy the program's call handed in), and what gave it its dtype: the program class's line that
allocates the attribute and the program's line that chose the dtype it was handed (the fix: that choice written as
the dtype the program cast its model with), or the program's fill of a library cache before the model's cast (the
fix: the cache's tensors cast once after that cast). The fix is proven at the failing call on copies of its operands
with the held ones cast, or by the failing module re-run on a copy (``_guard/heldproof.py``), else said unproven."""

from __future__ import annotations

import ast
import linecache
import logging
import os
import types
from typing import Any

import torch
from torch import nn

from torchdoctor._guard.frames import same
from torchdoctor._guard.heldproof import odd_paths as _odd_paths, plain, prove_call, prove_module
from torchdoctor._guard.heldproof import statement as _statement, value_at as _value
from torchdoctor._guard.maps import value_code
from torchdoctor._guard.ownfile import own_file
from torchdoctor._guard.remedy import Aim, aimed
from torchdoctor._guard.wrapfix import locals_made  # noqa: F401  (diagnose reads both from here)
from torchdoctor._placement import dtype_str

__all__ = ["aim_made", "held_aim"]

log = logging.getLogger("torchdoctor.guard")
_MAX = 256  # a list, dict or object bigger than this is not searched (the answer is a courtesy, never a cost)
_CASTS = {"half": torch.float16, "bfloat16": torch.bfloat16, "float": torch.float32, "double": torch.float64}


def aim_made(made: list[tuple[str, torch.Tensor]], kind: str, ref: Any, maps: Any, frames: Any, frame: Any, tb: Any,
             root: Any) -> tuple[Aim | None, list[tuple[str, torch.Tensor]]]:
    """The failing forward's locals in the odd dtype: their maker in a running forward (``remedy.aimed``), else the
    object the program holds them in (``held_aim``); (aim or None, the locals labelled as reported)."""
    aim = aimed(made, kind, ref, maps.modules, maps.dicts, frames, tb)
    if aim is not None or not made or not isinstance(ref, torch.dtype):
        return aim, made
    try:
        got = held_aim(made, frame, ref, tb, root)
    except Exception:  # naming the holder is extra: the failure is reported without it
        log.debug("held_aim failed", exc_info=True)
        got = None
    return got if got is not None else (None, made)


def held_aim(made: list[tuple[str, torch.Tensor]], frame: Any, ref: torch.dtype, tb: Any, root: Any
             ) -> tuple[Aim, list[tuple[str, torch.Tensor]]] | None:
    """(the aim, the locals relabelled with where they are held) when an object among ``frame``'s arguments (or its
    module's plain attributes) holds one of ``made``; None otherwise."""
    holders = _holders(frame)
    hits: list[tuple[str, torch.Tensor, str, Any, str]] = []  # (label, tensor, holder name, holder, path in it)
    for label, t in made:
        for name, obj in holders:
            path = _path(obj, t, 3)
            if path is not None:
                hits.append((label, t, name, obj, path))
                break
    if not hits:
        return None
    _, t0, name, holder, path0 = hits[0]
    odd = t0.dtype
    relabelled = [(f"{label[:-1]}, {'a view of ' if not _is(holder, path, t) else ''}`{n}{path}`)"
                  if label.endswith(")") else label, t) for label, t, n, _, path in hits]
    relabelled += [(label, t) for label, t in made if not any(t is h[1] for h in hits)]
    chain = _tb_frames(tb)
    cls = type(holder).__name__
    where = f"an argument of {frame.f_code.co_name}" if name in frame.f_locals else \
        f"a global {frame.f_code.co_name} reads"
    held = ", ".join(f"`{name}{p}`" for p in _odd_paths(holder, odd)[:4])
    lines = [f"`{name}` (a {cls}, {where}) holds {held or 'tensors'} in {dtype_str(odd)} while the model computes in "
             f"{dtype_str(ref)}"]
    prog = _program(chain, frame, holder)
    told = None
    if prog is not None:
        pf, pname, pline, via = prog
        short = f"{os.path.basename(pf.f_code.co_filename)}:{pline}"
        made_at = _assigned_at(pf, pname, pline)
        lines.append(f"the program holds it as `{pname}` of {_func(pf)}, made at {made_at or short}" if via is None else
                     f"the program hands it in as `{via}` at {short}")
    said = _allocated(holder, path0, prog[1] if prog is not None else name, chain, root, ref)
    if prog is not None and (said is None or said[1] is None):
        told = _filled(prog[0], prog[1], prog[2], holder, odd, ref, root)
    lines += (said[0] if said is not None else []) + (told[0] if told is not None and said is None else [])
    code, patch = said[1:] if said is not None and said[1] is not None else told[1:] if told else (None, None)
    proof = prove_call(chain, odd, ref, [n + p for _, _, n, _, p in hits])
    if not proof.startswith("fix proven"):  # the call reads what the interpreter does not run (`self.q(x)`)
        proof = prove_module(chain, frame, holder, name, odd, ref) or proof
    return Aim(lines, code, patch, proof, []), relabelled


def _is(holder: Any, path: str, t: torch.Tensor) -> bool:
    return _value(holder, path) is t


def _holders(frame: Any) -> list[tuple[str, Any]]:
    """The forward's arguments that are plain objects (positional, keyword, ``**kwargs``), then the module-level
    objects its code reads by name, by the names the forward reads them with (a module's own plain attributes are
    the walk's: named as the model's tensors already)."""
    code, loc = frame.f_code, frame.f_locals
    n = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[:n])
    out: list[tuple[str, Any]] = []
    for name in names:
        if plain(v := loc.get(name)):
            out.append((name, v))
    if code.co_flags & 0x08:  # CO_VARKEYWORDS
        extra = loc.get(code.co_varnames[n + bool(code.co_flags & 0x04)])
        out += [(k, v) for k, v in list((extra or {}).items())[:_MAX] if isinstance(k, str) and plain(v)]
    glob = [(n, frame.f_globals[n]) for n in code.co_names[:_MAX] if n in frame.f_globals and n not in loc
            and plain(frame.f_globals[n])]  # an object of the module the forward reads by name (``CACHE.k``)
    return out + glob


def _path(obj: Any, t: torch.Tensor, depth: int) -> str | None:
    """``.k``, ``.layers[0].keys``: where ``obj`` holds ``t`` (or the tensor ``t`` is a view of), ``depth`` objects
    deep through attributes, lists, tuples and dicts."""
    attrs = getattr(obj, "__dict__", None)
    if depth <= 0 or not isinstance(attrs, dict):
        return None
    for name, v in list(attrs.items())[:_MAX]:
        got = _inside(v, t, depth)
        if got is not None:
            return f".{name}{got}"
    return None


def _inside(v: Any, t: torch.Tensor, depth: int) -> str | None:
    if isinstance(v, torch.Tensor):
        return "" if same(v, t) else None
    items = enumerate(v) if type(v) in (list, tuple) else v.items() if type(v) is dict else None
    if items is not None and len(v) <= _MAX:
        for k, x in items:
            got = "" if isinstance(x, torch.Tensor) and same(x, t) else _path(x, t, depth - 1) if plain(x) else None
            if got is not None:
                return f"[{k!r}]{got}" if type(v) is dict else f"[{k}]{got}"
        return None
    return _path(v, t, depth - 1) if plain(v) else None


def _tb_frames(tb: Any) -> list[tuple[Any, int]]:
    out = []
    while tb is not None:
        out.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return out


def _func(frame: Any) -> str:
    me = frame.f_locals.get("self")
    name = frame.f_code.co_name
    return "the program's top level" if name == "<module>" else f"{type(me).__name__}.{name}" if me is not None \
        and not isinstance(me, type) else name


def _program(chain: list[tuple[Any, int]], failing: Any, holder: Any) -> tuple[Any, str, int, str | None] | None:
    """(frame, name, line, the expression it was handed in as): the outermost frame of the program's own code that
    holds ``holder`` as a local; else the program's call that handed in a copy or a temporary (``copy.deepcopy(
    prompt_cache)``), with the name of the program's object of that class it names."""
    own = [(f, ln) for f, ln in chain if own_file(f.f_code.co_filename)]
    for f, ln in own:
        if f is failing:
            break
        for n, v in list(f.f_locals.items()):
            if v is holder and n != "self" and not n.startswith("__"):
                return f, n, ln, None
    outside = [(f, ln) for f, ln in own if not isinstance(f.f_locals.get("self"), nn.Module)]
    if not outside:
        return None
    f, ln = outside[-1]
    stmt = _statement(f, ln)
    if stmt is None:
        return None
    for call in (c for c in ast.walk(stmt[0]) if isinstance(c, ast.Call)):
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            for n in (x for x in ast.walk(arg) if isinstance(x, ast.Name)):
                v = f.f_locals.get(n.id, f.f_globals.get(n.id))
                if v is not holder and type(v) is type(holder):
                    kw = next((k.arg for k in call.keywords if k.value is arg and k.arg), None)
                    return f, n.id, ln, (f"{kw}=" if kw else "") + ast.unparse(arg)
    return None


def _assigned_at(frame: Any, name: str, line: int) -> str | None:
    """``file:line (`source`)`` of the newest statement before ``line`` of the frame's code that binds ``name``."""
    got = _statement(frame, line)
    from torchdoctor._guard.maker import _parsed as parsed_code

    parsed = parsed_code(frame.f_code)
    if got is None or parsed is None:
        return None
    tree, off, file, src = parsed
    best = max((n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.lineno + off <= line and any(
        isinstance(x, ast.Name) and x.id == name for t in n.targets for x in ast.walk(t))), default=None)
    return f"{os.path.basename(file)}:{best + off} (`{src[best - 1].strip()}`)" if best is not None else None


def _allocated(holder: Any, path: str, pname: str, chain: list[tuple[Any, int]], root: Any,
               ref: torch.dtype) -> tuple[list[str], str | None, str | None] | None:
    """A holder of the program's own class: the line of its class that allocates the attribute (``self.k =
    torch.zeros(..., dtype=dtype)``) and, where the dtype it was handed is a name, the program's line that chose it
    (``dtype = torch.bfloat16 if device.type == "cuda" else torch.float32``): the fix writes there the dtype the
    program cast its model with. None for a library's class."""
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.f8dtype import chosen, function_at

    # the class's file from its methods' code (a script run by runpy is no longer ``sys.modules["__main__"]``)
    fcode = next((f.__code__ for f in vars(type(holder)).values() if isinstance(f, types.FunctionType)), None)
    file = fcode.co_filename if fcode is not None else ""
    if not file or not own_file(file):
        return None
    text = "".join(linecache.getlines(file))
    tree = ast.parse(text)
    klass = next((c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == type(holder).__name__
                  and c.lineno <= fcode.co_firstlineno <= int(c.end_lineno or 0)), None) if fcode is not None else None
    attr = path.split(".")[1].split("[")[0]
    site = next((a for a in ast.walk(klass) if isinstance(a, ast.Assign) and any(
        isinstance(x, ast.Attribute) and x.attr == attr and isinstance(x.value, ast.Name) and x.value.id == "self"
        for x in a.targets) and isinstance(a.value, ast.Call)), None) if klass is not None else None
    if site is None:
        return None
    lines = text.split("\n")
    call: Any = site.value
    said = f"`{pname}.{attr}` made by `{ast.unparse(call.func)}` at {file}:{site.lineno} " \
           f"(`{lines[site.lineno - 1].strip()}`)"
    arg = next((k.value for k in call.keywords if k.arg == "dtype"), None)
    literal = arg is not None and not isinstance(arg, ast.Name) and arg.lineno == arg.end_lineno  # dtype=torch.half
    hit = chosen(tree, lines, function_at(tree, site.lineno), arg.id, site.lineno, file) \
        if isinstance(arg, ast.Name) else ("dtype", arg.lineno, arg, "writes") if literal and arg is not None else None
    if hit is None or hit[1] == site.lineno and not literal or arg is None:
        return [said + (", with no dtype= (the default dtype)" if arg is None else "")], None, None
    _, at, expr, how = hit
    raw = lines[at - 1]
    seg = raw[expr.col_offset:int(expr.end_col_offset or 0)]
    how = "assigned" if how == "assigns" else f"given by the call {how.split()[-1].replace('()', '(...)')}"
    said += f", the dtype written there" if literal else f", the dtype `{ast.unparse(arg)}` {how} at {file}:{at} " \
                                                         f"(`{raw.strip()}`)"
    model = _model_dtype(file, root, ref, [f for f, _ in chain])
    if model is None or model[0] == seg:
        return [said], None, None
    value, cast_at = model
    rest = raw[int(expr.end_col_offset or 0):]
    new = raw[:expr.col_offset] + value + rest
    note = f"  # {os.path.basename(file)}:{at}: the dtype the model was cast with at {cast_at}, not `{seg}`"
    code = _uncommented(new)  # (its comment stays in the diff)
    return [said + f"; the model was cast with `{value}` at {cast_at}"], code.strip() + note, \
        line_patch(file, at, new.strip())


def _uncommented(line: str) -> str:
    """``line`` without its trailing comment (read by the tokenizer: a ``#`` inside a string is no comment)."""
    import io
    import tokenize

    try:
        for tok in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if tok.type == tokenize.COMMENT:
                return line.strip()[:tok.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return line.strip()


def _model_dtype(file: str, root: Any, ref: torch.dtype, frames: list[Any]) -> tuple[str, str] | None:
    """(the name, ``file:line``) of a module-level dtype of ``file`` that a ``.to(...)`` of that file casts with and
    that holds ``ref`` (``COMPUTE_DTYPE``); None when the model's cast there names none."""
    glob = next((f.f_globals for f in frames if f.f_code.co_filename == file), None)
    if glob is None or not isinstance(root, nn.Module):
        return None
    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except SyntaxError:
        return None
    found = []  # (a literal after a name, then the first line), a name of the module that holds ``ref`` first
    for c in ast.walk(tree):
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "to":
            for a in [*(k.value for k in c.keywords if k.arg == "dtype"), *c.args]:
                if isinstance(a, ast.Name) and glob.get(a.id) is ref or ast.unparse(a) == value_code(ref):
                    found.append((not isinstance(a, ast.Name), c.lineno, ast.unparse(a)))
    best = min(found, default=None)
    return (best[2], f"{os.path.basename(file)}:{best[1]}") if best is not None else None


def _filled(pf: Any, pname: str, pline: int, holder: Any, odd: torch.dtype, ref: torch.dtype, root: Any
            ) -> tuple[list[str], str | None, str | None]:
    """A library's holder (a ``DynamicCache``): the program's line that filled ``pname`` before the line that cast
    the model, and the fix: its tensors of the odd dtype cast once, right after that cast (else before the use)."""
    from torchdoctor._report.diff import line_patch

    got = _statement(pf, pline)
    parsed = None
    from torchdoctor._guard.maker import _parsed as parsed_code

    parsed = parsed_code(pf.f_code)
    if got is None or parsed is None:
        return [], None, None
    tree, off, file, src = parsed
    fill = cast = None
    later: list[tuple[ast.stmt, int, str]] = []  # what the program did with it after the fill (a writeback)
    for n in sorted((n for n in ast.walk(tree) if isinstance(n, ast.stmt) and n.lineno + off < pline and
                     not isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.With, ast.For, ast.If))),
                    key=lambda n: n.lineno):
        calls = [c for c in ast.walk(n) if isinstance(c, ast.Call)]
        if fill is None and any(isinstance(x, ast.Name) and x.id == pname for c in calls
                                for a in [*c.args, *(k.value for k in c.keywords)] for x in ast.walk(a)):
            fill = n
        elif fill is not None and cast is None and any(_casts_model(c, pf, root) for c in calls):
            cast = n
        elif fill is not None:
            later.append((n, n.lineno + off, src[n.lineno - 1].strip()))
    lines: list[str] = []
    want = value_code(ref)
    from torchdoctor._guard.rewritten import writeback

    back = writeback(pf, later, pname, dtype_str(odd)) if fill is not None and cast is None else None
    if fill is not None and back is not None:  # the dtype came from that writeback, not from the fill
        lines.append(f"`{pname}` was filled at {file}:{fill.lineno + off} (`{src[fill.lineno - 1].strip()}`)")
        lines.append(back)
    elif fill is not None:
        at = f"{file}:{fill.lineno + off} (`{src[fill.lineno - 1].strip()}`)"
        lines.append(f"`{pname}` was filled at {at}" + (
            f" before the model's cast at {os.path.basename(file)}:{cast.lineno + off} "
            f"(`{src[cast.lineno - 1].strip()}`): its tensors kept {dtype_str(odd)}" if cast is not None else
            f", in {dtype_str(odd)}"))
        if cast is not None:
            want = _cast_arg(cast) or want
    loop = _cast_code(pname, _odd_paths(holder, odd), want)
    if loop is None:
        return lines, None, None
    made = max((n.end_lineno or n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.lineno + off <
                pline and any(isinstance(x, ast.Name) and x.id == pname for t in n.targets for x in ast.walk(t))),
               default=None) if fill is None else None
    after = (cast.end_lineno or cast.lineno) if cast is not None else made
    anchor = after + off if after is not None else got[0].lineno + off
    body = linecache.getline(file, anchor).strip()
    new = f"{body}\n{loop}" if after is not None else f"{loop}\n{body}"  # (line_patch indents each line alike)
    why = f"  # fill `{pname}` after the model's cast, or cast it once: its {dtype_str(odd)} tensors -> {want}" \
        if cast is not None else f"  # `{pname}` holds {dtype_str(odd)} tensors: cast them once, where it is made"
    return lines, loop + why, line_patch(file, anchor, new) if own_file(file) else None


def _casts_model(call: ast.Call, frame: Any, root: Any) -> bool:
    """``model.to(torch.bfloat16)``, ``model.half()``: a dtype cast of the guarded model (or a module holding it)."""
    f = call.func
    if not isinstance(f, ast.Attribute) or f.attr not in ("to", *_CASTS) or not isinstance(f.value, ast.Name):
        return False
    v = frame.f_locals.get(f.value.id, frame.f_globals.get(f.value.id))
    if not isinstance(v, nn.Module) or not any(m is root for m in v.modules()):
        return False
    return f.attr != "to" or any(k.arg == "dtype" for k in call.keywords) or any(
        "dtype" in ast.unparse(a) or ast.unparse(a).startswith("torch.") for a in call.args)


def _cast_arg(cast: ast.stmt) -> str | None:
    for c in (c for c in ast.walk(cast) if isinstance(c, ast.Call)):
        attr = c.func.attr if isinstance(c.func, ast.Attribute) else None
        if attr is None:
            continue
        if attr in _CASTS:
            return value_code(_CASTS[attr])
        kw = next((k.value for k in c.keywords if k.arg == "dtype"), None)
        arg = kw if kw is not None else next((a for a in c.args if "dtype" in ast.unparse(a) or
                                             ast.unparse(a).startswith("torch.")), None)
        if arg is not None:
            return ast.unparse(arg)
    return None


def _cast_code(name: str, paths: list[str], want: str) -> str | None:
    """One line casting what ``paths`` (``.layers[0].keys``, ...) name: a loop over a list of objects when every
    path is one attribute of an item of the same list, else the attributes one by one."""
    if not paths:
        return None
    lists = {p.split("[", 1)[0] for p in paths}
    attrs = sorted({p.split("]", 1)[1] for p in paths if "]" in p}, key=lambda a: [p.split("]", 1)[-1] for p in paths
                                                                                     ].index(a))
    if len(lists) == 1 and "[" in paths[0] and all(a.count(".") == 1 and "[" not in a for a in attrs):
        each = [f"layer{a}" for a in attrs]
        return f"for layer in {name}{lists.pop()}: " + ", ".join(each) + " = " + ", ".join(
            f"{e}.to({want})" for e in each)
    if len(paths) > 4:
        return None
    each = [f"{name}{p}" for p in paths]
    return ", ".join(each) + " = " + ", ".join(f"{e}.to({want})" for e in each)

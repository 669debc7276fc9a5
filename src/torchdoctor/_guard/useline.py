"""Code outside any module (a loss, an optimizer step) where an op refuses an operand's dtype: the fix is the user's
line that passes that operand, cast there to what the op expects (``lerp_(v_mean.float(), ...)`` into a float32
state), proven by running that line's expression again on copies of what it reads, and offered as a diff.

The re-run is a small interpreter over the line's parsed expression, never ``eval``: names and subscripts of the
frame's values, constants, arithmetic, torch's own functions and tensor methods; every tensor it reads is a copy, so
an in-place method (``lerp_``) changes nothing of the program's. Anything else (a user function, a property) is not
run and the fix is said unproven.
"""

from __future__ import annotations

import ast
import linecache
import operator
import os
import re
import types
from typing import Any

import torch

_METHOD = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat16", torch.float64: "double"}
_GRAD = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\.grad\b(?!\s*\()")
_OPS: dict[type, Any] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                         ast.Div: operator.truediv, ast.MatMult: operator.matmul, ast.Pow: operator.pow}
_COMPARE: dict[type, Any] = {ast.Gt: operator.gt, ast.Lt: operator.lt, ast.GtE: operator.ge, ast.LtE: operator.le,
                             ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Is: operator.is_,
                             ast.IsNot: operator.is_not}


class _NotRun(Exception):
    pass


def cast_text(name: str, target: Any) -> str:
    """``v_mean.float()``, or ``x.to(torch.float8_e4m3fn)`` where no method casts to it."""
    if target in _METHOD:
        return f"{name}.{_METHOD[target]}()"
    from torchdoctor._guard.maps import value_code

    return f"{name}.to({value_code(target)})"


def names_of(frame: Any, tensors: list[torch.Tensor]) -> list[str]:
    """The frame's local names bound to these very tensors (the operands the line passes), or ``p.grad`` where a
    local leaf's gradient is one (an optimizer's loop passes ``p.grad``)."""
    ids = {id(t) for t in tensors}
    out = [n for n, v in frame.f_locals.items() if isinstance(v, torch.Tensor) and id(v) in ids and n != "self"]
    for n, v in frame.f_locals.items():
        if isinstance(v, torch.Tensor) and v.is_leaf and n != "self" and id(v.grad) in ids:
            out.append(f"{n}.grad")
    return out


def grads_in(source: str, frame: Any) -> list[tuple[str, torch.Tensor]]:
    """``p.grad`` as the line reads it, for each local leaf ``p`` whose gradient the line passes."""
    out = []
    for m in _GRAD.finditer(source):
        v = frame.f_locals.get(m.group(1))
        if isinstance(v, torch.Tensor) and v.is_leaf and isinstance(v.grad, torch.Tensor):
            out.append((f"{m.group(1)}.grad", v.grad))
    return list(dict(out).items())


def _operands(tree: ast.AST, names: list[str]) -> list[ast.expr]:
    """The places the line passes one of ``names`` (a name, or ``p.grad``), read (never the receiver of an in-place
    method, nor a name that is only the base of ``p.grad``)."""
    receivers = {id(n.func.value) for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr.endswith("_")}
    spots: list[ast.expr] = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load) and id(n) not in receivers \
                and n.end_col_offset is not None and ast.unparse(n) in names:
            spots.append(n)
    inner = {id(n.value) for n in spots if isinstance(n, ast.Attribute)}
    return [n for n in spots if id(n) not in inner]


def parsed_line(raw: str) -> tuple[ast.Module, int] | None:
    """One source line parsed on its own (a block opener completed with ``pass``) and its indent, the column shift
    back to the file's line; None when it does not parse alone."""
    text = raw.strip()
    try:
        return ast.parse(text + " pass" if text.endswith(":") else text), len(raw) - len(raw.lstrip())
    except SyntaxError:
        return None


def fixed_line(frame: Any, lineno: int, names: list[str], target: Any) -> tuple[str, str, str] | None:
    """(the line with each of ``names`` cast where it is passed, the fixed expression's proof, its file) or None when
    the line passes none of them (a name only written to, or the receiver of an in-place method, is never cast)."""
    path = frame.f_code.co_filename
    raw = linecache.getline(path, lineno).rstrip("\r\n")
    got = parsed_line(raw)
    if got is None:
        return None
    tree, shift = got
    text = raw.strip()
    spots = _operands(tree, names)
    if not spots:
        return None
    new = raw
    for n in sorted(spots, key=lambda n: -n.col_offset):
        end: int = n.end_col_offset  # type: ignore[assignment]
        new = new[:n.col_offset + shift] + cast_text(ast.unparse(n), target) + new[end + shift:]
    stmt = tree.body[0] if tree.body else None
    expr = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return)) else None
    return new, _proof(expr, frame, set(names), target, text), path


def _proof(expr: ast.expr | None, frame: Any, names: set[str], target: Any, text: str) -> str:
    tried = ", ".join(f"{n} -> {cast_text(n, target)}" for n in sorted(names))
    if expr is None:
        return f"fix unproven: not re-run (`{text}` has no expression to re-run)"
    try:
        with torch.no_grad():
            _eval(expr, frame, names, target)
    except _NotRun as why:
        return f"fix unproven: not re-run ({why})"
    except Exception as err:  # the trial's own failure is the answer
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"fix unproven: `{ast.unparse(expr)}` re-run with {tried}: {type(err).__name__}: {first}"[:400]
    return f"fix proven: `{ast.unparse(expr)}` runs again on copies with {tried}"


def _copy(v: Any) -> Any:
    return v.detach().clone() if isinstance(v, torch.Tensor) else v


def _eval(node: ast.expr, frame: Any, names: set[str], target: Any) -> Any:
    ev = lambda n: _eval(n, frame, names, target)  # noqa: E731
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in frame.f_locals:
            v = frame.f_locals[node.id]
        elif node.id in frame.f_globals:
            v = frame.f_globals[node.id]
        else:
            raise _NotRun(f"`{node.id}` is not a value of the frame")
        if isinstance(v, torch.Tensor):
            v = _copy(v)
            return v.to(target) if node.id in names else v
        if v is None or isinstance(v, (int, float, bool, str, dict, list, tuple, types.ModuleType, torch.dtype,
                                       torch.device)):
            return v
        raise _NotRun(f"`{node.id}` is a {type(v).__name__}")
    if isinstance(node, ast.Subscript):
        obj, key = ev(node.value), ev(node.slice)
        if not isinstance(obj, (dict, list, tuple, torch.Tensor)):
            raise _NotRun(f"`{ast.unparse(node)}` indexes a {type(obj).__name__}")
        return _copy(obj[key])
    if isinstance(node, ast.Tuple):
        return tuple(ev(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -ev(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](ev(node.left), ev(node.right))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:  # `is_causal=(t > 1)`
        return _COMPARE[type(node.ops[0])](ev(node.left), ev(node.comparators[0]))
    if isinstance(node, ast.Attribute):
        base = ev(node.value)
        if isinstance(base, torch.Tensor) and node.attr == "grad":  # a gradient the line passes: a copy of it
            g = base.grad if base.grad is not None else getattr(frame.f_locals.get(ast.unparse(node.value)), "grad",
                                                                None)
            if not isinstance(g, torch.Tensor):
                raise _NotRun(f"`{ast.unparse(node)}` holds no gradient")
            g = _copy(g)
            return g.to(target) if ast.unparse(node) in names else g
        if isinstance(base, types.ModuleType) and base.__name__.startswith("torch"):
            return getattr(base, node.attr)
        if isinstance(base, torch.Tensor) and callable(getattr(torch.Tensor, node.attr, None)):
            return getattr(base, node.attr)
        raise _NotRun(f"`{ast.unparse(node)}` is no torch function or tensor method")
    if isinstance(node, ast.Call):
        fn = ev(node.func)
        owner = getattr(fn, "__self__", None)
        if not (isinstance(owner, torch.Tensor) or (getattr(fn, "__module__", "") or "").startswith("torch")):
            raise _NotRun(f"`{ast.unparse(node.func)}` is no torch function")
        more = [ev(k.value) for k in node.keywords if k.arg is None]  # `**sdpa_kwargs`: a dict the frame holds
        if not all(isinstance(d, dict) for d in more):
            raise _NotRun(f"`{ast.unparse(node)}` passes ** of no dict")
        return fn(*(ev(a) for a in node.args), **{k.arg: ev(k.value) for k in node.keywords if k.arg},
                  **{k: v for d in more for k, v in d.items()})
    raise _NotRun(f"`{ast.unparse(node)}` is not re-run")


def where(path: str, lineno: int) -> str:
    return f"{os.path.basename(path)}:{lineno}"


def destination(frame: Any, lineno: int, tb: Any = None) -> list[str]:
    """The maker of the tensor an in-place method on the line writes into (``st["buf"].lerp_(...)``: the state made
    by ``torch.zeros(..., dtype=torch.float32)`` at its line): what set the dtype the op demands."""
    from torchdoctor._guard.frames import user_frames
    from torchdoctor._guard.maker import find

    got = parsed_line(linecache.getline(frame.f_code.co_filename, lineno))
    if got is None:
        return []
    tree = got[0]
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr.endswith("_") \
                and not n.func.attr.startswith("_"):
            try:
                t = _held(n.func.value, frame)
                m = find(user_frames(tb), t, "dtype") if isinstance(t, torch.Tensor) else None
                said = m.describe() if m is not None else _assigned(frame, ast.unparse(n.func.value), lineno)
            except Exception:  # naming the maker is extra
                said = None
            if said:
                out.append(f"{ast.unparse(n.func.value)} (written in place by `.{n.func.attr}`) {said}")
    return out[:2]


def _held(node: ast.expr, frame: Any) -> Any:
    """The very object a name or a constant subscript of one holds (never a copy: its maker is looked up)."""
    if isinstance(node, ast.Name):
        return frame.f_locals.get(node.id)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        obj = _held(node.value, frame)
        return obj.get(node.slice.value) if isinstance(obj, dict) else None
    return None


def _assigned(frame: Any, target: str, lineno: int) -> str | None:
    """``made by `torch.zeros` at file:line (`...`)`` for the newest ``<target> = torch.<factory>(...)`` before
    ``lineno`` in the frame's function (a state kept in a dict: ``st["buf"] = torch.zeros(..., dtype=...)``)."""
    from torchdoctor._guard.maker import _parsed as parsed_code

    parsed = parsed_code(frame.f_code)
    if parsed is None:
        return None
    tree, off, path, lines = parsed
    best = None
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and n.lineno + off < lineno and isinstance(n.value, ast.Call) \
                and any(ast.unparse(t) == target for t in n.targets) and isinstance(n.value.func, ast.Attribute) \
                and ast.unparse(n.value.func.value) == "torch":
            best = n if best is None or n.lineno > best.lineno else best
    if best is None:
        return None
    src = lines[best.lineno - 1].strip() if best.lineno - 1 < len(lines) else ""
    call: Any = best.value
    return f"made by `{ast.unparse(call.func)}` at {path}:{best.lineno + off} (`{src}`)"


def called_name(op: str) -> str:
    """The function a maker's op calls: ``to`` for ``.to(original_dtype)``, ``zeros`` for ``torch.zeros``."""
    op = op.strip("`")
    return (op[1:] if op.startswith(".") else op).split("(", 1)[0].rsplit(".", 1)[-1]


def whole_value(source: str, op: str) -> bool:
    """Is the maker's call the whole value the line assigns (``feats = torch.from_numpy(a)``)? Then its result is
    the local, and aligning the local where it is used is the fix; not when the line goes on with it
    (``w = self.weight.to(dt) * self.scale``: the multiply decides the local's dtype)."""
    got = parsed_line(source)
    stmt = got[0].body[0] if got is not None and got[0].body else None
    if not isinstance(stmt, ast.Assign) or not isinstance(stmt.value, ast.Call):
        return False
    func = stmt.value.func
    return (func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else "") == \
        called_name(op)

"""The maker of an operand that is no model tensor: the cast or factory call in a running forward that made it
(``.to(self.compute_dtype)``, ``.float()``, ``torch.zeros``, ``torch.from_numpy``), its line, where a dtype it cast
to was read from (an attribute, a class attribute, a config) and the tensors it was made from.

Only read at a failure, from the failing forwards' frames and their parsed source: nothing is recorded per op. A dtype
expression is resolved by attribute look-ups on the frame's values (never ``eval``): the user's code is never run."""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
import threading
from dataclasses import dataclass, replace
from typing import Any

import torch

from torchdoctor._guard.frames import Frames, holds as _holds, lineno, same as _same, user_frames

_CASTS = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16, "double": torch.float64}
_FACTORIES = {"zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint", "tensor", "as_tensor",
              "from_numpy", "zeros_like", "ones_like", "empty_like", "full_like", "linspace", "eye"}
# (file, code object) -> parsed forward: code objects compare equal across files that hold the same source
_TREES: dict[Any, tuple[ast.AST, int, str, list[str]] | None] = {}
_PARSING = threading.Lock()


@dataclass(frozen=True)
class Maker:
    """How an operand was made: ``op`` (``.to(self.compute_dtype)``, ``torch.zeros``), at ``file:line``."""

    op: str
    file: str
    line: int
    source: str  # the source line, stripped
    dtype_from: str | None = None  # "class attribute `QLinear.compute_dtype`", "attribute ...", "config ..."
    made_from: tuple[str, ...] = ()  # the names the call read tensors from (``self.qweight``, ``x``)
    owner: Any = None  # the object whose attribute held the dtype, and the attribute's name (for the fix)
    attr: str | None = None
    klass: type | None = None  # the class that defines the attribute (a class attribute)
    segment: tuple[int, int, str] | None = None  # (col, end col, text) of the dtype expression on its line
    span: tuple[int, int] | None = None  # (col, end col) of the whole call on its line, when on one line
    factory: bool = False  # a call that makes a tensor from scratch (``torch.arange``), not from other tensors
    no_device: bool = False  # a factory called without ``device=``: torch makes it on the CPU
    device_expr: str | None = None  # how that forward can name the device the fix wants (``x.device``)
    this: Any = None  # the ``self`` of the forward that made it (a config read as ``self.config.x`` is its own)
    via: str | None = None  # the expression that carried it into the operand (``self.a(x) * gate``)
    runner: Any = None  # a running module whose re-run reaches the maker (its submodule's forward has returned)
    component: tuple[str, Any] | None = None  # (the program's name, the module) a LIBCALL maker called

    @property
    def default_dtype(self) -> bool:
        """A factory given no dtype (none written, or ``dtype=None``): the default dtype, nobody's choice."""
        return self.factory and self.dtype_from is None and (self.segment is None or self.segment[2] == "None")

    def describe(self) -> str:
        out = f"made by `{self.op}` at {self.file}:{self.line} (`{self.source}`)"
        if self.dtype_from:
            out += f", the dtype read from {self.dtype_from}"
        if self.made_from:
            out += f", from {', '.join(self.made_from)}"
        if self.no_device:
            out += ", with no device= (made on the CPU)"
        if self.via:
            out += f", reaching the op through `{self.via}`"
        return out


def _parsed(code: Any) -> tuple[ast.AST, int, str, list[str]] | None:
    key = (code.co_filename, code)
    if key not in _TREES:
        try:
            if code.co_name == "<module>":  # a script's top level: the whole file (getsourcelines gives one block)
                lines, start = linecache.getlines(code.co_filename), 1
                if not lines:
                    raise OSError(code.co_filename)
            else:
                lines, start = inspect.getsourcelines(code)
            with _PARSING:  # CPython 3.11's ast.parse is not safe in two threads at once (guards in two threads)
                tree = ast.parse(textwrap.dedent("".join(lines)))
            _TREES[key] = (tree, max(start - 1, 0), inspect.getsourcefile(code) or code.co_filename, lines)
        except (OSError, TypeError, SyntaxError, IndentationError):
            _TREES[key] = None
    return _TREES[key]


def _chain(node: ast.AST) -> list[str] | None:
    """``self.config.torch_dtype`` -> ["self", "config", "torch_dtype"]; None for anything but a name chain."""
    out: list[str] = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *out[::-1]]


def _resolve(chain: list[str], frame: Any) -> tuple[Any, Any, str | None]:
    """(value, the object holding the last attribute, the attribute's name), by plain look-ups."""
    loc, glob = frame.f_locals, frame.f_globals
    if chain[0] in loc:
        obj = loc[chain[0]]
    elif chain[0] in glob:
        obj = glob[chain[0]]
    else:
        import builtins

        obj = getattr(builtins, chain[0], None)
    holder = None
    for name in chain[1:]:
        holder = obj
        obj = inspect.getattr_static(obj, name, None) if not isinstance(obj, type(torch)) else getattr(obj, name, None)
        if isinstance(obj, property):  # a property runs code: say nothing rather than run it
            return None, None, None
    return obj, holder, chain[-1] if len(chain) > 1 else None


def _where(holder: Any, attr: str, chain: list[str]) -> tuple[str, type | None]:
    """Where an attribute holding a dtype lives: the instance, a class (and which), a config."""
    if any(part == "config" or part.endswith("_config") for part in chain[:-1]):
        return f"config `{'.'.join(chain)}`", None
    if not isinstance(holder, type) and attr in getattr(holder, "__dict__", {}):
        return f"attribute `{'.'.join(chain)}`", None
    for klass in (holder.__mro__ if isinstance(holder, type) else type(holder).__mro__):
        if attr in klass.__dict__:
            return f"class attribute `{klass.__name__}.{attr}`", klass
    return f"`{'.'.join(chain)}`", None


def _dtype_of_call(call: ast.Call, frame: Any) -> tuple[Any, ast.expr | None]:
    """(the dtype a cast or factory call gives, the node the dtype came from)."""
    for kw in call.keywords:
        if kw.arg == "dtype":
            ch = _chain(kw.value)
            return (_resolve(ch, frame)[0] if ch else None), kw.value
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _CASTS and not call.args:
        return _CASTS[func.attr], None
    if isinstance(func, ast.Attribute) and func.attr in ("to", "type"):
        for a in call.args:
            ch = _chain(a)
            v = _resolve(ch, frame)[0] if ch else None
            if isinstance(v, torch.dtype):
                return v, a
            if isinstance(v, torch.Tensor):  # .to(other): other's dtype
                return v.dtype, a
    return None, None


def _calls(node: ast.AST) -> list[ast.Call]:
    out = [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    return sorted(out, key=lambda n: (n.lineno, n.col_offset))


def _is_factory(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr in _FACTORIES and _chain(call.func.value) in (
        ["torch"], ["np"], ["numpy"])


def _ints(call: ast.Call) -> bool:
    """``torch.tensor([[1, 5]])``: data of int literals only makes an integer tensor, never a floating operand."""
    data = call.args[0] if call.args and isinstance(call.args[0], (ast.List, ast.Tuple)) else None
    leaves = [n.value for n in ast.walk(data) if isinstance(n, ast.Constant)] if data is not None else []
    return bool(leaves) and all(type(v) in (int, bool) for v in leaves)


def _torch_call(call: ast.Call) -> bool:
    """``torch.cat(...)``, ``torch.stack(...)``: a torch function whose result is a new tensor on some device."""
    return isinstance(call.func, ast.Attribute) and _chain(call.func.value) == ["torch"]


def _made_from(call: ast.Call, skip: ast.expr | None, frame: Any = None, kind: str = "dtype") -> tuple[str, ...]:
    """The names a call read tensors from, each with its device or dtype where the frame still holds it
    (``labels (cpu)``)."""
    chains: list[list[str]] = []
    func = call.func
    if isinstance(func, ast.Attribute) and not _is_factory(call) and not _torch_call(call):
        ch = _chain(func.value)
        if ch:
            chains.append(ch)
    for a in call.args:
        for x in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a]):
            ch = _chain(x) if x is not skip else None
            if ch and not (len(ch) == 2 and ch[0] == "torch"):
                chains.append(ch)
    names = []
    for ch in chains:
        v = frame.f_locals.get(ch[0]) if frame is not None and len(ch) == 1 else None
        shown = ""
        if isinstance(v, torch.Tensor):
            from torchdoctor._placement import device_str, dtype_str, tensor_device

            shown = f" ({dtype_str(v.dtype) if kind == 'dtype' else device_str(tensor_device(v))})"
        names.append(".".join(ch) + shown)
    return tuple(dict.fromkeys(names))


def _expressions(tree: ast.AST, off: int, frame: Any, t: torch.Tensor) -> list[tuple[ast.AST, bool]]:
    """The source expressions that may have made ``t``, each with whether it is the value assigned to the local
    holding it (or its view's base) or only the statement running now (where ``t`` may be used, not made)."""
    names = []
    for name, v in frame.f_locals.items():
        if isinstance(v, torch.Tensor) and name != "self" and _same(v, t):
            names.append(name)
    now = lineno(frame) - off
    exprs: list[tuple[int, ast.AST]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.lineno <= now and node.value:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(x, ast.Name) and x.id in names for x in targets):
                exprs.append((node.lineno, node.value))
    exprs.sort(key=lambda x: -x[0])
    # the newest assignment first; an older one only when the newer made nothing (``sigma = sigmas[i]`` indexes
    # the table ``sigmas = torch.tensor(...)`` made)
    found = [(e, True) for _, e in exprs[:4]]
    stmt = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and n.lineno <= now <= (n.end_lineno or n.lineno)
            and not isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
    if stmt:
        found.append((max(stmt, key=lambda n: n.lineno), False))
    return found


def find(frames: list[Any], t: torch.Tensor, kind: str, target: Any = None) -> Maker | None:
    """The maker of ``t`` in the running forwards' ``frames`` (innermost last), or None. For a device, ``target``
    (the device ``t`` should have been made on) lets the maker say how its forward names that device."""
    callee = getattr(frames, "callee", {})
    for frame in reversed(frames):
        try:
            found = _in_frame(frame, t, kind, target, callee.get(id(frame)))
        except Exception:  # naming the maker is extra: the failure is still reported without it
            found = None
        if found is not None:
            return found
    return None


def _accepts(call: ast.Call, kind: str, dtype: Any, t: torch.Tensor, assigned: bool, frame: Any) -> bool:
    """Is ``call`` what gave ``t`` its wrong ``kind``? A dtype: a cast or factory to ``t``'s dtype. A device: a
    factory, a move, or (where ``t`` was assigned from it) a torch function such as ``torch.cat``; a method of a
    tensor (``.view``, ``.long()``) keeps its tensor's device, so the search goes on to where that came from."""
    factory = _is_factory(call)
    if kind == "dtype":  # a factory given no dtype makes the default one, integers, or its data's (a numpy array's)
        name = call.func.attr if isinstance(call.func, ast.Attribute) else ""
        return dtype == t.dtype or (factory and dtype is None and not (t.is_floating_point() and (
            _ints(call) or name in ("randint", "randperm") or t.dtype != torch.get_default_dtype() and
            name not in ("tensor", "as_tensor", "from_numpy", "asarray", "array") and not name.endswith("_like"))))
    attr = call.func.attr  # type: ignore[attr-defined]
    if attr in ("to", "type") and len(call.args) == 1 and not any(k.arg == "device" for k in call.keywords):
        ch = _chain(call.args[0])
        if ch and isinstance(_resolve(ch, frame)[0], torch.dtype):
            return False  # ``.to(torch.float16)`` casts; it moves nothing
    return factory or attr in ("to", "cuda", "cpu") or (assigned and _torch_call(call))


def _device_expr(frame: Any, target: Any) -> str | None:
    """A name the forward already has for ``target``: a local tensor on it (``x.device``), else its module's
    parameters (``next(self.parameters()).device``)."""
    from torchdoctor._placement import norm_device, tensor_device

    if not isinstance(target, torch.device):
        return None
    want = norm_device(target)
    line = linecache.getline(frame.f_code.co_filename, lineno(frame))  # names of the running line come first
    words = set(line.replace(".", " ").replace("(", " ").replace(")", " ").replace(",", " ").split())
    here = sorted(frame.f_locals.items(), key=lambda kv: kv[0] not in words)
    for name, v in here:
        if isinstance(v, torch.Tensor) and name != "self" and name.isidentifier() and \
                norm_device(tensor_device(v)) == want:
            return f"{name}.device"
    me = frame.f_locals.get("self")
    if isinstance(me, torch.nn.Module):
        p = next(me.parameters(), None)
        if p is not None and norm_device(tensor_device(p)) == want:
            return "next(self.parameters()).device"
    return None


def _in_frame(frame: Any, t: torch.Tensor, kind: str, target: Any = None, callee: Any = None) -> Maker | None:
    parsed = _parsed(frame.f_code)
    if parsed is None:
        return None
    exprs = _expressions(parsed[0], parsed[1], frame, t)
    for expr, assigned in exprs:
        if not assigned and callee is not None and not _holds(callee, t):
            continue  # the running statement's call never received it: it was made further in
        found = _by_call(expr, frame, t, kind, target, assigned, parsed)
        if found is not None:
            return found
    for expr, assigned in exprs:  # ``self.a(x) * gate``: the named operand that gave the result its value
        if not assigned and callee is not None and not _holds(callee, t):
            continue
        for node in ast.walk(expr):
            if not isinstance(node, ast.BinOp):
                continue
            for side in (node.left, node.right):
                v = frame.f_locals.get(side.id) if isinstance(side, ast.Name) else None
                if isinstance(v, torch.Tensor) and v is not t and _value(v, kind) == _value(t, kind):
                    inner = _in_frame(frame, v, kind, target)
                    if inner is not None:
                        return replace(inner, via=ast.unparse(node))
    if kind != "dtype":
        return None
    for expr, assigned in exprs:  # ``self.head(self.block(x))``: a submodule whose forward has returned cast it
        if not assigned and callee is not None and not _holds(callee, t):
            continue
        for call in _calls(expr):
            sub = _submodule(_chain(call.func), frame)
            if isinstance(sub, torch.nn.Module) and sub is not frame.f_locals.get("self"):
                inner = _returned(sub, t)
                if inner is not None:
                    return replace(inner, via=ast.unparse(call), runner=frame.f_locals.get("self"))
    return None


def _submodule(chain: list[str] | None, frame: Any) -> Any:
    """``self.block`` -> the submodule it names (from ``_modules``, never through ``__getattr__``), else None."""
    obj = frame.f_locals.get(chain[0]) if chain and len(chain) > 1 else None
    for name in (chain or [])[1:]:
        obj = obj.__dict__.get("_modules", {}).get(name) if isinstance(obj, torch.nn.Module) else None
    return obj


def _returned(sub: torch.nn.Module, t: torch.Tensor) -> Maker | None:
    """The cast in ``sub``'s forward (read, never run: it has returned) that gives ``t``'s dtype."""
    import types

    fn = getattr(type(sub).forward, "__code__", None)
    if fn is None:
        return None
    parsed = _parsed(fn)
    if parsed is None:
        return None
    frame = types.SimpleNamespace(f_locals={"self": sub}, f_globals=type(sub).forward.__globals__, f_code=fn,
                                  f_lineno=fn.co_firstlineno)
    # only what the forward returns: a cast it undoes before returning (a norm's float32 upcast) made nothing
    for ret in (n for n in ast.walk(parsed[0]) if isinstance(n, ast.Return) and n.value is not None):
        value: Any = ret.value
        if isinstance(value, ast.Name):
            made = [n for n in ast.walk(parsed[0]) if isinstance(n, ast.Assign) and n.lineno < ret.lineno
                    and any(isinstance(x, ast.Name) and x.id == value.id for x in n.targets)]
            value = max(made, key=lambda n: n.lineno).value if made else None
        found = _by_call(value, frame, t, "dtype", None, False, parsed) if value is not None else None
        if found is not None and not found.factory:
            return found
    return None


def _value(t: torch.Tensor, kind: str) -> Any:
    from torchdoctor._placement import norm_device, tensor_device

    return t.dtype if kind == "dtype" else norm_device(tensor_device(t))


def _by_call(expr: ast.AST, frame: Any, t: torch.Tensor, kind: str, target: Any, assigned: bool,
             parsed: tuple[ast.AST, int, str, list[str]]) -> Maker | None:
    _, off, path, lines = parsed
    shift = len(lines[0]) - len(lines[0].lstrip()) if lines else 0  # the dedented tree's columns -> the file's
    for call in _calls(expr):
        dtype, node = _dtype_of_call(call, frame)
        if not _accepts(call, kind, dtype, t, assigned, frame):
            continue
        factory = _is_factory(call)
        text = ast.unparse(call.func)
        op = text if factory or _torch_call(call) else "." + text.rsplit(".", 1)[-1] + "(" + ", ".join(
            ast.unparse(a) for a in call.args) + ")"
        lineno = call.lineno + off
        src = lines[call.lineno - 1].strip() if call.lineno - 1 < len(lines) else ""
        where = owner = attr = klass = None
        ch = _chain(node) if node is not None else None
        if ch and len(ch) > 1 and ch[0] != "torch":  # ``torch.float32`` is written, not read from anywhere
            _, owner, attr = _resolve(ch, frame)
            if attr is not None and owner is not None:
                where, klass = _where(owner, attr, ch)
        seg = span = None
        if node is not None and node.lineno == node.end_lineno and call.lineno - 1 < len(lines):
            col = node.col_offset + shift
            seg = (col, (node.end_col_offset or node.col_offset) + shift, ast.unparse(node))
        if call.lineno == call.end_lineno and call.end_col_offset is not None:
            span = (call.col_offset + shift, call.end_col_offset + shift)
        no_device = kind == "device" and factory and _chain(call.func.value) == ["torch"] and not any(  # type: ignore[attr-defined]
            k.arg == "device" for k in call.keywords) and not call.func.attr.endswith("_like")  # type: ignore[attr-defined]
        return Maker(op, path, lineno, src, where, _made_from(call, node, frame, kind), owner, attr, klass, seg,
                     span, factory, no_device, _device_expr(frame, target) if kind == "device" else None,
                     frame.f_locals.get("self"))
    return None

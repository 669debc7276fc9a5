"""What a module's own code does to its tensors on each call, read from the code (parsed, never run).

A layer may keep its weights anywhere, in any dtype, when its own forward brings them to the input's device or dtype
before computing: ComfyUI's ``comfy.ops`` cast layers and lowvram partial loading, InvokeAI's autocast layers
(``_cast_weight_bias_for_input`` -> ``cast_to_device``), Forge's operations (``weights_manual_cast``), transformers
5 rotary embeddings (``self.inv_freq.to(x.device)`` in forward; ``original_inv_freq`` moved by the dynamic-rope
decorator before it is read). The mechanism is the same in each, so it is recognised the same way whatever the app:

- the forward (and what it wraps), the module's methods it calls, and the functions it hands the module to
  (``cast_bias_weight(self, x)``, resolved through the function's globals and closure) are parsed, a few calls deep;
- a tensor of the module is *moved per call* when it is the receiver of ``.to(`` / ``.cuda(`` / ``.float(`` ...
  (directly, through an index or a method chain, or through a local name bound to it), the source of a
  ``dst.copy_(...)`` (copied into a tensor made where the call computes), or an argument of a helper
  named like a cast (``cast_to_device(self.weight, ...)``); a helper handed the whole module that cannot be read
  moves its ``weight`` and ``bias``;
- a top-level ``if`` / ``elif`` of the forward whose branch moves them switches it on: the instance attributes its
  test reads (``self.comfy_cast_weights``, ``len(self.weight_function) > 0``, ``self._device_autocasting_enabled``)
  say whether it runs; a test that reads only the module's own tensors (``self.weight.dtype != x.dtype``) casts the
  dtype when it differs, the device is still the module's own; an ``else`` branch counts only when its ``if`` moves
  nothing (Forge's plain path reads the same helper without a cast).

Per class, cached. The forward's names are read first (code objects only), so ordinary forwards are never parsed.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import re
import textwrap
import types
from typing import Any

from torch import nn

DEVICE, DTYPE = 1, 2  # what a per-call move changes, as bits
_BOTH = DEVICE | DTYPE
_MOVES = {"to": _BOTH, "cuda": DEVICE, "cpu": DEVICE, "xpu": DEVICE, "mps": DEVICE, "float": DTYPE, "half": DTYPE,
          "bfloat16": DTYPE, "double": DTYPE, "type": DTYPE, "type_as": _BOTH}
_HELPER = r"cast|to_device|dequant"  # a helper named so moves or casts what it is given (``re`` caches it)
_DEPTH = 4
# class -> (always: name -> bits, branches: (switch names, negated, name -> bits)); None: its forward moves nothing
Plan = tuple[dict[str, int], list[tuple[tuple[str, ...], bool, dict[str, int]]]]
_PLANS: dict[type, Plan | None] = {}
_STATIC: dict[type, dict[str, int]] = {}  # class -> what ``moved_on_call`` gives for any instance (no switch read)
_TREES: dict[types.CodeType, ast.FunctionDef | None] = {}


def _torch_own(klass: type) -> bool:
    return klass is nn.Module or klass is object or (klass.__module__ or "").startswith("torch.")


def _names(fn: Any, depth: int = 0) -> set[str]:
    """Names the code of ``fn`` reads (nested code, what it wraps and the functions in its closure included)."""
    out: set[str] = set()
    code = getattr(fn, "__code__", None)
    stack = [code] if isinstance(code, types.CodeType) else []
    while stack:
        c = stack.pop()
        out.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    if depth < 2:
        inner = [getattr(fn, "__wrapped__", None), *(_cell(c) for c in getattr(fn, "__closure__", None) or ())]
        for f in inner:
            if isinstance(f, types.FunctionType):
                out |= _names(f, depth + 1)
    return out


def _cell(c: Any) -> Any:
    try:
        return c.cell_contents
    except ValueError:  # an empty cell
        return None


def _tree(fn: types.FunctionType) -> ast.FunctionDef | None:
    code = fn.__code__
    if code in _TREES:
        return _TREES[code]
    _TREES[code] = None
    # read through linecache, not inspect.getsource: that one looks up the function's module among every loaded
    # module (a third of a second the first time in a process that imported transformers); the code object, not
    # the function: getsource(fn) would follow ``__wrapped__`` to what a decorator wraps
    try:
        lines = linecache.getlines(code.co_filename)
        start = code.co_firstlineno - 1
        if not lines or start >= len(lines):
            return None
        tree = ast.parse(textwrap.dedent("".join(inspect.getblock(lines[start:]))))
    except (SyntaxError, IndentationError, ValueError):
        return None
    node = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    _TREES[code] = node if isinstance(node, ast.FunctionDef) else None
    return _TREES[code]


_NODES: dict[int, list[ast.AST]] = {}  # id of a parsed function -> its nodes (the trees are kept in _TREES)


def _nodes(node: ast.FunctionDef) -> list[ast.AST]:
    hit = _NODES.get(id(node))
    if hit is None:
        hit = _NODES[id(node)] = list(ast.walk(node))[1:]
    return hit


def _resolve(fn: types.FunctionType, name: str) -> Any:
    """A name as ``fn`` sees it: its closure, then its module's globals."""
    code = fn.__code__
    if fn.__closure__ and name in code.co_freevars:
        return _cell(fn.__closure__[code.co_freevars.index(name)])
    return fn.__globals__.get(name)


class _Reader:
    """Reads one class's call path; ``moves(fn, self_name)`` gives what the code moves of the module's tensors."""

    def __init__(self, tp: type) -> None:
        self.tp = tp
        # (code, name of the module, parameters bound to its tensors) -> moves, and -> its local aliases
        self.memo: dict[tuple[types.CodeType, str, tuple[tuple[str, str], ...]], dict[str, int]] = {}
        self.aliases: dict[tuple[types.CodeType, str, tuple[tuple[str, str], ...]], dict[str, str]] = {}

    def moves(self, fn: Any, me: str, depth: int = 0, body: list[ast.stmt] | None = None,
              bound: tuple[tuple[str, str], ...] = ()) -> dict[str, int]:
        """What ``fn`` (or the statements ``body`` of it) moves of the module it knows as ``me``; ``bound``: its
        parameters that were handed one of the module's tensors (``self._bring(self.weight, x)``)."""
        if not isinstance(fn, types.FunctionType) or depth > _DEPTH:
            return {}
        key = (fn.__code__, me, bound)
        if body is None:
            if key in self.memo:  # read before, or being read (a recursion): nothing more to find there
                return self.memo[key]
            self.memo[key] = {}
        node = _tree(fn)
        if node is None:
            return {}
        nodes = body if body is not None else node.body
        out: dict[str, int] = {}
        alias = self.aliases.get(key)
        if alias is None:  # local name -> the module tensor it was bound to (anywhere in the function: every branch)
            alias = self.aliases[key] = dict(bound)
            for n in _nodes(node):
                if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                    a = self._attr(n.value, me, alias)
                    if a is not None:
                        alias[n.targets[0].id] = a
        for n in (_nodes(node) if body is None else (n for stmt in nodes for n in ast.walk(stmt))):
            if isinstance(n, ast.Call):
                self._call(n, fn, me, alias, depth, out)
        if body is None:
            self.memo[key] = out
        return out

    def _attr(self, node: ast.AST, me: str, alias: dict[str, str]) -> str | None:
        """The module tensor an expression starts from (``self.w``, ``self.w[...]``, ``self.w.float().expand()``,
        ``getattr(self, "w")``, a local bound to one), or None."""
        while True:
            if isinstance(node, ast.Subscript):
                node = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                node = node.func.value
            else:
                break
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == me:
            return node.attr
        if isinstance(node, ast.Name):
            return alias.get(node.id)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == me \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            return node.args[1].value
        return None

    def _call(self, n: ast.Call, fn: types.FunctionType, me: str, alias: dict[str, str], depth: int,
              out: dict[str, int]) -> None:
        f = n.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if isinstance(f, ast.Attribute) and name in _MOVES:
            a = self._attr(f.value, me, alias)
            if a is not None:
                bits = _MOVES[name]
                if name == "to":  # ``.to(device)`` moves, ``.to(dtype)`` casts; ``.to(x)`` / keywords: both
                    bits = _to_bits(n)
                out[a] = out.get(a, 0) | bits
                return
        if name == "copy_" and isinstance(f, ast.Attribute) and n.args:
            # ``dst.copy_(self.weight)``: copied into a tensor made where the call computes (ComfyUI's cast_to:
            # ``torch.empty_like(w, dtype=..., device=...)`` then ``copy_``), so it arrives on dst's device and dtype
            a = self._attr(n.args[0], me, alias)
            if a is not None:
                out[a] = out.get(a, 0) | _BOTH
                return
        args = [*n.args, *(k.value for k in n.keywords)]
        handed = [i for i, x in enumerate(n.args) if isinstance(x, ast.Name) and x.id == me]
        if re.search(_HELPER, name, re.I):
            for x in args:
                a = self._attr(x, me, alias)
                if a is not None:
                    out[a] = out.get(a, 0) | _BOTH
        target: Any = None
        first = 0  # the callee's parameter the call's first positional argument lands in
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == me:
            target = inspect.getattr_static(self.tp, name, None)  # one of the module's own methods
            target = getattr(target, "__func__", target)
            first = 1
        elif isinstance(f, ast.Name):
            target = _resolve(fn, f.id)  # a function of the module's code, handed the module or its tensors
        if not isinstance(target, types.FunctionType) or _torch_own_fn(target):
            if handed and re.search(_HELPER, name, re.I):  # a cast helper we cannot read, handed the module
                for a in ("weight", "bias"):
                    out[a] = out.get(a, 0) | _BOTH
            return
        code = target.__code__
        params = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        callee_me, tied = (params[0] if params else "") if first else "", {}
        for i, x in enumerate(n.args):
            if isinstance(x, ast.Starred) or i + first >= code.co_argcount:
                break
            if isinstance(x, ast.Name) and x.id == me:
                callee_me = params[i + first]
            else:
                a = self._attr(x, me, alias)
                if a is not None:
                    tied[params[i + first]] = a
        for k in n.keywords:
            a = self._attr(k.value, me, alias) if k.arg in params else None
            if a is not None and k.arg is not None:
                tied[k.arg] = a
        if not callee_me and not tied:
            return
        found = self.moves(target, callee_me, depth + 1, bound=tuple(sorted(tied.items())))
        if not found and handed and re.search(_HELPER, name, re.I):
            found = {"weight": _BOTH, "bias": _BOTH}
        for k2, v in found.items():
            out[k2] = out.get(k2, 0) | v


def _to_bits(n: ast.Call) -> int:
    kw = {k.arg for k in n.keywords}
    if "dtype" in kw and "device" not in kw and not n.args:
        return DTYPE
    if "device" in kw and "dtype" not in kw and not n.args:
        return DEVICE
    if len(n.args) == 1 and not kw - {"non_blocking", "copy"}:
        text = ast.unparse(n.args[0]).lower()
        if "dtype" in text or text.startswith("torch.float") or text.startswith("torch.b") or text.startswith(
                "torch.half"):
            return DTYPE
        if "device" in text or text in ("'cuda'", "'cpu'", "'xpu'", "'mps'"):
            return DEVICE
    return _BOTH


def _torch_own_fn(fn: types.FunctionType) -> bool:
    return (fn.__module__ or "").startswith("torch.")


def _switches(test: ast.expr, me: str) -> tuple[tuple[str, ...], bool]:
    """The instance attributes an ``if`` test reads, and whether the test is ``not ...`` of them."""
    neg = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    names = tuple(dict.fromkeys(n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)
                                and isinstance(n.value, ast.Name) and n.value.id == me))
    return names, neg


def plan(tp: type) -> Plan | None:
    """What the forward of module class ``tp`` moves of the module's own tensors, always and per switch; None when
    it moves nothing (torch's own layers, ordinary model code: read from their code names, never parsed)."""
    if tp in _PLANS:
        return _PLANS[tp]
    _PLANS[tp] = None
    owner = next((k for k in tp.__mro__ if "forward" in k.__dict__), None)
    if owner is None or _torch_own(owner):
        return None
    fwd = owner.__dict__["forward"]
    if not isinstance(fwd, types.FunctionType):
        return None
    names = _names(fwd)
    if not names & _MOVES.keys() and "copy_" not in names and not any(re.search(_HELPER, n, re.I) for n in names):
        return None  # the cheap test: nothing in its code could move a tensor
    node = _tree(fwd)
    if node is None:
        return None
    reader = _Reader(tp)
    params = fwd.__code__.co_varnames[:1]
    me = params[0] if params else "self"
    always: dict[str, int] = {}
    branches: list[tuple[tuple[str, ...], bool, dict[str, int]]] = []
    rest: list[ast.stmt] = []
    for stmt in node.body:
        if not isinstance(stmt, ast.If):
            rest.append(stmt)
            continue
        while isinstance(stmt, ast.If):  # an if / elif chain: each branch with its own switch
            moved = reader.moves(fwd, me, body=stmt.body)
            if moved:
                branches.append((*_switches(stmt.test, me), moved))
            orelse = stmt.orelse
            if len(orelse) == 1 and isinstance(orelse[0], ast.If):
                stmt = orelse[0]
                continue
            if orelse and not moved:
                rest.extend(orelse)
            break
    for k, v in reader.moves(fwd, me, body=rest).items():
        always[k] = always.get(k, 0) | v
    inner = getattr(fwd, "__wrapped__", None)
    if isinstance(inner, types.FunctionType):  # a decorated forward (transformers' dynamic_rope_update)
        p = inner.__code__.co_varnames[:1]
        for k, v in reader.moves(inner, p[0] if p else "self", 1).items():
            always[k] = always.get(k, 0) | v
    if always or branches:
        _PLANS[tp] = (always, branches)
    return _PLANS[tp]


def moved_on_call(module: nn.Module) -> dict[str, int]:
    """The module's own tensors (attribute names: ``weight``, ``inv_freq``) its forward moves or casts on this call,
    each with what it changes (``DEVICE`` / ``DTYPE`` bits); empty when it moves nothing."""
    tp = type(module)
    static = _STATIC.get(tp)
    if static is not None:  # what it moves does not depend on the instance (a rotary embedding's inv_freq)
        return dict(static)
    p = plan(tp)
    if p is None:
        return {}
    always, branches = p
    if not any(names for names, _, _ in branches):  # no switch: every branch's test reads nothing of the instance
        out = dict(always)
        for _, _, moved in branches:
            for k, v in moved.items():
                out[k] = out.get(k, 0) | v
        if len(_STATIC) > 4096:  # fx GraphModules make a class per instance
            _STATIC.clear()
        static = _STATIC[tp] = {k: v for k, v in out.items() if v}
        return dict(static)
    out = dict(always)
    d = module.__dict__
    tensors = {**(d.get("_parameters") or {}), **(d.get("_buffers") or {})}
    for names, neg, moved in branches:
        flags = [n for n in names if n not in tensors]
        if names and not flags:
            on, bits = True, DTYPE  # reads only its own tensors (their dtype against the input's): casts the dtype
        else:
            on, bits = not flags or any(_truthy(inspect.getattr_static(module, n, None)) for n in flags), _BOTH
            on = on != neg if flags else on
        if on:
            for k, v in moved.items():
                out[k] = out.get(k, 0) | (v & bits)
    return {k: v for k, v in out.items() if v}


def _truthy(v: Any) -> bool:
    if v is None:
        return False
    if isinstance(v, (bool, int, float, str, list, tuple, dict, set, frozenset)):
        return bool(v)
    return True


__all__ = ["DEVICE", "DTYPE", "moved_on_call", "plan"]

"""Tensors a per-layer placement mechanism never moves, fixed where the forward uses them.

An app that places a model layer by layer — partial loading that moves leaf layers while they fit a budget and
leaves the rest casting their weights per call (ComfyUI's lowvram ops), a sequential offload by forward pre-hooks on
leaf layers — never moves a Parameter or buffer that a module above the layers owns and reads itself (a decoder's
register tokens, a block's layer scale, a position embedding). Moving the whole model would undo the mechanism (the
model is placed so because it does not fit), so each such tensor is fixed at the line of its forward that uses it:
through the app's own per-call helper when its cast layers use one (``ops.cast_to(self.register_tokens, h.device,
h.dtype)``), else ``.to(h.device)``, with a tensor that the same line holds on the run's device. Proven at the failing
ops as a move of those tensors is (``atop``); a tensor with no such line keeps the fix it had.
"""

from __future__ import annotations

import ast
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._placement import device_str, norm_device, tensor_device
from torchdoctor._virtual.hookleft import parsed as _parsed, short_file as _short
from torchdoctor._virtual.prove import Fix

__all__ = ["bare_use_fixes", "placement_of"]


class Placement:
    """How the program places its model layer by layer: what it is (said in a fix), the layers it places, and the
    app's per-call helper (a function, its call in a cast layer's forward, that forward's own and input names)."""

    __slots__ = ("said", "layers", "helper", "hooks", "pre")

    def __init__(self, said: str, layers: set[int], helper: tuple[Any, ast.Call, str, str] | None,
                 hooks: bool = False, pre: Any = None) -> None:
        self.said, self.layers, self.helper, self.pre = said, layers, helper, pre  # pre: the program's pre-hook
        self.hooks = hooks  # a library's offload hooks place the modules: a tensor read outside its module's call


def placement_of(root: torch.nn.Module, device: torch.device) -> Placement | None:
    """The program's own per-layer placement of ``root`` (module doc), or None when it has none."""
    from torchdoctor._scan import percall
    from torchdoctor._walk.kinds import group_offloading

    hooked, casting, grouped, placed = [], [], [], 0
    for mod in root.modules():
        d = mod.__dict__
        if group_offloading(d.get("_diffusers_hook")):
            grouped.append(mod)
        own = [t for t in (d.get("_parameters") or {}).values() if t is not None]
        if "forward" not in d and any(not _torch_own(h) for h in dict.values(d.get("_forward_pre_hooks") or {})) \
                and (own or d.get("_modules")):
            hooked.append(mod)
        elif not own:
            continue
        elif percall.moved_on_call(mod).get("weight", 0) & percall.DEVICE:
            casting.append(mod)
        elif norm_device(tensor_device(own[0])) == device:
            placed += 1
    if grouped:
        return Placement(f"diffusers' group offloading onloads {len(grouped)} of its modules only while each one "
                         "runs", {id(m) for m in grouped}, None, hooks=True)
    if len(hooked) >= 2:
        hook = next(h for h in dict.values(hooked[0].__dict__["_forward_pre_hooks"]) if not _torch_own(h))
        code = getattr(hook, "__code__", None) or getattr(getattr(hook, "__call__", None), "__code__", None)
        at = f" ({_short(code.co_filename)}:{code.co_firstlineno})" if isinstance(code, types.CodeType) else ""
        return Placement(f"forward pre-hooks{at} place {len(hooked)} of its layers per call",
                         {id(m) for h in hooked for m in h.modules()}, None, pre=hook)
    if casting:
        off = [norm_device(tensor_device(w)) for m in casting if isinstance(w := getattr(m, "weight", None),
                                                                                 torch.Tensor)]
        where = ", ".join(sorted({device_str(d) for d in off if d != device})) or device_str(device)
        names = sorted({type(m).__name__ for m in casting})
        said = (f"its layers are placed one by one: {placed} on {device_str(device)}, {len(casting)} left on {where} "
                f"casting their weights per call ({', '.join(names[:3])})")
        return Placement(said, {id(m) for m in casting}, _helper(casting))
    return None


def _torch_own(hook: Any) -> bool:
    """A hook of torch's own (``weight_norm``'s recompute, FSDP's gather): no placement of the program's."""
    return str(getattr(hook, "__module__", None) or type(hook).__module__).startswith("torch.")


def _helper(layers: list[torch.nn.Module]) -> tuple[Any, ast.Call, str, str] | None:
    """The app's function a cast layer's forward (or the method of its own it calls) moves its ``self.weight`` with
    (``cast_to(self.weight, x.device, x.dtype)``), when its other arguments read only the input; else, when it hands
    itself to a function (``cast_bias_weight(self, input)``), that function's module's helper of a tensor and an
    input (``cast_to_input(weight, input)``): (the function, its call, the forward's own name, its input's name)."""
    for tp in dict.fromkeys(type(m) for m in layers):
        fwd = next((k.__dict__["forward"] for k in tp.__mro__ if "forward" in k.__dict__), None)
        tree = _parsed(fwd)
        if tree is None or not isinstance(fwd, types.FunctionType):
            continue
        me = fwd.__code__.co_varnames[0] if fwd.__code__.co_argcount else "self"
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        inner = [getattr(tp, n.func.attr, None) for n in calls if isinstance(n.func, ast.Attribute)
                 and isinstance(n.func.value, ast.Name) and n.func.value.id == me]
        for fn in (fwd, *(f for f in inner if isinstance(f, types.FunctionType))):
            hit = _weight_call(fn)
            if hit is not None:
                return hit
    return None


def _weight_call(fn: types.FunctionType) -> tuple[Any, ast.Call, str, str] | None:
    tree = _parsed(fn)
    if tree is None or fn.__code__.co_argcount < 2:
        return None
    me, x = fn.__code__.co_varnames[:2]
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call) or not n.args or not isinstance(n.func, (ast.Name, ast.Attribute)):
            continue
        first = ast.unparse(n.args[0])
        rest = [*n.args[1:], *(k.value for k in n.keywords)]
        got = _resolve(ast.unparse(n.func), fn.__globals__)
        if first == f"{me}.weight" and isinstance(got, types.FunctionType) and not any(
                isinstance(v, ast.Name) and v.id == me for a in rest for v in ast.walk(a)):
            return got, n, me, x
        if first == me and isinstance(got, types.FunctionType) and any(ast.unparse(a) == x for a in rest):
            helper = _input_helper(got.__globals__)  # handed the layer itself: its module's tensor-and-input helper
            if helper is not None:
                call = ast.Call(ast.Name(helper.__name__, ast.Load()), [ast.parse(f"{me}.weight", mode="eval").body,
                                                                        ast.Name(x, ast.Load())], [])
                return helper, call, me, x
    return None


def _input_helper(names: dict[str, Any]) -> types.FunctionType | None:
    """The one function of a module taking a tensor and an input whose body reads the input's device and dtype
    (``cast_to_input(weight, input)``), as the helper a model's own tensors are cast with."""
    found = []
    for v in list(names.values()):
        if not isinstance(v, types.FunctionType) or v.__globals__ is not names or v.__code__.co_argcount < 2:
            continue
        w, t = v.__code__.co_varnames[:2]
        tree = _parsed(v)
        reads = [(n.value.id, n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                 and isinstance(n.value, ast.Name)] if tree is not None else []
        if {(t, "device"), (t, "dtype")} <= set(reads) and not {(w, "weight"), (w, "bias")} & set(reads):
            found.append(v)  # a layer helper reads its first argument's weight: that one takes a tensor
    return found[0] if len(found) == 1 else None


def _resolve(text: str, names: dict[str, Any]) -> Any:
    parts = text.split(".")
    obj = names.get(parts[0])
    for p in parts[1:]:
        obj = inspect_static(obj, p)
    return obj


def inspect_static(obj: Any, name: str) -> Any:
    import inspect

    try:
        return inspect.getattr_static(obj, name, None)
    except Exception:  # an odd object: not followed
        return None


def bare_use_fixes(items: list[Fix], root: Any, device: torch.device, cases: Sequence[Any]) -> list[Fix]:
    """``items`` with each move of model tensors that the program's per-layer placement never moves replaced by the
    fix at the lines that use them (module doc), and under a library's offload hooks each move of a module's own
    tensor that a line reads outside that module's call; the others as they were."""
    if not cases or not isinstance(root, torch.nn.Module) or not any(f.sets for f in items):
        return items
    placed = placement_of(root, norm_device(device))
    if placed is None:
        return items
    out: list[Fix] = []
    for f in items:
        new = _at_uses(f, root, placed, cases) if f.kind == "path" and f.sets and not placed.hooks else None
        if new is None and placed.hooks and f.sets:
            new = _read_outside(f, root, placed, cases)
        if new is None and placed.pre is not None and f.kind == "path" and f.sets:
            from torchdoctor._virtual.hookleft import left_by_hook

            new = left_by_hook(f, root, placed.layers, placed.pre, placed.said)
        out.extend(new or [f])
    return out


Use = tuple[str, Any, Any, Any]  # (the attribute's name, the operand off the device, the name on it, the dtype to meet)


def _meeting(c: Any, wrong: Any, target: torch.device) -> tuple[Any, Any] | None:
    """(a name the failing line holds on ``target``, its operand at the op) for operand ``wrong`` of case ``c``."""
    from torchdoctor._virtual.feeder import operands

    partner = next((n for n in c.names if norm_device(n.device) == target), None)
    if partner is None:
        return None
    ops = operands(c.before)  # the dtype it must meet: the partner's at the op, else the op's other operand's there
    like = next((o for o in ops if f"operand {partner.name} at {c.at}" in o.tags), None) or next(
        (o for o in ops if o is not wrong and norm_device(o.device) == target and o.meta.dtype.is_floating_point), None)
    return partner, like.meta.dtype if like is not None else None


def _at_uses(f: Fix, root: torch.nn.Module, placed: Placement, cases: Sequence[Any]) -> list[Fix] | None:
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._virtual.feeder import operands

    sites: dict[tuple[str, int], list[tuple[str, Use]]] = {}
    for path, target in f.sets:
        if not isinstance(target, torch.device) or not _bare(root, path, placed):
            return None
        hit = None
        for c in cases:
            if c.line is None or not own_file(c.line[0]):
                continue
            wrong = next((o for o in operands(c.before) if o.tags[:1] == (path,) and norm_device(o.device) != target),
                         None)
            met = _meeting(c, wrong, target) if wrong is not None else None
            if met is not None:
                hit = (c, (path.rpartition(".")[2], wrong, *met))
                break
        if hit is None:
            return None
        sites.setdefault(hit[0].line, []).append((path, hit[1]))
    out: list[Fix | None] = []
    for (file, line), uses in sites.items():
        paths = list(dict.fromkeys(p for p, _ in uses))
        owner = type(root.get_submodule(paths[0].rpartition(".")[0])).__name__
        how = "cast with the app's own per-call helper" if placed.helper is not None and \
            _callee(placed.helper[0], file) is not None else "moved to the device of what it meets"
        why = (f"{', '.join(paths)} ({owner}'s own) meet{'s' if len(paths) == 1 else ''} tensors on "
               f"{{device}}; {placed.said}, and nothing moves what no layer owns: {how} where it is used (moving "
               "the whole model would undo that placement)")
        out.append(_fix_line(file, line, [u for _, u in uses], placed, why, tuple((p, uses[0][1][2].device) for p in paths)))
    return None if any(x is None for x in out) else [x for x in out if x is not None]


def _read_outside(f: Fix, root: torch.nn.Module, placed: Placement, cases: Sequence[Any]) -> list[Fix] | None:
    """Under offload hooks: the operands ``f`` moves that a line of the program reads as a module's own tensor
    outside that module's call (``x + block.gate * block(x)``), moved at that line to what they meet there."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._virtual.feeder import operands

    target = f.sets[0][1]
    if not isinstance(target, torch.device):
        return None
    def named(o: Any) -> bool:
        return any(n in o.tags or n.endswith(".") and any(t.startswith(n) for t in o.tags) for n, _ in f.sets)

    own = [c for c in cases if c.line is not None and own_file(c.line[0])]
    lines = {c.line for c in own for o in operands(c.before) if norm_device(o.device) != target and named(o)}
    sites: dict[tuple[str, int], list[tuple[str, Use]]] = {}
    sets = list(f.sets)
    for c in (c for c in own if c.line in lines):  # the same read met again (the next block's): fixed alike
        for o in operands(c.before):
            if norm_device(o.device) == target or o.device.type == "meta" or not o.tags:
                continue
            leaf = _leaf_on_line(c.line, o, root, placed)
            met = _meeting(c, o, target) if leaf is not None else None
            if leaf is None or met is None:
                if named(o):
                    return None
                continue
            sets.append((o.tags[0], target))
            if all(u[1][0] != leaf[0] for u in sites.get(c.line, [])):
                sites.setdefault(c.line, []).append((leaf[1], (leaf[0], o, *met)))
    out: list[Fix | None] = []
    for (file, line), uses in sites.items():
        owners = ", ".join(dict.fromkeys(w for w, _ in uses))
        why = (f"this line reads {owners}'s own {', '.join(u[0] for _, u in uses)} outside its call, and "
               f"{placed.said}: it is on {{found}} here; moved where it is used (moving the whole model would undo "
               "the offload)")
        out.append(_fix_line(file, line, [u for _, u in uses], placed, why, tuple(dict.fromkeys(sets))))
    return None if not out or any(x is None for x in out) else [x for x in out if x is not None]


def _leaf_on_line(where: tuple[str, int], o: Any, root: torch.nn.Module, placed: Placement) -> tuple[str, str] | None:
    """(the attribute name, its owner's class) of the one attribute the line reads that names a Parameter or
    buffer of a module the hooks place, with operand ``o``'s shape, dtype and device; None when not one."""
    from torchdoctor._virtual.ownline import own_line

    here = own_line(*where)
    if here is None:
        return None
    attrs = {n.attr for n in ast.walk(here[2]) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)}
    hits = {(k, type(m).__name__) for m in root.modules() if id(m) in placed.layers
            for store in ("_parameters", "_buffers") for k, t in (m.__dict__.get(store) or {}).items()
            if k in attrs and t is not None and tuple(t.shape) == tuple(o.meta.shape) and t.dtype == o.meta.dtype
            and norm_device(tensor_device(t)) == norm_device(o.device)}
    return next(iter(hits)) if len(hits) == 1 else None


def _bare(root: torch.nn.Module, path: str, placed: Placement) -> bool:
    """``path`` is a Parameter or buffer of a module the placement never places."""
    owner, _, leaf = path.rpartition(".")
    try:
        mod = root.get_submodule(owner)
    except AttributeError:
        return False
    d = mod.__dict__
    return id(mod) not in placed.layers and (leaf in (d.get("_parameters") or {}) or leaf in (d.get("_buffers") or {}))


def _fix_line(file: str, line: int, uses: list[Use], placed: Placement, why: str,
              sets: tuple[tuple[str, Any], ...]) -> Fix | None:
    """The line with each attribute ``uses`` names moved (``_moved``); ``why`` is said after it (``{device}``: the
    run's, ``{found}``: where the tensor was)."""
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.ownline import own_line

    here = own_line(file, line)
    if here is None:
        return None
    _, body, tree = here
    spans: dict[tuple[int, int], str] = {}
    target = uses[0][2].device
    cast: torch.dtype | None = None
    for leaf, wrong, partner, need in uses:
        found = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == leaf
                 and isinstance(n.ctx, ast.Load)]
        if len({(n.col_offset, n.end_col_offset) for n in found}) != 1 or found[0].end_col_offset is None:
            return None
        n, end = found[0], found[0].end_col_offset
        dtype = need if need is not None and need != wrong.meta.dtype and need.is_floating_point and \
            wrong.meta.dtype.is_floating_point and getattr(partner, "dtype", None) == need else None
        cast = cast or dtype
        spans[(n.col_offset, end)] = _moved(ast.unparse(n), partner.name, dtype, placed, file)
    new = body
    for (a, b), text in sorted(spans.items(), reverse=True):
        new = new[:a] + text + new[b:]
    diff = line_patch(file, line, new)
    if diff is None:
        return None
    said = why.format(device=device_str(target), found=device_str(uses[0][1].device))
    if cast is not None:  # the dtype the line casts to is part of what the proof applies
        sets = (*sets, *((k, cast) for k, t in sets if isinstance(t, torch.device)))
    return Fix(f"{new}  # at {_short(file)}:{line}: {said}", "note", target, sets=sets, diff=diff)


def _moved(expr: str, partner: str, dtype: torch.dtype | None, placed: Placement, file: str) -> str:
    """``expr`` (``self.scale1``) brought to ``partner``'s device (and dtype), as the app's helper does it."""
    if placed.helper is not None:
        fn, call, me, x = placed.helper
        callee = _callee(fn, file)
        if callee is not None:
            new = _Swap(x, partner).visit(ast.parse(ast.unparse(call), mode="eval").body)
            new.func = ast.parse(callee, mode="eval").body
            new.args[0] = ast.parse(expr, mode="eval").body
            return ast.unparse(new)
    return f"{expr}.to({partner}.device, {partner}.dtype)" if dtype is not None else f"{expr}.to({partner}.device)"


class _Swap(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(self.new, node.ctx) if node.id == self.old else node


def _callee(fn: types.FunctionType, file: str) -> str | None:
    """How the code of ``file`` names function ``fn``: a global of its module bound to it, or to a module that has
    it (``ops.cast_to``); None when it has no name for it."""
    real = os.path.realpath(file)
    mod = next((m for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)
                and os.path.realpath(f) == real), None)
    names = vars(mod) if mod is not None else {}
    hit = next((k for k, v in names.items() if v is fn), None)
    if hit is not None:
        return hit
    return next((f"{k}.{fn.__name__}" for k, v in names.items() if isinstance(v, types.ModuleType)
                 and inspect_static(v, fn.__name__) is fn), None)

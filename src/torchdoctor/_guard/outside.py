"""A placement error raised inside ``with guard(...)`` but outside any module's forward (a loss built from a
``.float()`` mask, user code combining the model's output with a tensor it made): explained at the user's line,
with the tensors that line holds and the conversion it makes, never passed through unexplained."""

from __future__ import annotations

import ast
import linecache
import operator
import os
import re
import types
from typing import Any

import torch

from torchdoctor._placement import device_str, dtype_str
from torchdoctor._report.model import PlacementError, Problem, TensorInfo
from torchdoctor._report.text import format_error
from torchdoctor._rules import registry as _rules
from torchdoctor._explain.tokens import dtypes_in
from torchdoctor._guard.remedy import aimed, own_file, with_patch
from torchdoctor._guard.useline import destination, fixed_line, grads_in
from torchdoctor._report.diff import line_patch

_TORCH = os.path.dirname(torch.__file__)
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# conversions written in the line that make a dtype or device of their own: `mask.float()`, `x.cpu()`
_CONVERTS = re.compile(r"([A-Za-z_][\w.\[\]'\"]*)\.(float|double|half|bfloat16|cpu|cuda)\(\)")
# a dispatch or function mode's hook raising the op's error is torch's machinery, not the line that called the op
_MODES = ("__torch_dispatch__", "__torch_function__")
_ASKED = re.compile(r"expected dtype (\w+) for `\w+`")  # lerp_, addcmul_ ...: the dtype the op itself requires
_MADE = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}


def user_frame(tb: types.TracebackType | None) -> tuple[types.FrameType, int] | None:
    """The innermost frame of the traceback in the user's code (not torch, not torchdoctor), with its line."""
    out = None
    while tb is not None:
        name = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not name.startswith((_TORCH, _HERE)) and tb.tb_frame.f_code.co_name not in _MODES:
            out = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    return out


def explain_outside(exc: BaseException, tb: types.TracebackType | None, kind: str, maps: Any,
                    mentioned: set[Any]) -> tuple[PlacementError, str | None] | None:
    """The report of an error raised at the user's line outside any module, and its makers' lines (or None)."""
    found_frame = user_frame(exc.__traceback__ or tb)
    if found_frame is None:
        return None
    frame, lineno = found_frame
    where = f"{os.path.basename(frame.f_code.co_filename)}:{lineno}"
    source = linecache.getline(frame.f_code.co_filename, lineno).strip()
    dtype = kind in ("dtype", "unsupported_dtype")

    def value(t: torch.Tensor) -> Any:
        return t.dtype if dtype else _rules._norm(_rules.tensor_device(t))

    def show(v: Any) -> str:
        return dtype_str(v) if isinstance(v, torch.dtype) else device_str(v)

    used = set(re.findall(r"[A-Za-z_]\w*", source))  # the line's own names: a stale local is not an operand
    # a local read only as the base of `p.grad` is no operand: its gradient is (an optimizer's loop)
    grads = grads_in(source, frame)
    named = [(n, v) for n, v in frame.f_locals.items() if isinstance(v, torch.Tensor) and n in used and not (
        any(g == f"{n}.grad" for g, _ in grads) and not re.search(rf"(?<![\w.]){re.escape(n)}\b(?!\.grad\b)", source))]
    named += grads
    pool = [(n, t) for n, t in named if not dtype or t.is_floating_point()]
    ref = (maps.dtype if dtype else maps.device) if maps is not None else None
    values = [value(t) for _, t in pool]
    if ref is None or (ref not in values and ref not in mentioned):
        ref = max(values, key=values.count) if values else ref
    asked = _ASKED.search(str(exc)) if dtype else None  # the op's own demand (an in-place op into float32 state)
    if asked and dtypes_in(asked.group(1)):
        ref = getattr(torch, dtypes_in(asked.group(1))[0], ref)
    bad = [(n, t) for n, t in pool if ref is not None and value(t) != ref]
    if dtype and isinstance(ref, torch.dtype):  # integer / float8 storage the line computes with directly
        from torchdoctor._guard.storageuse import storage_report, stored_reads

        if reads := stored_reads(source, frame):
            return storage_report(exc, frame, lineno, source, reads, ref, maps, pool), None
    converts = [(m.group(1), m.group(2)) for m in _CONVERTS.finditer(source)]
    converts = [(e, c) for e, c in converts if (c in _MADE) == dtype and _MADE.get(c, None) != ref]
    found = ", ".join(dict.fromkeys(show(value(t)) for _, t in bad)) or (
        ", ".join(dict.fromkeys(dtype_str(_MADE[c]) if c in _MADE else c for _, c in converts)) or None)
    expected = show(ref) if ref is not None else "?"
    head = f"{kind} mismatch outside the guarded model, at {where}" + (
        f": {found} where {expected} was expected" if found else "")
    lines = [f"line: {source}"] if source else []
    lines += [f"culprit {e}.{c}() makes {dtype_str(_MADE[c]) if c in _MADE else c}" for e, c in converts]
    lines += [f"culprit {n}: {_rules._compact(t)}  (expected {expected})" for n, t in bad]
    lines += [f"{n}: {_rules._compact(t)}" for n, t in pool if (n, t) not in bad][:6]
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lines.append(f"original error: {type(exc).__name__}: {first}")
    target = f"torch.{dtype_str(ref)}" if isinstance(ref, torch.dtype) else repr(show(ref)) if ref is not None else None
    fix_lines = [f"# {e}.{c}() -> {e}.to({target})" for e, c in converts if target is not None]
    # the maker of each wrong tensor the line names (a factory, a cast, a schedule table it was indexed from):
    # the fix is aimed at that line, as inside a module (_guard/remedy.py)
    aim = _aim(bad, kind, ref, maps, exc.__traceback__ or tb) if bad and ref is not None else None
    twin = _twin(aim, frame) if dtype and aim is not None and aim.makers else None
    if twin is not None:  # the user's own cast into the call is meant: the operand left beside it is the culprit
        return _twin_report(exc, where, source, aim, *twin)
    use = fixed_line(frame, lineno, [n for n, _ in bad], ref) if dtype and bad and isinstance(ref, torch.dtype) \
        and not (aim is not None and aim.code) else None  # no maker to fix: the line that passes them, cast there
    if aim is not None and aim.code:
        fix_lines.append(aim.code)
    made = {x.split(" made by ", 1)[0] for x in (aim.lines if aim is not None else [])}
    fix_lines += [f"{use[0].strip()}  # {where}"] if use else [f"# pass {n} as {n}.to({target})" for n, _ in bad if
                                                              target is not None and not (aim is not None and aim.code
                                                                                          and n in made)]
    fix = "\n".join(dict.fromkeys(fix_lines)) or None
    makers = (list(aim.lines) if aim is not None else []) + (destination(frame, lineno, exc.__traceback__ or tb)
                                                              if dtype else [])
    if dtype:  # a cast in a helper that has returned (`update = zeropower(m)`, its `return x.float()`)
        makers += _returned(frame, [(n, t) for n, t in bad if not any(x.startswith(f"{n} ") for x in makers)], lineno)
    lines[-1:-1] = makers
    if fix is not None:  # the line's operator re-run on its operands with the fix applied (copies)
        lines.insert(-1, use[1] if use else _reprove(source, frame, bad, ref))
    problems = [Problem(kind, f"{e}.{c}()", "input", dtype_str(_MADE[c]) if c in _MADE else c, expected,
                        f"{e}.{c}() at {where} makes {dtype_str(_MADE[c]) if c in _MADE else c}, expected {expected}")
                for e, c in converts]
    problems += [Problem(kind, n, "input", show(value(t)), expected, f"{n} is {show(value(t))} at {where}, "
                         f"expected {expected}") for n, t in bad]
    err = PlacementError(format_error(head, lines, fix), module_path=None, module_type=None, op=None,
                         tensors=[TensorInfo.of(n, t, role="input") for n, t in bad], problems=problems, fix=fix)
    patch = aim.patch if aim is not None else line_patch(use[2], lineno, use[0]) if use and own_file(use[2]) else None
    return with_patch(err, patch, lines), "\n".join(makers) or None


def _returned(frame: types.FrameType, bad: list[tuple[str, torch.Tensor]], lineno: int) -> list[str]:
    from torchdoctor._guard.returned import returned_maker

    out = []
    for n, t in bad:
        try:
            said = returned_maker(frame, n, lineno, t.dtype)
        except Exception:  # naming the maker is extra
            said = None
        if said:
            out.append(said)
    return out


def _aim(bad: list[tuple[str, torch.Tensor]], kind: str, ref: Any, maps: Any, tb: Any) -> Any:
    """The makers of the line's wrong tensors, read from the user's frames (never by running them)."""
    try:
        return aimed([(n, t) for n, t in bad], kind, ref, maps.modules if maps is not None else {},
                     maps.dicts if maps is not None else (), None, tb)
    except Exception:  # naming the maker is extra: the failure is explained without it
        return None


_OPS: dict[type, Any] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                         ast.Div: operator.truediv, ast.MatMult: operator.matmul, ast.Pow: operator.pow}


def _reprove(source: str, frame: types.FrameType, bad: list[tuple[str, torch.Tensor]], ref: Any) -> str:
    """"fix proven" when the line's own operator (``latents * sigma``, ``out @ w``) on names the frame holds runs
    again with the wrong tensors aligned to ``ref`` (new tensors; the user's stay as they are); "fix unproven"
    with what was tried, or why nothing was."""
    wrong = {n: t for n, t in bad}
    why = "no operator of two named tensors on the line to re-run"
    try:
        tree = ast.parse(source.rstrip(":").strip())
    except SyntaxError:
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if not (isinstance(node, ast.BinOp) and type(node.op) in _OPS and isinstance(node.left, ast.Name)
                and isinstance(node.right, ast.Name) and {node.left.id, node.right.id} & set(wrong)):
            continue
        a, b = frame.f_locals.get(node.left.id), frame.f_locals.get(node.right.id)
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        text = ast.unparse(node)
        tried = ", ".join(f"{n} -> {dtype_str(ref) if isinstance(ref, torch.dtype) else device_str(ref)}"
                          for n in (node.left.id, node.right.id) if n in wrong)
        try:
            with torch.no_grad():
                _OPS[type(node.op)](*(t.to(ref) if n in wrong else t for n, t in ((node.left.id, a),
                                                                                  (node.right.id, b))))
        except Exception as exc:  # the trial's own failure is the answer
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return f"fix unproven: `{text}` re-run with {tried}: {type(exc).__name__}: {first}"[:400]
        return f"fix proven: `{text}` runs again with {tried}"
    return f"fix unproven: not re-run ({why})"


def _twin(aim: Any, frame: types.FrameType) -> tuple[str, torch.Tensor, Any, str, str] | None:
    """A cast the user wrote on one operand of a call (``F.huber_loss(noise_pred.float(), target)``, the loss
    computed in float32 on purpose) beside an operand left in another dtype (``target``, bf16): that operand is the
    culprit and the fix casts it the same way at that line (``target.float()``), never undoing the user's cast.
    (name, tensor, the maker, the fixed line, the proof), or None."""
    m = aim.makers[0]
    method = m.op[1:-2] if m.op.startswith(".") and m.op.endswith("()") else ""
    if method not in _MADE or m.span is None or frame.f_code.co_filename != m.file or not own_file(m.file):
        return None
    raw = linecache.getline(m.file, m.line).rstrip("\r\n")
    shift = len(raw) - len(raw.lstrip())
    try:
        tree = ast.parse(raw.strip())
    except SyntaxError:
        return None
    want = _MADE[method]
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        given = [*call.args, *(k.value for k in call.keywords)]
        if not any(isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr == method
                   and not a.args and a.col_offset + shift == m.span[0] for a in given):
            continue
        for a in given:
            if not isinstance(a, ast.Name):
                continue
            t = frame.f_locals.get(a.id)
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != want and a.end_col_offset:
                new = raw[:a.col_offset + shift] + f"{a.id}.{method}()" + raw[a.end_col_offset + shift:]
                return a.id, t, m, new, _prove_twin(call, a.id, method, frame)
    return None


def _prove_twin(call: ast.Call, name: str, method: str, frame: types.FrameType) -> str:
    """The call run again forward and backward on copies (leaves that need grad) with ``name`` cast too: only when
    the function is torch's own (``F.huber_loss``), its arguments names, casts and literals."""
    fixed = f"`{ast.unparse(call)}` with {name}.{method}()"
    fn: Any = frame.f_locals.get(call.func.id, frame.f_globals.get(call.func.id)) if isinstance(
        call.func, ast.Name) else None
    if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
        owner = frame.f_locals.get(call.func.value.id, frame.f_globals.get(call.func.value.id))
        fn = getattr(owner, call.func.attr, None) if isinstance(owner, types.ModuleType) else None
    if fn is None or not (getattr(fn, "__module__", "") or "").startswith("torch"):
        return f"fix unproven: not re-run ({ast.unparse(call.func)} is not torch's own function)"

    def value(node: ast.expr, cast: bool = False) -> Any:
        if isinstance(node, ast.Name) and isinstance(frame.f_locals.get(node.id), torch.Tensor):
            t = frame.f_locals[node.id].detach().clone()
            t = getattr(t, method)() if cast or node.id == name else t
            return t.requires_grad_(True) if t.is_floating_point() else t
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method \
                and not node.args:
            return value(node.func.value, cast=True)
        return ast.literal_eval(node)

    try:
        out = fn(*(value(a) for a in call.args), **{k.arg: value(k.value) for k in call.keywords if k.arg})
        out.float().sum().backward()
    except Exception as err:  # the trial's own failure is the answer
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"fix unproven: {fixed} on copies: {type(err).__name__}: {first}"[:400]
    return f"fix proven: {fixed} runs forward and backward on copies"


def _twin_report(exc: BaseException, where: str, source: str, aim: Any, name: str, t: torch.Tensor, m: Any,
                 new: str, proof: str) -> tuple[PlacementError, str | None]:
    want = dtype_str(_MADE[m.op[1:-2]])
    at = f"{os.path.basename(m.file)}:{m.line}"
    head = f"dtype mismatch outside the guarded model, at {where}: {dtype_str(t.dtype)} where {want} was expected"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lines = ([f"line: {source}"] if source else []) + [
        f"culprit {name}: {_rules._compact(t)}  (expected {want}: it meets `{m.op}` at {at}, a cast written on "
        f"purpose, in the same call)", *aim.lines, proof, f"original error: {type(exc).__name__}: {first}"]
    fix = f"{new.strip()}  # {at}"
    problem = Problem("dtype", name, "input", dtype_str(t.dtype), want, f"{name} is {dtype_str(t.dtype)} at {at}, "
                      f"beside the {want} the line casts to on purpose; expected {want}")
    err = PlacementError(format_error(head, lines, fix), module_path=None, module_type=None, op=None,
                         tensors=[TensorInfo.of(name, t, role="input")], problems=[problem], fix=fix)
    return with_patch(err, line_patch(m.file, m.line, new), lines), "\n".join(aim.lines) or None


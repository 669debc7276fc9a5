"""A raised dtype error with no culprit and no fix (the odd operand is no float the policy compares: integer data
where floats are needed, float indices, a list of tensors handed to ``torch._foreach_*``): when the program's own line
that raised passes that operand as a plain local name to a module call or a torch function, the fix is that line
with that name cast there, in the program's own names:

- integer data into a layer (uint8 pixels into a ``Conv2d``): ``stem(pixels.float())``, cast to the dtype the layer
  computes in (a note says uint8 image data is usually scaled too, ``/ 255``);
- floating indices into an embedding or an index op: ``emb(ids.long())``;
- a list whose tensors are in another dtype than the op asks (``expected dtype c10::BFloat16 for `end```):
  ``[p.to(torch.bfloat16) for p in model_params]``.

The fix is proven by calling the failing module (a copy) or torch's own function on copies of what the line passes,
once as it is (it must fail: this is the call that raised) and once with the cast (it must run); it is offered as a
diff of that line. Nothing is printed that names a variable the line does not hold: where no call qualifies, the
report is left as it was.
"""

from __future__ import annotations

import ast
import linecache
import logging
import os
import re
import types
from typing import Any

import torch
from torch import nn

from torchdoctor._guard.rawmaker import _chain, _lookup, _shown, _tensors, bound_at
from torchdoctor._placement import dtype_str

_INDICES = re.compile(r"'indices'|\bindices\b|Long, Int|scalar type Long|expected scalar type Long|index",
                      re.IGNORECASE)
_INTEGER = re.compile(r"unsigned char|\b(?:char|short|long|int|Byte|Char|Short|Long|Int)\b")  # C++'s names
_ASKED = re.compile(r"expected dtype (\S+) for `(\w+)`")
_MODES = ("__torch_dispatch__", "__torch_function__")
_BIG = 256 << 20  # a module over this many bytes is not copied for a proof


def amend(session: Any, exc: BaseException, tb: Any, err: Any) -> Any:
    """``err`` (guard's report of ``exc``, or None) with the fix at the program's line when it has none; else
    ``err`` as it is. Never raises."""
    try:
        if err is not None and (getattr(err, "fix", None) or getattr(err, "patch", None)):
            return err
        new = _report(session, exc, tb, err)
    except Exception:  # the fix is extra: the report stays as diagnose made it
        logging.getLogger("torchdoctor.guard").debug("rawarg failed", exc_info=True)
        return err
    if new is None:
        return err
    out, problems, note = new
    try:
        session.g._record_problems(problems)
        session.g._note(problems, note)
    except Exception:  # bookkeeping is extra
        pass
    return out


def _own_frame(tb: Any) -> tuple[Any, int] | None:
    from torchdoctor._guard.ownfile import own_file

    found = None
    while tb is not None:
        f = tb.tb_frame
        if f.f_code.co_name not in _MODES and own_file(f.f_code.co_filename):
            found = f, tb.tb_lineno
        tb = tb.tb_next
    return found


def _resolve(chain: list[str], frame: Any) -> Any:
    """The object a dotted name reads, through instance dicts, submodules and modules only (never a property)."""
    obj = _lookup(frame, chain[0])
    for attr in chain[1:]:
        if isinstance(obj, types.ModuleType):
            obj = getattr(obj, attr, None)
        elif isinstance(obj, nn.Module):
            obj = obj._modules.get(attr, obj.__dict__.get(attr))
        elif obj is not None and attr in getattr(obj, "__dict__", {}):
            obj = obj.__dict__[attr]
        else:
            return None
    return obj


def _torch_fn(fn: Any) -> bool:
    mod = getattr(fn, "__module__", None) or ""
    return callable(fn) and not isinstance(fn, (nn.Module, type)) and (
        mod.startswith("torch") or getattr(fn, "__self__", None) is not None and
        type(getattr(fn, "__self__", None)).__module__.startswith("torch"))


def _float_dtype(mod: nn.Module) -> torch.dtype | None:
    for t in (*mod.parameters(), *mod.buffers()):
        if t.is_floating_point():
            return t.dtype
    return None


def _free_name(frame: Any, text: str) -> str:
    for n in ("p", "t", "x", "item"):
        if n not in frame.f_locals and n not in frame.f_globals and not re.search(rf"\b{n}\b", text):
            return n
    return "t_"


def _odd(value: Any, message: str, callee: Any) -> tuple[str, Any, str] | None:
    """(how the name is cast, the target dtype, what it is said to be) for an argument the message's op refuses."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and _INDICES.search(message):
            return "long", torch.int64, "floating-point indices"
        if not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool \
                and not _INDICES.search(message) and _INTEGER.search(message):  # the error names integer data
            want = _float_dtype(callee) if isinstance(callee, nn.Module) else None
            if want is None:
                from torchdoctor._guard.message import mentioned

                named = [d for d in mentioned(message, "dtype") if d.is_floating_point]
                want = named[0] if len(named) == 1 else None
            return ("cast", want, "integer data") if want is not None else None
        return None
    items = _tensors(value)
    asked = _ASKED.search(message)
    if items is not None and asked:
        from torchdoctor._explain.tokens import dtypes_in

        names = dtypes_in(asked.group(1))
        want = getattr(torch, names[0], None) if names else None
        if isinstance(want, torch.dtype) and any(x.dtype != want for x in items):
            return "list", want, f"a list of {dtype_str(items[0].dtype)} tensors"
    return None


def _cast(name: str, how: str, want: Any, frame: Any, body: str) -> str:
    from torchdoctor._guard.useline import cast_text

    if how == "long":
        return f"{name}.long()"
    if how == "list":
        v = _free_name(frame, body)
        return f"[{v}.to(torch.{dtype_str(want)}) for {v} in {name}]" if "torch" in frame.f_globals else \
            f"[{cast_text(v, want)} for {v} in {name}]"
    return cast_text(name, want)


def _read(node: ast.expr, frame: Any) -> Any:
    """What the line passes at ``node``: a name's value as the frame holds it, else the expression run again by
    ``useline``'s small interpreter (torch's functions and tensor methods on copies, never ``eval``); None when it
    cannot be read."""
    if isinstance(node, ast.Name):
        return _lookup(frame, node.id) if node.id in frame.f_locals or node.id in frame.f_globals else None
    if isinstance(node, ast.Constant):
        return None
    if isinstance(node, ast.Attribute) and (chain := _chain(node)) is not None:  # ``self.ids``, ``batch.pixels``
        held = _resolve(chain, frame)
        if isinstance(held, torch.Tensor) or _tensors(held) is not None:
            return held
    from torchdoctor._guard import useline

    try:
        with torch.no_grad():
            return useline._eval(node, frame, set(), None)
    except Exception:  # not a value the interpreter reads: no operand of this rule
        return None


def _given(session: Any, fn: Any, call: ast.Call) -> dict[int, Any]:
    """The call's positional argument nodes (no starred one) with the inputs the running module ``fn`` got."""
    if not isinstance(fn, nn.Module) or any(isinstance(a, ast.Starred) for a in call.args):
        return {}
    try:
        inputs = tuple(session.frames.inputs_of(fn))
    except Exception:  # no record of the module's call
        return {}
    return {id(a): v for a, v in zip(call.args, inputs)} if len(inputs) == len(call.args) else {}


def _value(node: ast.expr, frame: Any, cast: dict[int, Any], known: dict[int, Any]) -> Any:
    """A copy of what the line passes at ``node`` (a name, an expression of torch calls, a constant), cast where
    ``cast`` (by node) says; else _NotRun."""
    if isinstance(node, ast.Constant):
        return node.value
    v = _read(node, frame)
    v = known.get(id(node)) if v is None else v
    if isinstance(v, torch.Tensor):
        v = v.detach().clone()
        return v.to(cast[id(node)]) if id(node) in cast else v
    if (items := _tensors(v)) is not None:
        out = [x.detach().clone() for x in items]
        return [x.to(cast[id(node)]) for x in out] if id(node) in cast else out
    if isinstance(v, (int, float, bool, str)):
        return v
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise _NotRun(ast.unparse(node)) from None


class _NotRun(Exception):
    pass


def _trial(call: ast.Call, fn: Any, frame: Any, cast: dict[int, Any], known: dict[int, Any]) -> BaseException | None:
    """Run the call once on copies (a module on a deep copy); its error, or None when it ran."""
    from torchdoctor._guard import trialcopy

    args = [_value(a, frame, cast, known) for a in call.args]
    kwargs = {k.arg: _value(k.value, frame, cast, known) for k in call.keywords if k.arg}
    target = fn
    if isinstance(fn, nn.Module):
        size = sum(t.numel() * t.element_size() for t in (*fn.parameters(), *fn.buffers()))
        if size > _BIG:
            raise _NotRun(f"{type(fn).__name__} is too large to copy")
        target = trialcopy.deepcopy(fn)
    try:
        with torch.no_grad():
            target(*args, **kwargs)
    except Exception as e:  # the trial's own failure is the answer
        return e
    return None


def _report(session: Any, exc: BaseException, tb: Any, err: Any) -> tuple[Any, list[Any], Any] | None:
    from torchdoctor._guard.message import kind_of, placement_category
    from torchdoctor._guard.ownfile import own_file

    message = str(exc)
    if placement_category(message) is None or kind_of(message) != "dtype":
        return None
    found = _own_frame(exc.__traceback__ or tb)
    if found is None:
        return None
    frame, lineno = found
    file = frame.f_code.co_filename
    raw = linecache.getline(file, lineno).rstrip("\r\n")
    body = raw.strip()
    if not body or not body.isascii() or not own_file(file):
        return None
    try:
        tree = ast.parse(body.rstrip(":") if body.endswith(":") else body)
    except SyntaxError:
        return None
    shift = len(raw) - len(raw.lstrip())
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        chain = _chain(call.func)
        fn = _resolve(chain, frame) if chain else None
        if not (isinstance(fn, nn.Module) or _torch_fn(fn)):
            continue
        spots = []
        given = _given(session, fn, call)  # a module's inputs as its call got them (``stem(load())``)
        for a in (*call.args, *(k.value for k in call.keywords)):
            v = _read(a, frame)
            if v is None and id(a) in given:
                v = given[id(a)]
            if (odd := _odd(v, message, fn)) is not None and a.end_col_offset is not None:
                spots.append((a, body[a.col_offset:a.end_col_offset], v, odd))
        if not spots:
            continue
        told = _told(exc, err, frame, file, lineno, raw, body, shift, call, fn, spots, given)
        if told is False:  # the cast was tried and did not clear the error: nothing to say of it
            return None
        if isinstance(told, tuple):
            return told
    return _unwritten(exc, err, f"{os.path.basename(file)}:{lineno}", body, message)


def _unwritten(exc: BaseException, err: Any, where: str, body: str, message: str) -> tuple[Any, list[Any], Any] | None:
    """No call of the line hands over an operand guard can read again and prove: the fix says so, unproven, in
    words (never explain's recipe, which names a ``t`` or an ``inputs`` the program lacks); None for other errors."""
    from torchdoctor._guard.message import mentioned
    from torchdoctor._guard.offer import with_patch
    from torchdoctor._guard.record import Note
    from torchdoctor._report.model import PlacementError
    from torchdoctor._report.text import format_error

    named = mentioned(message, "dtype")
    floats = sorted(dtype_str(d) for d in named if d.is_floating_point)
    asked = _ASKED.search(message)
    if _INDICES.search(message) and floats:
        what = "the floating-point indices to int64 (`.long()`)"
    elif (_INTEGER.search(message) or any(not d.is_floating_point and not d.is_complex and d != torch.bool
                                          for d in named)) and len(floats) == 1:
        what = f"the integer data to {floats[0]}"
    elif asked and "_foreach_" in body and len(floats) == 1:
        what = f"each tensor of the list the op reads as `{asked.group(2)}` to {floats[0]} (a list comprehension)"
    else:
        return None
    fix = f"# cast {what} where {where} hands it over (`{body}`); not written: no operand of that line is a name " \
          f"or a torch expression guard can read again"
    proof = "fix unproven: not re-run (the operand the op refused is not one guard can read from the line)"
    told = str(err).splitlines() if err is not None else [f"dtype mismatch at {where}"]
    lines = [x[2:] if x.startswith("  ") else x for x in told[1:] if not x.startswith("  original error:")]
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    lines += [] if f"line: {body}" in lines else [f"line: {body}"]
    lines += [proof, f"original error: {type(exc).__name__}: {first}"]
    problems = list(getattr(err, "problems", None) or [])
    out = PlacementError(format_error(told[0], lines, fix), module_path=getattr(err, "module_path", None),
                         module_type=getattr(err, "module_type", None), op=getattr(err, "op", None),
                         tensors=list(getattr(err, "tensors", None) or []), problems=problems, fix=fix)
    return with_patch(out, None, lines), problems, Note(None, fix, proof, None)


def _told(exc: BaseException, err: Any, frame: Any, file: str, lineno: int, raw: str, body: str, shift: int,
          call: ast.Call, fn: Any, spots: list[Any], known: dict[int, Any]
          ) -> tuple[Any, list[Any], Any] | bool | None:
    """The report of ``call`` at the line with ``spots`` (node, text, value, (how, dtype, what)) cast, when a copy of
    the call fails as the program's did (else None: not the call that raised; False: the cast does not clear it)."""
    from torchdoctor._guard.offer import with_patch
    from torchdoctor._guard.record import Note
    from torchdoctor._report.diff import line_patch
    from torchdoctor._report.model import PlacementError, Problem, TensorInfo
    from torchdoctor._report.text import format_error
    from torchdoctor._rules import registry as _rules

    where = f"{os.path.basename(file)}:{lineno}"
    callee = ast.unparse(call.func)
    label = f"{callee} ({type(fn).__name__})" if isinstance(fn, nn.Module) else f"`{callee}`"
    shown = f"`{ast.unparse(call)}`"
    try:
        before = _trial(call, fn, frame, {}, known)
        if before is None:  # this call runs as it is: not the one that raised
            return None
        # each odd operand alone first (``torch.gather(x, 1, idx)``: only ``idx`` is the index), then all of them
        after: BaseException | None = before
        for chosen in ([[s] for s in spots] if len(spots) > 1 else []) + [spots]:
            after = _trial(call, fn, frame, {id(a): odd[1] for a, _, _, odd in chosen}, known)
            if after is None:
                spots = chosen
                break
    except _NotRun as why:
        proof = f"fix unproven: {shown} not re-run ({why} is not a tensor, a list of tensors or a constant)"
    except Exception as e:  # a copy that cannot be made
        proof = f"fix unproven: {shown} not re-run: {type(e).__name__}: {str(e).strip()[:200]}"
    else:
        tried = ", ".join(f"{text} -> {dtype_str(odd[1])}" for _, text, _, odd in spots)
        if after is not None:  # the cast does not clear it: this is not the operand the op refused
            return False
        proof = f"fix proven: {shown} fails on copies of what the line passes and runs with {tried}"
    new = raw
    for a, text, _, (how, want, _) in sorted(spots, key=lambda s: s[0].col_offset, reverse=True):
        start, end = a.col_offset + shift, (a.end_col_offset or a.col_offset) + shift
        atom = text if isinstance(a, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)) else f"({text})"
        new = new[:start] + _cast(atom, how, want, frame, body) + new[end:]
    lines = [f"line: {body}"]
    problems = []
    makers = []
    for a, text, v, (how, want, what) in spots:
        items = _tensors(v)
        compact = _rules._compact(v) if isinstance(v, torch.Tensor) else \
            f"{len(items)} tensors, {_rules._compact(items[0])}, ..." if items else _shown(v)
        lines.append(f"culprit {text}: {compact}  ({what} handed to {label}, which needs {dtype_str(want)})")
        if isinstance(a, ast.Name) and (m := bound_at(frame, a.id, lineno, v)) is not None:
            makers.append(m)
        problems.append(Problem("dtype", text, "input", _shown(v), dtype_str(want),
                                f"{text} is {_shown(v)} at {where}, handed to {label}, expected {dtype_str(want)}",
                                op=getattr(err, "op", None), module_path=getattr(err, "module_path", None),
                                module_type=getattr(err, "module_type", None)))
    lines += makers
    for a, text, v, (how, want, _) in spots:
        if how == "cast" and isinstance(v, torch.Tensor) and v.dtype == torch.uint8:
            atom = text if isinstance(a, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)) else f"({text})"
            lines.append(f"note: uint8 image data is usually scaled as well: `{atom}.float() / 255` (the cast alone "
                         f"keeps the values 0..255)")
    lines.append(proof)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    lines.append(f"original error: {type(exc).__name__}: {first}")
    fix = f"{new.strip()}  # {where}"
    head = f"dtype mismatch at {where}: " + ", ".join(
        f"`{text}` ({_shown(v)}) handed to {label}, which needs {dtype_str(odd[1])}" for _, text, v, odd in spots)
    out = PlacementError(format_error(head, lines, fix), module_path=getattr(err, "module_path", None),
                         module_type=getattr(err, "module_type", None), op=getattr(err, "op", None),
                         tensors=[TensorInfo.of(text, v, role="input") for _, text, v, _ in spots
                                  if isinstance(v, torch.Tensor)],
                         problems=problems, fix=fix)
    out = with_patch(out, line_patch(file, lineno, new), lines)
    return out, problems, Note("\n".join(makers) or None, fix, out.proof, out.patch)

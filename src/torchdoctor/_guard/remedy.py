"""The fix for an operand made in a forward, aimed at its maker (``_guard.maker``): the attribute, class attribute or
config the dtype was read from, or the cast / factory line itself, as code to paste and, where that line is in the
user's own file, as a unified diff (``_report.diff.line_patch``).

A fix that changes where a dtype is read from is proven by running the module whose forward made the operand again
with the attribute set as the fix says (the attribute is put back whatever happens, and the guard's module stack is
left as it was): a cast of the operand alone proves nothing about the attribute that will make it again next call.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from torchdoctor._report.diff import line_patch
from torchdoctor._guard.assignedarg import LIBCALL
from torchdoctor._guard.maker import Maker
from torchdoctor._guard.maps import code_path, value_code
from torchdoctor._guard.offer import error_dict, with_patch  # noqa: F401  (where they were)
from torchdoctor._guard.ownfile import own_file  # noqa: F401  (where it was: its callers import it from here)

_CAST_TEXT = {".float()", ".half()", ".bfloat16()", ".double()"}


@dataclass(frozen=True)
class Remedy:
    code: str  # what to paste
    patch: str | None  # a unified diff of the user's file, when the maker's line is in it
    proof: str | None  # "fix proven: ..." / "fix unproven: ..." when proven here by a re-run


def _owner_expr(m: Maker, paths: dict[int, str], dicts: Any) -> str | None:
    owner = m.owner
    if isinstance(owner, nn.Module) and id(owner) in paths:
        return code_path(paths[id(owner)], dicts=dicts)
    return None


def _replaced(source_line: str, old: str, new: str) -> str | None:
    return source_line.replace(old, new, 1) if source_line.count(old) == 1 else None


def _moved(m: Maker, target: Any) -> Remedy | None:
    """A device: the maker's line made to give its result on ``target`` (``device=`` added to a factory, a move
    retargeted, else ``.to(...)`` after the call), named as the forward already names that device."""
    if not isinstance(target, torch.device) or m.span is None:
        return None
    want = m.device_expr or value_code(target)
    raw = _line(m.file, m.line)
    col, end = m.span
    seg = raw[col:end] if raw is not None else ""
    if raw is None or not seg.endswith(")"):
        return None
    method = m.op.split("(", 1)[0]
    cut = seg.rfind(method + "(") if method in (".to", ".cuda", ".cpu") else -1
    if cut >= 0:  # a move to the wrong place: move to the right one
        new = raw[:col + cut] + f".to({want})" + raw[end:]
    elif m.no_device:  # a factory that made it on the CPU: say where
        sep = "" if seg[seg.index("(") + 1:-1].strip() == "" else ", "
        new = raw[:end - 1] + f"{sep}device={want}" + raw[end - 1:]
    else:  # torch.cat of tensors on the wrong device, a library call: move its result
        new = raw[:end] + f".to({want})" + raw[end:]
    patch = line_patch(m.file, m.line, new.strip()) if own_file(m.file) else None
    return Remedy(f"{new.strip()}  # {os.path.basename(m.file)}:{m.line}", patch, None)


def class_attribute_line(klass: type, attr: str) -> tuple[str, int, str] | None:
    """(file, line, source line) of ``attr = ...`` in the body of ``klass``."""
    import ast
    import inspect
    import textwrap

    try:
        lines, start = inspect.getsourcelines(klass)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        path = inspect.getsourcefile(klass)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node in body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == attr for t in targets) and path:
            return path, start + node.lineno - 1, lines[node.lineno - 1]
    return None


def remedy(m: Maker, target: Any, paths: dict[int, str], dicts: Any = ()) -> Remedy | None:
    """The fix aimed at ``m`` that makes its operand ``target``: a dtype at where it was read from or at the cast,
    a device at the line that made it (``_moved``)."""
    if not isinstance(target, torch.dtype):
        return _moved(m, target)
    want = value_code(target)
    owner = _owner_expr(m, paths, dicts)
    if m.attr is not None and m.klass is not None:  # a class attribute: every instance reads it
        here = class_attribute_line(m.klass, m.attr)
        patch = None
        if here is not None and own_file(here[0]):
            line = here[2]
            value = line.split("=", 1)[1].strip() if "=" in line else ""
            new = _replaced(line.rstrip("\r\n"), value, want) if value and "#" not in value else None
            patch = line_patch(here[0], here[1], new.strip()) if new else None
        subject = f"type({owner})" if owner else m.klass.__name__
        return Remedy(f"{subject}.{m.attr} = {want}  # the class attribute every {m.klass.__name__} casts with",
                      patch, None)
    if m.attr is not None and m.dtype_from is not None:  # an instance attribute or a config value
        chain = m.dtype_from.split("`")[1] if "`" in m.dtype_from else m.attr
        expr = (owner + "." + chain.split(".", 2)[-1]) if owner and chain.startswith("self.") and \
            chain.count(".") >= 1 and isinstance(m.owner, nn.Module) else None
        if expr is None and chain.startswith("self.") and isinstance(m.this, nn.Module) and id(m.this) in paths:
            expr = code_path(paths[id(m.this)], dicts=dicts) + chain[len("self"):]  # model.config.torch_dtype
        if expr is None and chain.startswith("self."):
            expr = f"<{chain}>" if owner is None else f"{owner}.{m.attr}"
        return Remedy(f"{expr or chain} = {want}  # read by `{m.op}` at {os.path.basename(m.file)}:{m.line}",
                      None, None)
    # a literal cast or a factory: the line itself is the fix
    patch = None
    if own_file(m.file):
        raw = _line(m.file, m.line)
        new = None
        if raw is not None and m.segment is not None:
            col, end, text = m.segment
            if raw[col:end] == text:
                new = raw[:col] + want + raw[end:]
        elif raw is not None and m.op in _CAST_TEXT:
            new = _replaced(raw, m.op, f".to({want})")
        elif raw is not None:
            new = _factory_line(m, raw, want)
        if new is not None:
            patch = line_patch(m.file, m.line, new.rstrip("\r\n"))
            if m.segment is None or m.default_dtype:  # a factory or ``.float()``: the fixed line is the code
                return Remedy(f"{new.strip()}  # {os.path.basename(m.file)}:{m.line}", patch, None)
    made = f" ({m.source})" if m.source else ""
    return Remedy(f"# make `{m.op}` at {os.path.basename(m.file)}:{m.line}{made} give {want}", patch, None)


def _factory_line(m: Maker, raw: str, want: str) -> str | None:
    """A torch factory called without ``dtype=`` given one (``torch.ones(8, 8, dtype=torch.bfloat16)``), or
    ``torch.from_numpy(...)`` (which takes none) cast after the call; None for anything else."""
    if m.factory and m.span is not None and m.op.endswith(LIBCALL):  # a library call's result: cast after it
        return raw[:m.span[1]] + f".to({want})" + raw[m.span[1]:]
    if not m.factory or m.span is None or not m.op.startswith("torch."):
        return None
    col, end = m.span
    seg = raw[col:end]
    if not seg.endswith(")") or "(" not in seg:
        return None
    if m.op == "torch.from_numpy":
        return raw[:end] + f".to({want})" + raw[end:]
    sep = "" if seg[seg.index("(") + 1:-1].strip() == "" else ", "
    return raw[:end - 1] + f"{sep}dtype={want}" + raw[end - 1:]


def _line(path: str, lineno: int) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if i == lineno:
                    return line.rstrip("\r\n")
    except (OSError, UnicodeDecodeError):
        return None
    return None


def prove_rerun(m: Maker, target: Any, mod: Any, args: Any, frames: Any) -> str | None:
    """Run ``mod`` again on ``args`` with the attribute the dtype was read from set to ``target``: "fix proven"
    when it runs, "fix unproven: ..." with the error when not; None when there is nothing to re-run."""
    holder = m.owner
    if m.attr is None or holder is None or not isinstance(mod, nn.Module) or not hasattr(holder, "__dict__"):
        return None
    store = holder.__dict__
    had, old = m.attr in store, store.get(m.attr)
    try:
        store[m.attr] = target
        return rerun(mod, tuple(args), frames, f"{m.attr} = {value_code(target)} on `{type(holder).__name__}`")
    finally:
        if had:
            store[m.attr] = old
        else:
            store.pop(m.attr, None)


def prove_line(m: Maker, target: torch.dtype, mod: nn.Module, args: Any, frames: Any,
               local: str | None = None) -> str:
    """A literal cast or a factory: run ``mod`` again with what the maker's line makes given ``target``, as the
    fixed line would (a function mode casts the results of torch calls made at that line; nothing is edited);
    ``local``: the line's assigned local cast where it is used instead (``_guard.wrapfix``)."""
    from torch.overrides import TorchFunctionMode

    from torchdoctor._guard.useline import called_name, whole_value
    hits = [0]
    # ``feats = torch.from_numpy(...)`` (a call no mode sees) as the line's whole value: the local aligned where used
    name = m.source.split("=", 1)[0].strip() if "=" in m.source.split("(", 1)[0] else None
    name = name if name is not None and name.isidentifier() and whole_value(m.source, m.op) else local

    def made_here(a: Any, kw: Any) -> tuple[Any, Any]:
        f: Any = sys._getframe(2)
        for _ in range(12):
            if f is None or (f.f_code.co_filename == m.file and name in f.f_locals):
                break
            f = f.f_back
        held = f.f_locals.get(name) if f is not None and f.f_code.co_filename == m.file and \
            f.f_lineno > m.line else None
        if not isinstance(held, torch.Tensor) or not held.is_floating_point() or held.dtype == target:
            return a, kw
        swap = (lambda x: x.to(target) if x is held else x)
        if any(x is held for x in a) or any(x is held for x in (kw or {}).values()):
            hits[0] += 1
            return tuple(swap(x) for x in a), {k: swap(v) for k, v in (kw or {}).items()}
        return a, kw

    called = called_name(m.op)  # only the maker's own call is cast: the rest of its line runs as written (hunt U29)

    class AtLine(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, a: Any = (), kw: Any = None) -> Any:
            if name is not None:
                a, kw = made_here(a, kw)
            out = func(*a, **(kw or {}))
            f = sys._getframe(1)
            if local is None and f.f_lineno == m.line and f.f_code.co_filename == m.file and \
                    isinstance(out, torch.Tensor) and \
                    getattr(func, "__name__", called) == called and out.is_floating_point() and out.dtype != target:
                hits[0] += 1
                return out.to(target)
            return out

    said = rerun(mod, args, frames, f"`{m.op}` at {os.path.basename(m.file)}:{m.line} -> {value_code(target)}",
                 AtLine())
    if said.startswith("fix proven") and not hits[0]:
        return f"fix unproven: the re-run of {type(mod).__name__} never reached {os.path.basename(m.file)}:{m.line}"
    return said


_KEEP = 64 << 20  # the most state a re-run copies so that it can put it back


def _kept(mod: nn.Module) -> list[tuple[torch.Tensor, int, torch.Tensor | None]] | None:
    """The module's tensors with their version counters, and a copy of each buffer (a forward that updates
    running statistics or a cache writes buffers): what ``_put_back`` restores after a re-run. None when the
    copies would exceed ``_KEEP`` bytes."""
    out: list[tuple[torch.Tensor, int, torch.Tensor | None]] = []
    size = 0
    buffers = {id(b) for b in mod.buffers()}
    for t in (*mod.parameters(), *mod.buffers()):
        copy = None
        if id(t) in buffers:
            size += t.nelement() * t.element_size()
            if size > _KEEP:
                return None
            copy = t.detach().clone()
        out.append((t, t._version, copy))
    return out


def _put_back(kept: list[tuple[torch.Tensor, int, torch.Tensor | None]]) -> None:
    with torch.no_grad():
        for t, version, copy in kept:
            if copy is not None and t._version != version:
                t.copy_(copy)


@dataclass(frozen=True)
class Aim:
    """What a report says of operands made in a forward: one line per maker, the fix, its diff and its proof."""

    lines: list[str]
    code: str | None
    patch: str | None
    proof: str | None
    makers: list[Maker]


def aimed(loose: list[tuple[str, torch.Tensor]], kind: str, target: Any, paths: dict[int, str], dicts: Any,
          frames: Any = None, tb: Any = None) -> Aim | None:
    """Name the maker of each operand in ``loose`` ((label, tensor), no model tensor, no caller argument) and aim
    the fix at the first one found (see the module docstring)."""
    from torchdoctor._guard.frames import user_frames
    from torchdoctor._guard.maker import find

    try:
        stack = user_frames(tb)
        found = [(label, t, find(stack, t, kind, target)) for label, t in loose]
    except Exception:  # naming the maker is extra: the failure is reported without it
        return None
    made = [(label, t, m) for label, t, m in found if m is not None]
    if not made:
        return None
    lines = [f"{label} {m.describe()}" for label, _, m in made]
    m = made[0][2]
    fix = remedy(m, target, paths, dicts)
    if fix is None:
        return Aim(lines, None, None, None, [x[2] for x in made])
    proof = None
    mod = m.runner if isinstance(m.runner, nn.Module) else m.owner if isinstance(m.owner, nn.Module) else \
        m.this if isinstance(m.this, nn.Module) else None
    if mod is not None and frames is not None and (m.attr is not None or isinstance(target, torch.dtype)):
        args = frames.inputs_of(mod)
        if args or not mod.forward.__code__.co_argcount > 1:
            proof = prove_rerun(m, target, mod, args, frames) if m.attr is not None else \
                prove_line(m, target, mod, args, frames)
        if proof is not None and proof.startswith("fix unproven: re-ran") and m.attr is None:
            from torchdoctor._guard.wrapfix import whole_line  # the cast's line goes on: its whole value cast

            whole = whole_line(m, target, stack, _line(m.file, m.line) if own_file(m.file) else None,
                               lambda local: prove_line(m, target, mod, args, frames, local=local))
            fix, proof = (Remedy(*whole[:2], None), whole[2]) if whole else (replace(fix, patch=None), proof)
    return Aim(lines, fix.code, fix.patch, proof, [x[2] for x in made])


def moved_aim(loose: list[tuple[str, torch.Tensor]], target: Any, maps: Any, mod: nn.Module, frames: Any,
              tb: Any = None) -> Aim | None:
    """Explain mode, a device: the maker of each operand in ``loose`` made on the wrong device, the fix at its
    line, proven by running ``mod`` again on its inputs with those tensors moved to ``target``."""
    aim = aimed(loose, "device", target, maps.modules, maps.dicts, frames, tb) if loose else None
    if aim is None or aim.code is None:
        return aim
    ids = {id(t) for _, t in loose}
    given = tuple(frames.inputs_of(mod))
    tried = f"{', '.join(label for label, _ in loose)} -> {value_code(target)}"
    if not any(isinstance(t, torch.Tensor) and id(t) in ids for t in given):
        return replace(aim, proof=f"fix unproven: not re-run ({type(mod).__name__} did not get them as inputs)")
    return replace(aim, proof=rerun(mod, lambda: tuple(
        t.to(target) if isinstance(t, torch.Tensor) and id(t) in ids else t for t in given), frames, tried))


def rerun(mod: nn.Module, args: Any, frames: Any, tried: str, during: Any = None) -> str:
    """Run ``mod`` on ``args`` once more, its state and the random numbers put back after: "fix proven" or
    "fix unproven" with what was tried and the error."""
    kept = _kept(mod)
    if kept is None:
        return f"fix unproven: {tried} not tried: a re-run of {type(mod).__name__} would copy over " \
               f"{_KEEP >> 20} MiB of the state it could change"
    depth = (len(frames.stack), len(frames.inputs), len(frames.ran)) if frames is not None else None
    rng = torch.get_rng_state()
    try:
        with torch.no_grad(), (during if during is not None else contextlib.nullcontext()):
            mod(*(args() if callable(args) else args))
    except Exception as exc:  # the re-run's own failure is the answer, never a crash of the report
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"fix unproven: re-ran {type(mod).__name__} with {tried}: {type(exc).__name__}: {first}"[:400]
    finally:
        if depth is not None:  # a failed re-run leaves its modules on guard's stack: put it back as it was
            del frames.stack[depth[0]:], frames.inputs[depth[1]:], frames.ran[depth[2]:]
        _put_back(kept)
        torch.set_rng_state(rng)
    return f"fix proven: {type(mod).__name__} runs again with {tried}"


def caller_lines(given: list[tuple[str, torch.Tensor]], kind: str, tb: Any = None,
                 inside: Any = None) -> list[str]:
    """``kw['extra'][0] made by `torch.randn` at train.py:12 (...)``: the line of the caller's code that made each
    tensor it passed in, where its frames show it: the frames outside the guarded model's forwards (``inside``:
    the ids of its modules; a wrapper module around it is the caller's code), or outside any module's."""
    return [f"{label} {m.describe()}" for label, m in caller_makers(given, kind, tb, inside)]


def caller_makers(given: list[tuple[str, torch.Tensor]], kind: str, tb: Any = None,
                  inside: Any = None) -> list[tuple[str, Maker]]:
    """(label, maker) of each of the caller's tensors whose making line its frames show (``caller_lines``)."""
    from torchdoctor._guard.frames import Frames, user_frames
    from torchdoctor._guard.assignedarg import assigned_maker
    from torchdoctor._guard.maker import find

    if not given:
        return []
    try:
        stack = user_frames(tb)
        frames = Frames(f for f in stack if not (isinstance(me := f.f_locals.get("self"), nn.Module) and (
            inside is None or id(me) in inside)))
        frames.callee = getattr(stack, "callee", {})
        found = [(label, find(frames, t, kind) or (assigned_maker(frames, t) if kind == "dtype" else None))
                 for label, t in given[:4]]  # else the program's line that got it from a library's call
    except Exception:  # the making line is extra: the argument is named without it
        return []
    return [(label, m) for label, m in found if m is not None]


def caller_fix(makers: list[tuple[str, Maker]], target: Any, paths: dict[int, str], dicts: Any) -> Remedy | None:
    """A caller's argument in a wider dtype because the caller's code made it with a factory given no dtype (the
    default float32: ``sigmas = torch.tensor(SCHED, device=device)`` promoting the bf16 latents): the fix is that
    line given the dtype, as strict says at the promoting op. A cast the caller wrote (``.float()``) is its choice:
    none then. A component held whole in the other half dtype that made it is cast instead (``component_fix``)."""
    from torchdoctor._guard.assignedarg import component_fix

    if (whole := component_fix(makers, target)) is not None:
        return Remedy(whole, None, None)
    for _, m in makers:
        if isinstance(target, torch.dtype) and m.default_dtype:
            fix = remedy(m, target, paths, dicts)
            if fix is not None and not fix.code.startswith("#"):
                return fix
    return None

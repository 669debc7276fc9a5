"""Explaining an error that escaped a guarded forward: the innermost module, the culprits by path (the policy's
off-policy tensors first, then the operands), the original error and the fix."""

from __future__ import annotations

import logging
import re
import types
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from torchdoctor._rules import registry as _rules
from torchdoctor._guard import compiled as graph, component, provenance
from torchdoctor._guard.float8 import is_float8_message
from torchdoctor._guard.argproof import at_call, proof_line
from torchdoctor._guard.assigned import assigned_fix, trace_note as _trace_note
from torchdoctor._guard.handed import handed_aim
from torchdoctor._guard.heldarg import aim_made, locals_made
from torchdoctor._guard.kept import kept_aim, kept_float32, kept_site  # (a component kept in float32 on purpose)
from torchdoctor._guard.remedy import Aim, aimed, caller_fix, caller_makers, moved_aim, with_patch
from torchdoctor._guard.maps import Maps, both, fix_code, module_label, reference, stated
from torchdoctor._guard.message import kind_of as _kind_of, mentioned as _mentioned, placement_category
from torchdoctor._guard.record import Note
from torchdoctor._guard.session import Session
from torchdoctor._placement import device_str, dtype_str
from torchdoctor._report.model import PlacementError, Problem, TensorInfo
from torchdoctor._report.text import format_error


log = logging.getLogger("torchdoctor.guard")

def _innermost(session: Session, tb: types.TracebackType | None) -> tuple[nn.Module | None, Any, bool]:
    """(module, its forward frame or None, in_backward) from the traceback, else from the module stacks.

    Frames before the autograd engine call are the caller's (a LightningModule calling backward), not the
    culprit's: from there on, the module whose backward was running comes from the backward stack."""
    mod, frame, backward = None, None, False
    while tb is not None:
        f = tb.tb_frame
        if f.f_code.co_name == "_engine_run_backward" or f.f_code.co_name in ("backward", "grad") and \
                f.f_code.co_filename.endswith(("autograd/__init__.py", "_tensor.py")):
            mod, frame, backward = None, None, True
        s = f.f_locals.get("self")
        if isinstance(s, nn.Module):
            if s is not mod:
                frame = None
            mod = s
            if f.f_code.co_name == "forward" or getattr(getattr(s.__dict__.get("forward"), "__func__", None),
                                                        "__code__", None) is f.f_code:  # a forward patched in
                frame = f
        tb = tb.tb_next
    if mod is not None:
        return mod, frame, backward
    frames = session.frames
    if frames.bw and backward:  # (a module whose inputs needed no grad never says its backward ended)
        return frames.bw[-1], None, True
    if frames.stack and not backward:
        return frames.stack[-1], None, False
    return None, None, backward


def _inputs(session: Session, mod: nn.Module, frame: Any) -> list[tuple[str, torch.Tensor]]:
    out: list[tuple[str, torch.Tensor]] = []
    args: tuple[Any, ...] = tuple(session.frames.inputs_of(mod))

    def add(name: str, v: Any, depth: int = provenance.DEPTH) -> None:  # containers at any depth, by path
        if isinstance(v, torch.Tensor):
            out.append((name, v))
        elif depth and type(v) in (list, tuple):
            for j, x in enumerate(v[:64]):
                add(f"{name}[{j}]", x, depth - 1)
        elif depth and type(v) is dict:
            for k, x in list(v.items())[:64]:
                add(f"{name}[{k!r}]", x, depth - 1)

    for i, a in enumerate(args):
        add(f"input {i}", a)
    if frame is not None:  # keyword inputs: the forward's parameters after the positional ones
        code, loc = frame.f_code, frame.f_locals
        names = list(code.co_varnames[1 + len(args):code.co_argcount + code.co_kwonlyargcount])
        if code.co_flags & 0x08:  # CO_VARKEYWORDS
            extra = loc.get(code.co_varnames[code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04)])
            names += [k for k in (extra or {}) if isinstance(k, str)]
            loc = {**loc, **(extra or {})}
        for n in names:
            add(f"kwarg {n}", loc.get(n))
    return out


def explain_error(session: Session, exc: BaseException, tb: types.TracebackType | None) -> PlacementError | None:
    message = str(exc)
    category = placement_category(message)
    if category is None:
        return None
    if (own := _own_kind(session, exc, tb, category, message)) is not None:  # numpy's dtypes, a GradScaler's
        session.g._record_problems(list(own.problems))
        session.g._note(own.problems, Note(None, own.fix, own.proof, own.patch))
        return own
    kind = "unsupported_dtype" if category == "unsupported_dtype_on_device" else _kind_of(message)
    if is_float8_message(message):
        # a float8 tensor met another floating dtype, or a kernel without a float8 body (the text depends on the
        # CPU's kernel set and the device: _guard/float8.py): either way the float8 storage is the odd operand
        kind = "dtype"
    mod, frame, backward = _innermost(session, exc.__traceback__ or tb)
    if mod is None:  # raised in the user's code outside any module: explained at the user's line
        from torchdoctor._guard.outside import explain_outside

        root = session.g.model if session.g.model is not None else (
            session.frames.ran[0] if session.frames.ran else None)
        told = explain_outside(exc, tb, kind, session.maps_for(root), _mentioned(message, kind))
        if told is None:
            return None
        out, out_makers = told
        session.g._record_problems(list(out.problems))
        session.g._note(out.problems, Note(out_makers, out.fix, getattr(out, "proof", None),
                                           getattr(out, "patch", None)))
        return out
    root = session.g.model  # else the outermost module entered: of the forward, or of the backward
    if root is None:
        frames = session.frames
        stack = frames.stack or (frames.bw if backward else [])
        # an error the program caught earlier left its forwards on the stack (their post-hooks never ran): this
        # error's root is the outermost entry that holds `mod`
        root = next((r for r in stack if any(m is mod for m in r.modules())), mod)
    maps = session.maps_for(root)
    if kind == "dtype" and mod is not None:  # a network patched into the model's forwards (LoRA / LoKr)
        from torchdoctor._guard.network import explain_network

        if (net := explain_network(session, exc, tb, mod, maps, root)) is not None:
            session.g._record_problems(list(net.problems))
            session.g._note(net.problems, Note(None, net.fix, net.proof, net.patch))
            return net
    mpath = maps.modules.get(id(mod)) if maps is not None and mod is not None else None
    mtype = type(mod).__name__ if mod is not None else None
    if category == "no_accelerator" and frame is not None and mod is not None:  # `device="cuda"` on a Mac
        from torchdoctor._guard.hardcoded import hardcoded_report

        if (hc := hardcoded_report(session, exc, frame, mod, mpath)) is not None:
            session.g._record_problems(list(hc.problems))
            session.g._note(hc.problems, Note(None, hc.fix, hc.proof, hc.patch))
            return hc
    if kind == "dtype" and frame is not None and mod is not None:  # another layer's storage read directly (41 #3)
        from torchdoctor._guard.storageuse import inside_report

        if (st := inside_report(session, exc, frame, mod, maps, mpath)) is not None:
            session.g._record_problems(list(st.problems))
            session.g._note(st.problems, Note(None, st.fix, st.proof, st.patch))
            return st
    compiled = mpath is None and graph.is_graph_of_model(mod, maps)  # a graph torch traced from the model
    if compiled:
        mpath, mtype = "", graph.label(root)
    cands: list[tuple[str | None, str, torch.Tensor]] = []  # (model path, label, tensor)
    roles: dict[str, str] = {}
    owners: dict[str, str | None] = {}  # model path -> path of the module that owns it
    if mod is not None:
        from torchdoctor._walk import walk

        for e in walk(mod).entries:
            if e.alias_of is None and e.role in ("parameter", "buffer", "quant_state", "attribute"):
                path = f"{mpath}.{e.path}" if mpath else e.path
                if compiled:  # graph constants and lifted parameters are the model's own tensors: their paths
                    hit = maps.tensor_path(e.tensor) if maps is not None else None
                    if hit is None:
                        continue
                    path = hit[0]
                cands.append((path, path, e.tensor))
                roles[path] = e.role
                owners[path] = ".".join(x for x in (mpath, e.module_path) if x) if not compiled else None
        seen = {id(c[2]) for c in cands}
        for label, t in _inputs(session, mod, frame):
            hit = maps.tensor_path(t) if maps is not None else None
            if hit is not None and not hit[1]:  # the model's own tensor passed in (parametrize's original0/1)
                if id(t) not in seen:
                    cands.append((hit[0], hit[0], t))
                    roles[hit[0]] = "parameter" if isinstance(t, nn.Parameter) else "buffer"
            else:
                cands.append((None, label, t))
    value: Callable[[torch.Tensor], Any] = (lambda t: t.dtype) if kind in ("dtype", "unsupported_dtype") else (
        lambda t: _rules._norm(_rules.tensor_device(t)))
    pool = [c for c in cands if kind not in ("dtype", "unsupported_dtype") or c[2].is_floating_point()]
    ref = stated(message, kind) or reference(pool, kind, value, maps, _mentioned(message, kind), mpath)
    if kind == "meta":
        bad = [c for c in pool if c[2].device.type == "meta"]
    elif kind == "unsupported_dtype":
        bad, ref = [], None  # every tensor may share the dtype the device cannot run: name the module only
    else:
        bad = [c for c in pool if ref is not None and value(c[2]) != ref]
    stored: list[str] = []  # the storage's label and dtype
    if kind == "dtype" and ref is not None and not compiled:
        # integer storage a plain layer computes with directly (uint8 GGUF weights in a Conv3d): the error names its
        # dtype; the storage is the culprit, never the activations cast to it
        said = _mentioned(message, kind)
        ints = [c for c in cands if c[0] is not None and not c[2].is_floating_point() and c[2].dtype in said
                and roles.get(c[0]) in ("parameter", "buffer") and c not in bad]
        bad += ints
        stored = [ints[0][1], dtype_str(ints[0][2].dtype)] if ints else []
    aim = None
    if kind == "dtype" and frame is not None and maps is not None and ref is not None and not compiled:
        said = _mentioned(message, kind)  # the error names dtypes none of the suspects has: what the op met
        # float8 / integer storage the error never names was dequantized per call: not what the op met (41 #3)
        deq = any(not c[2].is_floating_point() or c[2].element_size() == 1 for c in bad if c[2].dtype not in said)
        if ref in said and (deq or not any(c[2].dtype in said for c in bad)):  # is a tensor its forward made
            made = locals_made(frame, said, ref)  # (or held by an object the program hands in: a KV cache)
            aim, made = aim_made(made, kind, ref, maps, session.frames, frame, exc.__traceback__ or tb, root)
            if aim is not None:
                bad = [(None, label, t) for label, t in made]
    first_line = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
    op = m.group(1) if (m := re.search(r"in method (\w+)", message)) else None
    where = (module_label(mpath, mod) + f" ({mtype})") if mod is not None else "an unknown module"
    phase = " during backward" if backward else ""
    # data flow: which of the off-policy tensors reached the failing op (own tensors its code reads, modules
    # that ran before it, autograd's record behind its inputs, the caller's arguments)
    run_frames = provenance.running_frames(exc.__traceback__ or tb)
    fl = _flow(session, maps, run_frames, [c[2] for c in bad if c[0] is None], mpath) if not compiled else (
        graph.reads_everything(maps) if maps is not None else None)
    off = [c for c in bad if fl is not None and c[0] is not None and not fl.reached(c[0], owners.get(c[0]), c[2])]
    if off and len(off) < len(bad):  # an own tensor its code never reads is not what the op met
        bad = [c for c in bad if c not in off]
    else:
        off = []
    args = provenance.call_arguments(run_frames, root)
    bad = [(p, args[id(t)][0] if p is None and id(t) in args else lbl, t) for p, lbl, t in bad]
    if kind == "device" and maps is not None and ref is not None and not compiled and mod is not None:
        # ids or a mask made in a forward on the wrong device: the line that made them (``torch.cat`` of CPU labels)
        aim = moved_aim([(c[1], c[2]) for c in bad if c[0] is None and id(c[2]) not in args], ref, maps, mod,
                        session.frames, exc.__traceback__ or tb)
    elif kind == "dtype" and aim is None and maps is not None and ref is not None and not compiled \
            and mod is not None and not any(t.is_floating_point() and value(t) in {value(c[2]) for c in bad}
                                            for _, t in args.values()):
        # an input made by the calling forward (``torch.from_numpy``, ``.float()``); when the caller's own
        # arguments hold the wrong value, they are where it entered (below)
        aim = aimed([(c[1], c[2]) for c in bad if c[0] is None and id(c[2]) not in args], kind, ref,
                    maps.modules, maps.dicts, session.frames, exc.__traceback__ or tb)
    passed = {c[1] for c in bad if c[0] is None and id(c[2]) in args}  # the caller's own arguments
    if bad and all(c[0] is None and c[1] not in passed for c in bad) and aim is None:
        # made in forward from something that held the wrong value: the caller's arguments that hold it (no
        # model tensor does, or it would be a suspect below) are where it entered
        wrong = {value(c[2]) for c in bad}
        held = [(n, t) for n, t in args.values() if (t.is_floating_point() or kind != "dtype") and value(t) in wrong]
        if held and not any(s.culprit for s in _suspects(session, maps, kind, bad, value, mpath, fl)):
            passed |= {n for n, _ in held}
            bad = [(None, n, t) for n, t in held] + bad
    found = ", ".join(dict.fromkeys(_show(value(c[2]), kind) for c in bad)) if bad else None
    expected = _show(ref, kind) if ref is not None else "?"
    # the model's own tensors that caused it (the policy's view), best first; the failing op comes second
    own = {c[0] for c in bad if c[0] is not None} | {c[0] for c in off}
    # a compiled graph that holds none of the wrong values itself: what the error names is what to look for
    named = {_show(v, kind) for v in _mentioned(message, kind)} if compiled and not bad else None
    found_all = _suspects(session, maps, kind, bad, value, mpath, fl, named)
    blamed = [s for s in found_all if s.problem.path not in own and s.culprit][:4]
    also = [s for s in found_all if s.problem.path not in own and not s.culprit][:3]
    surfaced = f"{found} where {expected} was expected" if found else "see the original error"
    if blamed:
        head = provenance.headline(blamed[0], kind, where + phase, surfaced)
    elif found:
        head = f"{kind} mismatch in {where}{phase}: {found} where {expected} was expected"
    else:
        head = f"{kind} problem in {where}{phase}"
    by_path = {e.path: e.tensor for e in maps.walk.entries} if blamed and maps is not None else {}
    lines = [b.line() + (_trace_note(by_path[b.problem.path]) if b.problem.path in by_path else "") for b in blamed]
    lines += [("culprit " if c[0] is not None or c[1] in passed else "") + f"{c[1]}" +
              (f" (an argument of the {provenance.call_owner(run_frames, root)} call)" if c[1] in passed else "") +
              f": {_rules._compact(c[2])}  (expected {expected}){_trace_note(c[2])}" for c in bad]
    if not bad:
        lines += [f"{c[1]}: {_rules._compact(c[2])}" for c in cands[:8]]
    callers = caller_makers([(c[1], c[2]) for c in bad if c[1] in passed], kind, exc.__traceback__ or tb,
                            maps.modules if maps is not None else None)
    given = [f"{label} {m.describe()}" for label, m in callers]
    lines += given
    lines += [f"also off-policy, not involved in this failure: {c[1]}: {_rules._compact(c[2])}" for c in off]
    lines += [s.line() for s in also]
    lines.append(f"original error: {type(exc).__name__}: {first_line}")
    culprits: list[tuple[str | None, str, str, Any]] = [(b.problem.path, b.problem.path, b.problem.kind,
                 None if b.problem.kind == "meta" else provenance.target_of(b.problem)) for b in blamed]
    victims = [c for c in bad if not ((blamed or passed) and c[0] is None and c[1] not in passed)]
    culprits += [(c[0], c[1], kind, None if kind == "meta" else _also_dtype(ref, c[2], kind, message, maps))
                 for c in victims]
    culprits = both(maps, culprits)  # a tensor off in device and in dtype: one fix for both
    fix = fix_code(culprits, maps.dicts if maps is not None else ())
    held = [(c[0], c[3]) for c in culprits if c[0] is not None]
    if held and len({t for _, t in held}) == 1 and kind in ("dtype", "device") and maps is not None \
            and not compiled and aim is None:
        # the culprits' submodule odd as a whole is what the fix casts; proven by re-running the whole forward
        fix, more, proof = component.widen(session, maps, root, [p for p, _ in held], held[0][1], fix)
        lines[-1:-1] = more + ([proof] if proof else [])
        if not more and not blamed and (asg := assigned_fix([p for p, _ in held], {
                e.path: e.tensor for e in maps.walk.entries}, held[0][1])):  # a submodule the program assigned
            fix, aim = asg[0], Aim([], asg[0], asg[1], None, [])
    if stored and fix is not None:  # said once, on the first line of the fix
        why = (f"  # `{mpath or '<root>'}` ({mtype}) computes with {stored[1]} storage directly: dequantize it (scale "
               f"included) or load its {_show(ref, kind)} weights; a bare cast keeps the stored integers")
        first, _, rest = fix.partition("\n")
        fix = first + why + ("\n" + rest if rest else "")
    comp = None
    if not blamed and bad and all(c[0] is None for c in bad) and kind == "dtype" and maps is not None:
        odd = provenance.odd_component(maps.walk, mpath, [c[2] for c in bad], ref)
        site = kept_site(exc.__traceback__ or tb, mod, odd, ref)  # the program's line handing a kept component data
        if odd is not None and (kept_float32(root, odd[0]) or site is not None):
            aim = kept_aim(odd, root, callers, mod, tuple(session.frames.inputs_of(mod)), maps, site)
        elif odd is not None:  # the component is the odd one out, not the data the rest of the model feeds it
            head = (f"{kind} mismatch in {where}{phase}: `{odd[0] or '<root>'}` runs in float32 while the data "
                    f"flowing in is {dtype_str(odd[1])}")
            lines, fix, comp = component.blame(odd, lines, root, maps.dicts, mpath, mtype, op, exc.__traceback__ or tb)
            lines.insert(-1, component.prove_module(mod, tuple(session.frames.inputs_of(mod)), odd[1]))
        elif isinstance(ref, torch.dtype) and (src := component.feeder(maps.walk, mpath, [c[2] for c in bad], ref)):
            head = f"{kind} mismatch in {where}{phase}: `{src[0]}` computes in {dtype_str(src[1])}, the rest in " \
                   f"{dtype_str(ref)}"
            lines, fix, comp = component.blame_feeder(src, ref, lines, root, maps.dicts, mpath, mtype, op)
            lines.insert(-1, component.prove_fed(mod, tuple(session.frames.inputs_of(mod)), src[1], ref))
    if aim is not None and not blamed:  # the maker of the operand made in forward: the fix aims at it
        lines[-1:-1] = aim.lines + ([aim.proof] if aim.proof else [])
        fix = aim.code or fix
    elif (at := caller_fix(callers, ref, maps.modules, maps.dicts) if maps is not None and not blamed and comp is None
            and all(any(t is x for x in session.frames.given(root)) for _, t in args.values()) else None):
        tried = f"{', '.join(c[1] for c in bad if c[1] in passed)} -> {_show(ref, kind)}"  # the line gives it that
        proof = component.prove_whole(session, root, lambda m: None, tried, (
            next(c[2].dtype for c in bad if c[1] in passed), ref))
        if proof is not None and proof.startswith("fix proven"):  # else the argument's own fix stays (unproven)
            aim, lines[-1:-1], fix = Aim([], at.code, at.patch, proof, []), [proof], at.code
    if kind == "dtype" and not blamed and aim is None and (fix or "").startswith("# pass") and isinstance(ref, torch.dtype):
        from torchdoctor._guard.computed import computed_aim  # computed in forward from sources in another dtype

        if (aim := computed_aim([c[2] for c in bad if c[0] is None], ref, session.frames, exc.__traceback__ or tb,
                                session) or handed_aim(mod, bad[0][2].dtype, ref, exc.__traceback__ or tb, session,
                                                       root, maps.modules if maps is not None else {})):
            lines[-1:-1], fix = aim.lines + [aim.proof], aim.code
    if (fix or "").startswith("# pass") and ref is not None and not any(
            x.startswith(("fix proven", "fix unproven")) for x in lines) and (handed := [c for c in bad if c[1] in passed]):
        # the caller's argument handed over in another dtype or device: the failing module re-run with it sent there
        lines.insert(-1, proof := proof_line(session, mod, root, [(c[1], c[2]) for c in handed], ref))
        aim, fix = at_call(proof, exc.__traceback__ or tb, mod, kind, handed[0][2], aim, fix)  # at the program's call
    problems = [replace(b.problem, op=op) for b in blamed] + ([comp] if comp is not None else [])
    problems += [Problem(kind, c[1], roles.get(c[1], "input"), _show(value(c[2]), kind), expected,
                         f"{c[1]} is {_show(value(c[2]), kind)} in {where}, expected {expected}", op=op,
                         module_path=mpath, module_type=mtype) for c in bad]
    session.g._record_problems(problems)
    lines = component.fold_also(lines)  # the odd component's other tensors are counted in its one finding
    infos = [TensorInfo.of(c[1], c[2], role=roles.get(c[1], "input")) for c in bad]
    err = PlacementError(format_error(head, lines, fix), module_path=mpath, module_type=mtype, op=op,
                         tensors=infos, problems=problems, fix=fix)
    err = with_patch(err, aim.patch if aim is not None and not blamed else None, lines)
    makers = (aim.lines if aim is not None and not blamed else []) + given
    session.g._note(problems, Note("\n".join(makers) or None, fix, err.proof, err.patch))
    return err


def _own_kind(session: Session, exc: BaseException, tb: Any, category: str, message: str) -> Any:
    """Errors of their own kind at their line: numpy's bfloat16 / float8 (``tonumpy``), GradScaler's float16 (``scaler``)."""
    if category == "unsupported_dtype_on_device" and "ScalarType" in message:
        from torchdoctor._guard.tonumpy import explain_numpy

        return explain_numpy(exc, tb)
    if "unscale FP16 gradients" in message or "non_finite_check_and_unscale" in message:
        from torchdoctor._guard.scaler import explain_scaler

        return explain_scaler(session, exc, tb)
    return None


def _flow(session: Session, maps: Maps | None, frames: list[Any], inputs: list[torch.Tensor], mpath: str | None
          ) -> provenance.Flow | None:
    if maps is None:
        return None
    try:
        return provenance.flow(maps.walk, session.frames.ran, frames, inputs, mpath)
    except Exception:  # the data flow is extra: without it every suspect of a module that ran is kept
        log.debug("flow failed", exc_info=True)
        return None


def _suspects(session: Session, maps: Maps | None, kind: str, bad: list[Any], value: Callable[[torch.Tensor], Any],
              mpath: str | None, fl: provenance.Flow | None = None, named: set[str] | None = None
              ) -> list[provenance.Suspect]:
    if maps is None or kind == "unsupported_dtype":
        return []
    try:
        values = {_show(value(c[2]), kind) for c in bad} | (named or set())
        ran = provenance.ran_paths(maps.modules, session.frames.ran)
        tensors = {e.path: e.tensor for e in maps.walk.entries} if fl is not None and fl.leaves else None
        return provenance.suspects(maps.policy_problems(), kind, values, ran, mpath, fl, tensors)
    except Exception:  # provenance is extra: the failure is still explained without it
        log.debug("provenance failed", exc_info=True)
        return []


def _also_dtype(ref: Any, t: torch.Tensor, kind: str, message: str, maps: Maps | None) -> Any:
    """A tensor on the wrong device whose dtype the message also names as wrong (``Input type
    (CUDABFloat16Type) and bias type (CPUFloatType)``): fix both at once, ``(device, dtype)``."""
    if kind != "device" or maps is None or maps.dtype is None or not t.is_floating_point() or t.dtype == maps.dtype:
        return ref
    named = _mentioned(message, "dtype")
    return (ref, maps.dtype) if maps.dtype in named and t.dtype in named else ref


def _show(v: Any, kind: str) -> str:
    return dtype_str(v) if isinstance(v, torch.dtype) else device_str(v)

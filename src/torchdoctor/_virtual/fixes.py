"""The fix of a virtual run as code (``simulate``'s report and the pytest marker's error): guard's generator over
the tensors found by path and the sources of tensors made in the run."""

from __future__ import annotations

import linecache
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES, device_str, dtype_str, parse_device, parse_dtype
from torchdoctor._report.model import Problem
from torchdoctor._virtual.feeder import odd_feeder
from torchdoctor._virtual.fixjoin import add_culprit, no_op, stale_source, with_dtype
from torchdoctor._virtual.groups import whole_component
from torchdoctor._virtual.genfix import generator_fix
from torchdoctor._virtual.keptfix import KEPT, kept_fix
from torchdoctor._virtual.keepdtype import FLOATS, narrower_partner
from torchdoctor._virtual.leftwhole import left_whole
from torchdoctor._virtual.libout import library_line
from torchdoctor._virtual.madeline import made_line_fix
from torchdoctor._virtual.ownline import on_line, own_file
from torchdoctor._virtual.readdtype import read_dtype_fix
from torchdoctor._virtual.lifted import SOURCE as SWAPPED, swap_fix
from torchdoctor._virtual.moveline import taken_back
from torchdoctor._virtual.movedin import moved_in_fix
from torchdoctor._virtual.meetsite import made_by, made_pass, meet_fix, written_follows
from torchdoctor._virtual.intread import NUMPY, STORAGE, float_read_fix, storage_note
from torchdoctor._virtual.operandfix import reoperand
from torchdoctor._virtual.origin import IN_SCOPE, LINES
from torchdoctor._virtual.devvars import CPU_ARG, named_device
from torchdoctor._virtual.training import state_diff, state_fix
from torchdoctor._virtual.apart import Apart, at_root, find, fix as apart_fix, loose_network_fix, network_fix
from torchdoctor._virtual.callsite import caller_fix
from torchdoctor._virtual.castfix import (NO_DEVICE_ARG, cast_fix, op_moved, each_maker, in_library, library_note,
                                          legacy_call, maker_diff, storage_fix, traced_note)
from torchdoctor._virtual.heldby import NEVER_MOVED
from torchdoctor._virtual.inplacefix import inplace_fix
from torchdoctor._virtual.loadorder import swapped_load
from torchdoctor._virtual.hostread import host_fix
from torchdoctor._virtual.nofix import whole_move
from torchdoctor._virtual.widened import KEY as WIDENED, widened_fix
from torchdoctor._virtual.prove import Fix
from torchdoctor._virtual.stalename import stale_fix
from torchdoctor._virtual.restfix import FLOAT8_NAMES, SCALER, SCALER_BF16, rest

__all__ = ["factory_fix", "fix_for", "fix_items", "maker_diff"]

_NAMED = ("parameter", "buffer", "quant_state", "attribute", "container")


def fix_for(problems: Sequence[Problem], device: torch.device, dtype: torch.dtype | None,
            sources: dict[tuple[str, ...], tuple[str, ...]] | None = None,
            current: Mapping[str, tuple[torch.dtype, torch.device]] | None = None) -> str | None:
    """The fix as code (``fix_items`` joined): what the marker and ``run`` print (``current``: as in fix_items)."""
    items = fix_items(problems, device, dtype, sources, current)
    return "\n".join(f.code for f in items) if items else None


def fix_items(problems: Sequence[Problem], device: torch.device, dtype: torch.dtype | None,
              sources: dict[tuple[str, ...], tuple[str, ...]] | None = None,
              current: Mapping[str, tuple[torch.dtype, torch.device]] | None = None,
              module_path: Callable[[Any], str | None] | None = None,
              apart: Sequence[Apart] = (), made_args: Mapping[str, tuple[str, str, str]] | None = None,
              cases: Sequence[Any] = (), mapped: frozenset[str] = frozenset()) -> list[Fix] | None:
    """The fix, one ``Fix`` per part, from guard's generator: the named tensors cast or moved (``torchdoctor.move``
    for many), the model tensors a wrong tensor made in the run came from, a cast at a line of the user's code fixed
    there (or at the attribute it read its dtype from), tensors the test made passed on the right device; then what
    no cast of a tensor fixes. The lines never contradict each other: weights on meta are loaded before anything is
    moved (moving them raises), and a dtype the device cannot compute in is replaced by one that does not outgrow
    its memory. Never written: a cast to the dtype a tensor already has (``current``: path -> its dtype and device
    after the run), floating data cast to an integer or float8 dtype (the storage that met it is cast instead), a
    model-wide cast for tensors made outside the model. None when nothing but memory is wrong (that problem's
    message is its own fix). ``apart``: the modules the program ran apart from the model (``apart``): a culprit
    the model does not hold but one of them does is fixed on that module, by the program's name for it.
    ``made_args``: an argument's label -> the factory, line and dtype it was made by (the caller's own code): its
    dtype is fixed at that line (a diff), not by a cast of the argument. ``cases``: the run's failing ops (``atop``):
    what fed them tells the odd component of a pipeline (``feeder``). ``mapped``: modules a device map's hooks place."""
    from torchdoctor._guard.maps import fix_code, value_code
    from torchdoctor._guard.proof import storage_target
    memory, problems = [p for p in problems if p.kind == "memory"], [p for p in problems if p.kind != "memory"]
    if not problems:
        return None
    have = current or {}
    rooted, problems = at_root(problems, apart)  # a module held apart that started on its own: its paths are its own
    culprits: list[tuple[str | None, str, str, Any]] = []
    factories: list[Fix] = []
    named = {p.path for p in problems if p.role in _NAMED}
    made: dict[str, dict[str, tuple[str, Any]]] = {}  # a factory's source -> kind -> (found, target)
    meta = [p for p in problems if p.kind == "meta"]
    ran = [p for p in problems if p.role == "run"]  # the run's own weights were in another dtype than asked
    library: list[Fix] = []  # casts at a line of an installed library (transformers' rotary upcast, by design)
    scripted = any("<constant>" in p.path or "TracedModule" in str(p.op or "") or "ScriptModule" in str(p.op or "")
                   for p in problems)  # a TorchScript module ran: its constants are fixed before tracing (a buffer)
    unmoved = left_whole(problems, dict(have), {c[0] for _, c in rooted if c[0]}) if have else None  # a module never moved: one move, whole
    for p, made_from in each_maker(problems, sources or {}):
        if p.role == "optimizer" and (code := state_fix(p)) is not None:  # a state loaded off its params' device
            if code not in {f.code for f in factories} and (swap := state_diff(p)):  # the program's lines swapped
                factories.append(swapped_load(code, swap, p, problems))
            elif code not in {f.code for f in factories}:  # (or moved there by the program's own line, not back)
                factories.append(Fix(code, "note", tried="not re-run: the move back is the program's own code" if
                                     code.startswith("# ") and "was moved to" in code else _LOAD_ORDER if
                                     code.startswith("# load ") else "not re-run: both ways "
                                     "were run clean by the run's own tests; the state's move is torch's own "
                                     "(load_state_dict casts to the parameter)"))
            continue
        if made_from and made_from[0].startswith(SWAPPED):  # an offload moved a saved parameter before the backward
            if (swap := swap_fix(made_from[0], p.found, p.expected)).code not in {f.code for f in factories}:
                factories.append(swap)
            continue
        if scripted and p.role == "attribute" and p.kind == "device":
            continue  # a traced module's constant: a move of the attribute changes nothing in the traced code
        if p.kind not in ("device", "dtype") or p.role == "run" or "<constant>" in p.path or \
                unmoved is not None and p.kind == "device" and p.path in have:
            continue  # meta: no move fixes it (below); a TorchScript constant has no path code can move
        try:
            target: Any = parse_dtype(p.expected) if p.kind == "dtype" else parse_device(p.expected)
        except (ValueError, TypeError, RuntimeError):
            target = dtype if p.kind == "dtype" else device
        if str(p.op or "").startswith("aten._amp_foreach_non_finite_check_and_unscale_") and p.found == "bfloat16":
            if SCALER_BF16 not in {f.code for f in factories}:  # CUDA has no bf16 unscale kernel
                factories.append(Fix(SCALER_BF16, "note"))
            continue
        if p.kind == "device" and "does not exist (invalid device ordinal)" in p.message:  # the profile, not the
            note = (f"# {p.found} is a device the simulated profile does not have: simulate as many devices as the "
                    f"program uses (simulate(..., profile=torchdoctor.DeviceProfile.for_device({p.found!r})), or "
                    f"run --device {p.found}); no placement change is needed for it")  # program, is short of devices
            if note not in {f.code for f in factories}:
                factories.append(Fix(note, "note", tried="not re-run: a setting of the check, not of the program"))
            continue
        if "unscale FP16 gradients" in p.message:  # GradScaler met float16 parameters: casting anything to float16 is
            factories.append(Fix(SCALER, "note"))  # no fix; float32 master weights under autocast are
            continue
        if storage_target(target) and p.found not in _STORAGE_NAMES:  # activations never become storage
            factories.extend(storage_fix(p, have))
            continue
        if made_from and made_from[0].startswith(KEPT):  # a component kept so on purpose: fixed where it is handed
            if (kf := kept_fix(made_from[0])) is not None and kf.code not in {f.code for f in factories}:
                factories.append(kf)  # its input (``keptside``)
            continue
        if cases and NEVER_MOVED not in p.message and (kept := inplace_fix(p, cases)) is not None:  # in place: what
            factories += [kept] if kept.code not in {f.code for f in factories} else []  # it reads to self's device
            continue  # (one line: one fix; a copy the program never moved is moved itself, below)
        if made_from and made_from[0].startswith(WIDENED) and (w := widened_fix(made_from[0], target, LINES)):
            if w.code not in {f.code for f in factories}:  # a line promoted the model's data: its value cast back
                factories.append(w)
            continue
        if made_from and made_from[0].startswith("cast at "):  # fixed at the cast, or where it read its dtype
            fix = cast_fix(p, made_from[0][8:], target, module_path)
            if fix is not None and fix.kind == "line" and fix.diff is None and in_library(fix.site):
                library.append(fix)  # never advice to edit an installed library's own line (said only when alone)
            elif fix is not None and fix.code not in {f.code for f in factories}:
                factories.append(fix)
            continue
        if made_from and made_from[0].startswith("moved "):  # a copy moved inside the forward: fixed at that line
            name, at = made_from[0][6:].split(" at ", 1)
            if library_line(at):  # the library's own move (EMAModel.to('cpu')), made on the program's request
                note = (f"# {name} was moved to {p.found} by a library call ({at}) the program made; it then meets "
                        f"tensors on {p.expected}: move the object that holds it to {p.expected} before that (its own "
                        f".to({p.expected!r})), or make that call where they are; never an edit of the library's line")
                if note not in {f.code for f in factories}:
                    factories.append(Fix(note, "note", tried="not re-run: the call that asked for the move is the "
                                         "program's, and its line is not on record"))
                continue
            if taken_back(factories, p, name, at, made_from[0], target):  # copies the program took back, handed in
                continue
            where = "inside the forward" if p.module_path is not None else "by name"  # None: outside any module
            factories.append(moved_in_fix(made_from[0], p.found, target) or Fix(
                f"# {at} moves {name} to {p.found} {where}: move it to the device of the tensors it meets (e.g. "
                ".to(x.device)) instead", "note", sets=((made_from[0], target),)))
            continue
        if made_from and made_from[0].startswith(("draws at ", "sampler draws at ", "read at ")):  # at its line
            if (hf := host_fix(made_from[0], p.found, p.expected, target)).code not in {f.code for f in factories}:
                factories.append(hf)  # (never its key written as a model path)
            continue
        if made_from and made_from[0].startswith(NUMPY) and (floated := float_read_fix(made_from[0])) is not None:
            factories.append(Fix(f"{floated[0]}  # numpy has no {p.found}: cast it to float32 first", "note", target,
                                 diff=floated[1], renumpy=floated[2]))  # a re-run reads it so at that line
            continue
        if made_from and made_from[0].startswith(STORAGE):  # stored integers read directly at the program's line
            note = storage_note(made_from[0], p.found, target)
            if note not in {f.code for f in factories}:
                factories.append(Fix(note, "note", tried="not re-run: a dequantization needs the layer's own scale, "
                                     "which only its code applies"))
            continue
        if made_from and made_from[0].startswith("operand "):  # an operand the op refuses in its dtype: at the call
            from torchdoctor._virtual.makers import operand_fix, reversed_by
            at_line = LINES.get(made_from[0].partition(" at ")[2], ("", 0))[0]
            fixed = operand_fix(made_from[0], target, p.module_path) if isinstance(target, (torch.dtype, torch.device)) and \
                (not at_line or own_file(at_line)) and not reversed_by(p, problems, sources or {}, have, mapped) else None
            if fixed is not None and fixed[0] not in {f.code for f in factories}:
                factories.append(Fix(fixed[0], "note", target, sets=((made_from[0], target),), diff=fixed[1],
                                     reoperand=reoperand(made_from[0], target)))  # a re-run gives it so there
            continue
        if p.role in _NAMED and p.found in _STORAGE_NAMES and isinstance(target, torch.dtype) and \
                target.is_floating_point:  # integer storage a plain layer computes with: the cast says what it is
            from torchdoctor._guard.maps import code_path
            c, why = code_path(p.path), "cast it before the model moves" if p.found in FLOAT8_NAMES else (
                f"dequantize it (scale included) or load its {dtype_str(target)} weights; a bare cast keeps the stored integers")
            code, fl8 = f"{c}.data = {c}.data.to(torch.{dtype_str(target)})  # {p.found} storage computed with " \
                f"directly: {why}", p.found in FLOAT8_NAMES  # integers cast bare run, with the wrong values: unproven
            factories.append(Fix(code, "path", sets=((p.path, target),)) if fl8 else Fix(code, "note", tried=_BARE))
            continue
        if p.role in _NAMED:
            add_culprit(culprits, p.path, p.path, p.kind, with_dtype(p.path, target, dtype, have))
            continue
        if p.role == "held":  # a module the program holds and never moved (an EMA copy): moved where it is made
            holder = p.path.split(".", 1)[0]
            if holder not in named:
                named.add(holder)
                factories.append(Fix(f"{holder}.to({value_code(target)})  # {p.path} is on {p.found}: {holder} "
                                     "was made before the move, or never moved", "note", sets=((holder + ".", target),)))
            continue
        if made_from and made_from[0].startswith("factory torch.nn.Parameter "):  # a lazy layer, or one built in
            if made_from[0] not in named:  # __init__ that a placement of the layers left behind (bareuse: its use)
                named.add(made_from[0])
                how = "move it with the layer that owns it, or where it is used" if " built in __init__ at " in \
                    made_from[0] else "build it in __init__, or run one forward before the model's .to so the " \
                    "move takes it"
                factories.append(Fix(f"# {made_from[0][8:]} (on {p.found}): {how}", "note",
                                     sets=((made_from[0], target),)))
            continue
        if p.role == "generator" and (drawn := generator_fix(p, made_from)) is not None:
            factories.append(drawn)  # drawn where the generator is, moved where the program wants it
            continue
        if made_from and made_from[0].startswith("factory ") and p.kind == "device" and cases and \
                (stale := stale_fix(made_from[0], cases, target) or meet_fix(made_from[0], cases, target)) is not None:
            factories.append(stale)  # a name bound before the code moved its tensor (``stalename``), a loader's
            continue  # tensor or one meeting a device decided at run time (``meetsite``): fixed where it is read
        if made_from and made_from[0].startswith("factory "):  # one fix per call, for its device and dtype
            made.setdefault(made_from[0], {})[p.kind] = (p.found, target)
            if p.kind == "device" and (keep := narrower_partner(p.tensors, p.found, p.expected)) is not None:
                made[made_from[0]].setdefault("dtype", (dtype_str(keep[0]), keep[1]))  # moved alone, it promotes
            continue
        if made_from and scripted and "Traced" in str(p.module_type or ""):
            continue  # computed in traced code from its constants: only their registration before tracing fixes it
        if made_from:  # fix the source: the tensor made from it follows
            for src in made_from:
                named.add(src)
                add_culprit(culprits, None if src.startswith(("input ", "kwarg ")) else src, src, p.kind, target)
            continue
        if p.path not in (have or {}) and any(not a.prefix and a.holds(p.path) for a in apart):  # a buffer of a
            add_culprit(culprits, p.path, p.path, p.kind, target)  # module run apart (a loss's class weights)
            continue
        if p.path.startswith(("input ", "kwarg ")):  # the caller's argument itself, by the name the run gave it
            add_culprit(culprits, None, p.path, p.kind, target)
            continue
        if any(q.role in _NAMED and q.kind == p.kind and q.found == p.found for q in problems):
            continue  # a named culprit above holds this value: fixing it fixes what was made from it
        if p.found == (dtype_str(target) if isinstance(target, torch.dtype) else str(target)):
            continue  # a cast to what the tensor already is changes nothing: never printed
        if cases and p.kind == "device" and (odd := written_follows(p.message, p.found, cases)) is not None:
            factories.append(odd)  # a device written out meets one the program picks at run time: it follows
            continue
        where = "on" if p.kind in ("device", "meta") else "in"
        said = made_by(p.message, p.found, where) or (f"the tensors made {where} {p.found}" if p.found not in (
            "", "?") else "the tensors the failing op met")  # its maker, when the problem names one
        culprits.append((None, said, p.kind, target))
    factories.extend(factory_fix(key, wrong) for key, wrong in made.items())
    dropped = [c for c in culprits if no_op(c, have)]  # right already: what was made from them is not
    culprits = [c for c in culprits if c not in dropped]
    held = {p.path.split(".", 1)[0] + "." for p in problems if p.role == "held"}  # moved as the program holds it:
    culprits = [c for c in culprits if not (c[0] or "").startswith(tuple(held))]  # never `model.ema...` lines
    patched = [c for c in culprits if c[0] is not None and _HELD_APART in c[0]]
    if len(patched) >= _NETWORK:  # a network patched into forward, held apart: it is moved where it is built
        culprits = [c for c in culprits if c not in patched]
        factories.append(network_fix(patched, apart) or loose_network_fix(patched))
    items: list[Fix] = []
    if meta:  # moving a meta tensor raises "Cannot copy out of meta tensor": the weights are loaded first
        items.append(Fix(f"# {len(meta)} tensor{'s are' if len(meta) > 1 else ' is'} on meta (no data, e.g. "
                         f"{meta[0].path}): load the weights onto the device, e.g. "
                         "model.load_state_dict(state_dict, assign=True) or from_pretrained(..., device_map=...)",
                         "note"))
    held_apart = find(culprits if have else [], apart, dict(have), rooted)
    for mod, mine in held_apart.values():  # a module the model does not hold: moved where the program builds it
        culprits = [c for c in culprits if c not in mine]
        factories.insert(0, apart_fix(mod, mine))
    fed, culprits = odd_feeder(culprits, have, apart, cases, dtype)  # the component that fed the op the other dtype
    whole, culprits = whole_component(culprits, have)  # one component in another dtype: that component is cast
    moves = fix_code([c for c in culprits if c[0] is not None])
    if meta and (moves or factories or unmoved):
        items.append(Fix("# then, with the weights loaded:", "note"))
    items += [unmoved] if unmoved is not None else []  # after the weights are loaded, if on meta
    if moves:
        items.append(Fix(moves, "path", sets=tuple((c[0], c[3]) for c in culprits if c[0] is not None)))
    items += [_at_maker(label, t, made_args) or made_line_fix(label, t) or Fix(_pass(label, t), "input", t, label,
                                                                               sets=((label, t),))
              for path, label, _, t in culprits if path is None and t is not None]
    items += [*fed, *whole, *factories]
    items += [Fix(f"model.to(torch.{p.expected})  # the code ran with {p.found} weights: cast them so the run "
                  f"checks {p.expected}", "path", sets=(("*", parse_dtype(p.expected)),)) for p in ran[:1]]
    items += rest(problems, memory, device, any(not f.code.startswith("#") for f in items), have, cases)
    if library and not items:  # nothing else to do: what the library's cast meets is said, never an edit of it
        items = [library_note(library[0])]
    if not items and scripted:  # a traced constant alone: no move reaches the traced code
        return traced_note(next(p for p in problems if p.kind == "device"), set()) if any(
            p.kind == "device" for p in problems) else None
    if not items and all(p.kind == "dtype" for p in problems) and (again := stale_source(dropped, have)):
        # never a cast or move of the model that changes nothing (a device problem goes on to offloaduse & co.)
        return [Fix(again, "note", tried="not re-run: the tensors to make again are the program's own state")]
    return items or [whole_move(problems, device, have)]  # never a move of a model already there


# dtypes that are storage, never compute: a tensor found in one of them is the stored side, not the activation
_STORAGE_NAMES = frozenset(dtype_str(d) for d in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                                  torch.bool, *FLOAT8_DTYPES))


_BARE = "not re-run: a bare cast of stored integers runs with the integers as values; only their scale dequantizes"
_LOAD_ORDER = ("not re-run: the load's placement is torch's own (load_state_dict casts each state tensor to its "
               "parameter's device at the time of the load); the fix changes the order of the program's lines")


def _at_maker(label: str, target: Any, made_args: Mapping[str, tuple[str, str, str]] | None) -> Fix | None:
    """An argument the caller made with a factory at a line of its own file: that call fixed (``dtype=`` / ``device=``
    unless the line moves it after; a diff), never a cast or move after it; None when the line cannot be rewritten."""
    hit = (made_args or {}).get(label)
    if (read := read_dtype_fix(label, target, made_args)) is not None:  # the program's dtype read there: kept
        return read
    moved = hit is not None and re.search(r"\.(?:to|cuda|xpu|cpu)\(", linecache.getline(*LINES.get(hit[1], ("", 0))))
    if hit is not None and isinstance(target, torch.device) and hit[0].startswith("Tensor."):
        return op_moved(label, *hit[:2], target)  # a CPU op's result at the program's line: moved after it there
    if hit is None or not isinstance(target, torch.dtype) and (moved or not hit[0].startswith("torch.")):
        return None
    op, at, found = hit  # a device: made on it by the factory itself (``device=``, the line does not move it)
    fix = factory_fix(f"factory {op} at {at}", {"dtype" if isinstance(target, torch.dtype) else "device": (
        found if isinstance(target, torch.dtype) else "another device", target)})
    fix.sets = ((label, target),)  # it makes the argument in ``target``: judged at the failing op as its cast would be
    return fix if fix.diff is not None else None


def _pass(label: str, t: Any) -> str:
    """A caller's argument is passed fixed; tensors no record names a maker for (no caller passed them) are fixed
    where they are made, never "passed"."""
    from torchdoctor._guard.maps import value_code

    named = made_pass(label, t)  # a maker the problem names: never "no line that made them was recorded"
    if not label.startswith("the tensors ") or named:
        return named or f"# pass {label} as tensor.to({value_code(t)})"
    verb = "cast" if isinstance(t, torch.dtype) else "move"
    return (f"# {label} reached the failing op and no line that made them was recorded: {verb} them where they "
            f"are made (tensor.to({value_code(t)}))")


def factory_fix(key: str, wrong: dict[str, tuple[str, Any]]) -> Fix:
    """A factory called in the run made a tensor on the wrong device and/or in the wrong dtype: that call is fixed
    (``device=`` / ``dtype=`` the input's, a host-data maker moved and cast after it), for both at once."""
    from torchdoctor._guard.maps import value_code

    said, _, at = key[8:].partition(" at ")
    maker, x = said.split(" ", 1)[0], IN_SCOPE.get(at)  # the tensor's name in scope at that line
    dev, dt = wrong.get("device", (None, None))[1], wrong.get("dtype", (None, None))[1]
    x = None if dev is not None and dt is None and LINES.get(at) in CPU_ARG else x  # a cpu tensor: no device name
    exprs = {k: f"{x}.{k}" if x else named_device(at, t) or value_code(t) for k, t in (("device", dev), ("dtype", dt))
             if t is not None}
    found = " and ".join(f"{'on' if k == 'device' else 'in'} {f}" for k, (f, _) in wrong.items())
    legacy = legacy_call(maker, exprs["device"]) if "device" in exprs else None
    if maker in NO_DEVICE_ARG:
        how = f"move it: {maker}(...).to({', '.join(exprs.values())})"
    elif legacy is not None:
        how = f"make it with {legacy}"
    else:
        args = ", ".join(f"{k}={v}" for k, v in exprs.items())
        kinds = " and ".join(f"{k}=" for k in exprs)
        whose = "the module's" if (x or "").startswith("next(") else "the input's"
        how = f"pass {kinds} {whose} {' and '.join(exprs)} ({maker}(..., {args}))" if x else \
            f"pass {kinds} ({maker}(..., {args}))"
    target = (dev, dt) if dev is not None and dt is not None else dev if dev is not None else dt
    file, line = LINES.get(at, ("", 0))
    if file and on_line(file, line, "trace") and "jit.trace(" in linecache.getline(file, line):  # a trace's example input
        return Fix(f"# {said} at {at} made the example input torch.jit.trace recorded: what the trace computed from "
                   f"it is baked into the traced code as constants {found}; trace on the device it runs on (model and "
                   "example input moved first), or register the tensors the forward reads as buffers", "note",
                   tried="not re-run: a change of the traced code, not of a tensor the program passes")
    if dev is not None and file and not own_file(file) and re.search(r"\bdevice\s*=", linecache.getline(file, line)):
        return Fix(f"# {said} at {at} (a library's line) already makes its tensor on the device of what it is "
                   f"given (device=...): it was given tensors {found}; fix what the library's call receives, not "
                   "that line", "note", tried="not re-run: the library's line is as it should be")  # never a no-op
    if dev is not None and dt is None and (called := caller_fix(key, file, line, at, dev)) is not None:
        return Fix(called.note, "note", dev, sets=tuple((k, dev) for k in dict.fromkeys((key, *called.keys))),
                   diff=called.diff, recall=called)  # the call that left out the function's device=, fixed there
    wide = parse_dtype(wrong["dtype"][0]) if dev is not None and dt is not None and wrong["dtype"][0] in FLOATS \
        else None
    diff = maker_diff(maker, at, dev if dev is not None else dt, exprs, wide)
    if diff is None and file and not on_line(file, line, maker):  # made inside a library call at that line
        how = f"it was made inside the call at {at} (no {maker} there to change): move what that call returns " \
            f"(.to({', '.join(exprs.values())}))"
    # made so in a re-run where the line holds that one call (the diff found it alone on the line)
    # host-data makers are not seen by a function mode: the re-run follows their call at that line (``remake``)
    remake = (file, line, maker[6:], dev, dt) if file and maker.startswith("torch.") and diff is not None else None
    return Fix(f"# {said} made it {found}: {how}", "note", sets=((key, target),), diff=diff, remake=remake)


_HELD_APART = ".forward.__self__."  # a module patched into another's forward: the model does not hold it
_NETWORK = 4  # this many of its tensors: a network (LoRA) whose own .to was forgotten

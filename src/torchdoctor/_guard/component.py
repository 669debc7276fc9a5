"""A component left in float32 in a reduced-precision pipeline or model (a ControlNet beside a bf16 UNet): the
component is the culprit, not the data its neighbours feed it. Said the same way by explain and strict mode, with the
fix that loads or casts the component, proven before it is printed.

The proof runs the failing piece in the component's new dtype on what it was fed: in strict mode the failing op on
its float32 operands cast down (new tensors); in explain mode a copy of the failing module (the innermost, small)
cast down and called on its inputs. Neither touches the user's component.
"""

from __future__ import annotations

from torchdoctor._guard import trialcopy as copy
import logging
import re
import threading
import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from torchdoctor._placement import dtype_str

from torchdoctor._guard.assignedarg import root_named
from torchdoctor._guard.maps import component_fix
from torchdoctor._guard.proof import prove
from torchdoctor._placement import dtype_str
from torchdoctor._report.model import Problem


_QUIET = threading.Lock()
_QUIETED = {"depth": 0, "level": 0}  # re-runs in flight, and the logging.disable level the first one found


def _quiet(on: bool) -> None:
    """``logging.disable(WARNING)`` around whole-forward re-runs, counted: guards in two threads re-running at once
    each put back what the other had set, and left the program's logging off."""
    with _QUIET:
        if on:
            if _QUIETED["depth"] == 0:
                _QUIETED["level"] = logging.root.manager.disable
                logging.disable(logging.WARNING)
            _QUIETED["depth"] += 1
        elif _QUIETED["depth"] > 0:
            _QUIETED["depth"] -= 1
            if _QUIETED["depth"] == 0:
                logging.disable(_QUIETED["level"])


def var_for(root: Any) -> str:
    """The name a pasted fix uses for the guarded object: ``pipe`` for a pipeline, else ``model``."""
    return "model" if root is None or isinstance(root, nn.Module) else "pipe"


def blame(odd: tuple[str, torch.dtype], lines: Sequence[str], root: Any, dicts: Collection[str],
          mpath: str | None, mtype: str | None, op: str | None, tb: Any = None) -> tuple[list[str], str, Problem]:
    """(report lines with the component first and its inputs as what fed it, the fix, the component's problem)."""
    comp, want = odd
    name = comp or "<root>"
    whole = "pipeline" if var_for(root) == "pipe" else "model"
    first = (f"culprit `{name}`: computes in float32 while the rest of the {whole} feeds it {dtype_str(want)} "
             f"(the component is the odd one out, not its inputs)")
    rest = ["fed to it: " + x[len("culprit "):].split("  (expected")[0] if x.startswith("culprit ") else x
            for x in lines]
    problem = Problem("dtype", name, "component", "float32", dtype_str(want),
                      f"`{name}` is float32 in a {dtype_str(want)} {whole}; load or cast it in {dtype_str(want)}",
                      op=op, module_path=mpath, module_type=mtype)
    fix = root_named(component_fix(comp, want, dicts).replace("model", var_for(root), 1), root, tb)  # (as held)
    return [first, *rest], fix, problem


def feeder(walk: Any, mpath: str | None, fed: Sequence[torch.Tensor], want: Any) -> tuple[str, torch.dtype] | None:
    """(component path, dtype) when the data a component's op received in another dtype can only have come from
    another component of the guarded object held whole in that dtype (an fp16 text encoder handing its output to a
    bf16 transformer): that component is the odd one out, not the data it hands on. None when none is, or several."""
    odd = {t.dtype for t in fed if isinstance(t, torch.Tensor) and t.is_floating_point()}
    if len(odd) != 1 or not isinstance(want, torch.dtype) or mpath is None:
        return None
    dt = odd.pop()
    hits = []
    for comp, _ in walk.roots:
        if not comp or mpath == comp or mpath.startswith(comp + "."):
            continue
        own = [e.tensor.dtype for e in walk.entries if (e.path.startswith(comp + ".")) and isinstance(
            e.tensor, torch.Tensor) and e.tensor.is_floating_point()]
        if own and all(d == dt for d in own):
            hits.append(comp)
    return (hits[0], dt) if len(hits) == 1 else None


def blame_feeder(odd: tuple[str, torch.dtype], want: torch.dtype, lines: Sequence[str], root: Any,
                 dicts: Collection[str], mpath: str | None, mtype: str | None, op: str | None
                 ) -> tuple[list[str], str, Problem]:
    """(report lines with the feeding component first, the fix casting it, its problem)."""
    comp, dt = odd
    whole = "pipeline" if var_for(root) == "pipe" else "model"
    first = (f"culprit `{comp}`: every tensor in it is {dtype_str(dt)} while the rest of the {whole} is "
             f"{dtype_str(want)} (its output reaches `{mpath}`: the component is the odd one out, not the data it "
             "hands on)")
    rest = [x if not x.startswith("culprit ") else "fed from it: " + x[len("culprit "):] for x in lines]
    problem = Problem("dtype", comp, "component", dtype_str(dt), dtype_str(want),
                      f"`{comp}` is {dtype_str(dt)} in a {dtype_str(want)} {whole}; load or cast it in "
                      f"{dtype_str(want)}", op=op, module_path=mpath, module_type=mtype)
    fix = component_fix(comp, want, dicts).replace("model", var_for(root), 1).splitlines()[0]
    return [first, *rest], fix, problem


def prove_fed(mod: Any, inputs: Sequence[Any], odd: torch.dtype, want: torch.dtype) -> str:
    """explain: the failing module called on its inputs with the ones in the feeding component's dtype cast."""
    label = type(mod).__name__
    if not isinstance(mod, nn.Module) or not inputs:
        return "fix unproven: the failing module's inputs are not known"
    try:
        with torch.no_grad():
            mod(*[x.to(want) if isinstance(x, torch.Tensor) and x.dtype == odd else x for x in inputs])
    except Exception as exc:  # the trial's own failure is the answer, never a crash of the report
        return f"fix unproven: {label} on its inputs in {dtype_str(want)}: {type(exc).__name__}"[:400]
    return f"fix proven: {label} runs on its inputs as the cast component gives them ({dtype_str(want)})"


def prove_op(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], tensors: Mapping[Any, Any], want: Any,
             op: Any) -> str:
    """strict: the failing op with the component's float32 operands cast to ``want``."""
    keys = [k for k, t in tensors.items() if isinstance(t, torch.Tensor) and t.dtype == torch.float32]
    return prove(func, args, kwargs, [(None, want, keys)], tensors, op)


def prove_module(mod: Any, inputs: Sequence[Any], want: torch.dtype) -> str:
    """explain: a copy of the failing module, cast to ``want``, called on the inputs it failed on."""
    label = type(mod).__name__
    if not isinstance(mod, nn.Module) or not inputs:
        return "fix unproven: the failing module's inputs are not known"
    try:
        trial = copy.deepcopy(mod).to(want)
        with torch.no_grad():
            trial(*inputs)
    except Exception as exc:  # the trial's own failure is the answer, never a crash of the report
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"fix unproven: a copy of {label} cast to {dtype_str(want)}: {type(exc).__name__}: {first}"[:400]
    return f"fix proven: a copy of {label} cast to {dtype_str(want)} runs on the inputs it failed on"


# --- a part of a component: the odd tensors belong to a submodule that is odd as a whole ----------------------------

_COPY_LIMIT = 1 << 30  # bytes of parameters and buffers a whole-forward proof may copy


def copyable(root: nn.Module) -> bool:
    """Small enough for a whole-forward re-run on a copy (a proof here, the output check's re-run)."""
    try:
        size = sum(t.nelement() * t.element_size() for t in (*root.parameters(), *root.buffers()))
    except Exception:
        return False
    return size <= _COPY_LIMIT


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def _inside(path: str, prefix: str) -> bool:
    return not prefix or path == prefix or path.startswith(prefix + ".")


def odd_groups(entries: Sequence[Any], culprits: Collection[str], value: Any,
               modules: dict[str, Any] | None = None) -> list[str] | None:
    """The submodules that hold the culprits' odd value as a whole (every floating tensor under each is ``value``,
    its parent's are not), with every other such submodule of the model that holds the same odd value (an adapter
    added in float32 to each layer): what a fix casts so that the next layer does not fail the same way. None when
    a culprit's submodule is not odd as a whole, when the odd tensors hold most of the model, or for over 64.
    ``modules`` (path -> module): the same kind is also a child of a parent of the same class (a LoRA's
    ``lora_down`` and ``lora_up`` in each of ``to_q``, ``to_k``, ``to_v``: every wrapper the program injected)."""
    floating = [(e.path, e.tensor) for e in entries if isinstance(e.tensor, torch.Tensor)
                and e.tensor.is_floating_point()]
    if not culprits or not floating:
        return None

    def uniform(prefix: str) -> bool:
        return bool(prefix) and all(_value(t) == value for p, t in floating if _inside(p, prefix))

    def _value(t: torch.Tensor) -> Any:
        return t.dtype if isinstance(value, torch.dtype) else t.device

    odd = [p for p, t in floating if _value(t) == value]
    if sum(t.numel() for p, t in floating if p in set(odd)) * 2 >= sum(t.numel() for _, t in floating):
        return None  # the odd value holds most of the model: it is the model's, not a part's
    groups: dict[str, None] = {}
    for p in odd:
        top = _parent(p)
        if not uniform(top):
            if p in culprits:
                return None  # a culprit's own module mixes values: its tensors are the fix, not a module
            continue
        while uniform(_parent(top)):
            top = _parent(top)
        groups.setdefault(top, None)
    out = [g for g in groups if not any(_inside(g, h) and g != h for h in groups)]
    # beside the culprits' own submodule, only its kind elsewhere (the same place in each layer: an adapter added
    # to every block), never an unrelated odd module the failure did not involve
    def kinds(g: str) -> set[Any]:
        parent = (modules or {}).get(_parent(g))
        return {_shape(_parent(g)), *((type(parent),) if parent is not None else ())}

    own = {k for g in out if any(_inside(c, g) for c in culprits) for k in kinds(g)}
    out = [g for g in out if kinds(g) & own]
    held = {p for p in odd if any(_inside(p, g) for g in out)}
    if held <= set(culprits) and len({_parent(p) for p in held}) < 2:
        return None  # one layer's own tensors are all it holds: they are the fix (a component of layers: cast whole)
    return out if 0 < len(out) <= 64 else None


def _shape(path: str) -> str:
    """``model.layers.3.mlp`` -> ``model.layers.#.mlp``: the same place in every layer."""
    return ".".join("#" if x.isdigit() else x for x in path.split("."))


def groups_fix(groups: Sequence[str], target: Any, root: Any, dicts: Collection[str]) -> str:
    """``model.vae.to(torch.float16)``: one line per odd submodule (a loop over their paths beyond four)."""
    from torchdoctor._guard.maps import code_path, value_code

    exprs = [code_path(g, var=var_for(root), dicts=dicts) for g in groups]
    if len(groups) > 4:  # one loop, not a line per adapter
        rows = [", ".join(exprs[i:i + 3]) for i in range(0, len(exprs), 3)]
        return "for m in (" + ",\n          ".join(rows) + f"):\n    m.to({value_code(target)})"
    return "\n".join(f"{e}.to({value_code(target)})" for e in exprs)


def prove_whole(session: Any, root: Any, apply: Any, tried: str, cast: Any = None) -> str | None:
    """Run the whole forward again on a copy of the model with ``apply(copy)`` done (the fix), on the inputs the
    model was called with (``cast``: the floating ones cast to it): a fix that breaks a later op is not proven.
    None when it cannot be re-run (a pipeline, no inputs seen, a model too large to copy): the op's own proof
    stands then."""
    inputs = tuple(session.frames.inputs_of(root)) if isinstance(root, nn.Module) else ()
    of = getattr(session.frames, "kwargs_of", None)  # (a stack of another kind: positional inputs only)
    kwargs = dict(of(root)) if of is not None and isinstance(root, nn.Module) else {}
    if cast is not None:
        inputs = tuple(x.to(cast[1]) if isinstance(x, torch.Tensor) and x.dtype == cast[0] else x for x in inputs)
        kwargs = {k: x.to(cast[1]) if isinstance(x, torch.Tensor) and x.dtype == cast[0] else x
                  for k, x in kwargs.items()}
    frames = session.frames
    if not isinstance(root, nn.Module) or not (inputs or kwargs) or session.replaying:
        return None
    if not copyable(root):
        return None
    kept = {k: copy.copy(getattr(frames, k)) for k in ("stack", "inputs", "ran", "bw") if hasattr(frames, k)}
    rng = torch.get_rng_state()
    session.replaying = True
    try:
        _quiet(True)  # a library's note on the copy's cast is no part of the report
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            trial = copy.deepcopy(root)
            apply(trial)
            trial(*inputs, **kwargs)
    except Exception as exc:  # the re-run's own failure is the answer, never a crash of the report
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"fix unproven: the whole forward re-run with {tried}: {type(exc).__name__}: {first}"[:400]
    finally:
        _quiet(False)
        session.replaying = False
        for k, v in kept.items():  # guard's stack as it was (a re-run in backward starts a new forward)
            getattr(frames, k).clear()
            getattr(frames, k).update(v) if isinstance(v, (dict, set)) else getattr(frames, k).extend(v)
        torch.set_rng_state(rng)
    return f"fix proven: the whole forward runs again on a copy of the model with {tried}"


def _with_inputs(session: Any, root: Any, apply: Any, tried: str, fix: str | None, proof: str | None, value: Any,
                 target: Any) -> tuple[str | None, list[str], str | None]:
    """A cast that leaves the model's own inputs in the culprits' old dtype (an fp32 text encoder fed fp32 by the
    caller): when the whole re-run fails, it is tried once more with those inputs cast too, and the fix says so."""
    if not (proof and proof.startswith("fix unproven") and isinstance(value, torch.dtype) and fix is not None
            and isinstance(root, nn.Module)):
        return fix, [], proof
    inputs = list(session.frames.inputs_of(root))
    names = root.forward.__code__.co_varnames[1:root.forward.__code__.co_argcount]
    odd = [f"input {i}" + (f" ({names[i]})" if i < len(names) else "") for i, x in enumerate(inputs)
           if isinstance(x, torch.Tensor) and x.dtype == value]
    if not odd:
        return fix, [], proof
    again = prove_whole(session, root, apply, f"{tried} and {', '.join(odd)} -> {dtype_str(target)}",
                        (value, target))
    if again is None or not again.startswith("fix proven"):
        return fix, [], proof
    from torchdoctor._guard.maps import value_code

    more = [f"# pass {x} as tensor.to({value_code(target)})  # it is fed to what the fix casts" for x in odd]
    return "\n".join([fix, *more]), [], again


def cast_paths(paths: Sequence[tuple[str, Any]]) -> Any:
    """``apply`` for ``prove_whole``: each (module or tensor path, target) cast or moved on the copy."""
    def apply(m: nn.Module) -> None:
        for p, target in paths:
            to = target if isinstance(target, tuple) else (target,)  # (device, dtype): both
            try:
                m.get_submodule(p).to(*to)
                continue
            except AttributeError:
                pass
            owner, _, name = p.rpartition(".")
            t = getattr(m.get_submodule(owner), name)
            t.data = t.data.to(*to)
    return apply


def widen(session: Any, maps: Any, root: Any, paths: Sequence[str], target: Any, fix: str | None,
          plain: bool = True) -> tuple[str | None, list[str], str | None]:
    """(fix, lines, proof) for culprits that are model tensors: the submodules odd as a whole when the culprits'
    are (the fix casts each; the report names them), and the whole forward re-run on a copy with the fix done.
    The proof is None when nothing could be re-run; with ``plain=False`` (fix / warn, where other problems of the
    same forward are aligned as they come) culprits that are no odd submodule are left to the op's own proof."""
    from torchdoctor._placement import dtype_str as _ds

    by = {e.path: e.tensor for e in maps.walk.entries}
    ts = [t for t in (by.get(p) for p in paths) if isinstance(t, torch.Tensor)]
    if not ts or target is None or len(ts) != len(paths):
        return fix, [], None
    dt = isinstance(target, torch.dtype)
    values = {t.dtype if dt else t.device for t in ts}
    if len(values) != 1:
        return fix, [], None
    value = values.pop()

    def show(v: Any) -> str:  # (device, dtype): both, as a fix that mends both says them
        return " and ".join(show(x) for x in v) if isinstance(v, tuple) else _ds(v) if isinstance(
            v, torch.dtype) else str(v)
    groups = odd_groups(maps.walk.entries, set(paths), value, dict(maps.walk.modules))
    if groups is None:
        if not plain:
            return fix, [], None
        tried = f"{', '.join(paths)} -> {show(target)}"
        proof = prove_whole(session, root, cast_paths([(p, target) for p in paths]), tried)
        return _with_inputs(session, root, cast_paths([(p, target) for p in paths]), tried, fix, proof, value, target)
    whole = "pipeline" if var_for(root) == "pipe" else "model"
    lines = [f"culprit `{g}`: every tensor in it is {show(value)} while the rest of the {whole} is {show(target)} "
             f"({_held(maps.walk.entries, g, value)}; the component is the odd one out: aligning only this op's "
             f"tensors leaves its next layer failing)" for g in groups]
    tried = f"{', '.join(f'`{g}`' for g in groups)} -> {show(target)}"
    proof = prove_whole(session, root, cast_paths([(g, target) for g in groups]), tried)
    failed = proof is not None and proof.startswith("fix unproven: the whole forward re-run")
    if failed and isinstance(value, torch.dtype) and isinstance(target, torch.dtype) and \
            (other := _other_side(session, maps, root, groups, target, value, whole)) is not None:
        return other[0], other[1] + [f"(the other way fails: {(proof or '').removeprefix('fix unproven: ')})"], other[2]
    return groups_fix(groups, target, root, maps.dicts), lines, proof or f"fix unproven: {tried} not re-run " \
        f"(the {whole}'s inputs are not known here, or it is too large to copy)"


def _other_side(session: Any, maps: Any, root: Any, groups: Sequence[str], target: torch.dtype, value: torch.dtype,
                whole: str) -> tuple[str, list[str], str] | None:
    """When casting the odd-looking groups to ``target`` fails the whole forward (the model's tensors in ``target``
    are fewer but larger: one float16 weight merged into a bfloat16 model, its elements outvoting the rest), the
    fewer tensors in ``target`` cast to ``value`` instead, proven by the same re-run; None when that fails too."""
    floating = [e for e in maps.walk.entries if isinstance(e.tensor, torch.Tensor) and e.tensor.is_floating_point()
                and e.alias_of is None]
    theirs = [e.path for e in floating if e.tensor.dtype == target]
    mine = sum(1 for e in floating if e.tensor.dtype == value and any(_inside(e.path, g) for g in groups))
    if not theirs or len(theirs) >= mine:
        return None
    # their modules, whole (odd_groups refuses tensors that hold most of the model's elements: these do)
    odd = odd_groups(maps.walk.entries, theirs, target) or sorted({p.rpartition(".")[0] for p in theirs})
    if "" in odd or any(e.tensor.dtype != target for e in floating for g in odd if _inside(e.path, g)):
        return None
    tried = f"{', '.join(f'`{g}`' for g in odd)} -> {dtype_str(value)}"
    proof = prove_whole(session, root, cast_paths([(g, value) for g in odd]), tried)
    if proof is None or not proof.startswith("fix proven"):
        return None
    lines = [f"culprit `{g}`: every tensor in it is {dtype_str(target)} while the rest of the {whole} is "
             f"{dtype_str(value)} ({_held(maps.walk.entries, g, target)}; fewer tensors, though larger: the "
             f"{dtype_str(value)} side is the model's dtype)" for g in odd]
    return groups_fix(odd, value, root, maps.dicts), lines, proof


def _held(entries: Sequence[Any], group: str, value: Any) -> str:
    """``41 tensors: vae.decoder.conv_in.weight, vae.decoder.conv_in.bias, ...``: what one fix of the group casts."""
    paths = [e.path for e in entries if isinstance(e.tensor, torch.Tensor) and e.tensor.is_floating_point()
             and e.alias_of is None and _inside(e.path, group)
             and (e.tensor.dtype if isinstance(value, torch.dtype) else e.tensor.device) == value]
    return f"{len(paths)} tensor{'s' if len(paths) != 1 else ''}: {', '.join(paths[:3])}" + (
        ", ..." if len(paths) > 3 else "")


_GROUP = re.compile(r"^culprit `([^`]*)`: (?:every tensor in it is|computes in) ")
_ALSO = "also off-policy, not involved in this failure: "


def groups_of(lines: Sequence[str]) -> list[str]:
    """The components a report's lines name as the odd one out (``culprit `vae`: every tensor in it ...``)."""
    return [m.group(1) for x in lines if (m := _GROUP.match(x))]


def fold_also(lines: Sequence[str]) -> list[str]:
    """The report's lines without the "also off-policy" ones inside a component the report names as the culprit:
    that component's one finding counts them and its one fix casts them."""
    groups = groups_of(lines)
    if not groups:
        return list(lines)
    return [x for x in lines if not (x.startswith(_ALSO) and any(
        _inside(x[len(_ALSO):].split(":", 1)[0], g) for g in groups if g not in ("", "<root>")))]

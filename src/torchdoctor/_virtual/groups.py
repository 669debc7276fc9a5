"""Findings with one cause said once: many tensors of one object left behind (a network whose ``.to`` was
forgotten: every ``lora_down`` / ``lora_up`` of it on the cpu) read as one line with the count and a few paths,
in the text of a virtual run's error and report. The problem list itself keeps every problem, by path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from torchdoctor._report.model import Problem
from torchdoctor._report.text import render_problems

GROUP = 4  # this many tensors with one cause print as one finding
_ROLES = ("parameter", "buffer")
_SHOWN = 3  # paths named in the grouped line


def _owner(paths: list[str]) -> str:
    """The longest dotted prefix the modules holding ``paths`` share ("" when only the root)."""
    parts = [p.split(".")[:-1] for p in paths]
    common: list[str] = []
    for segs in zip(*parts):
        if len(set(segs)) != 1:
            break
        common.append(segs[0])
    return ".".join(common)


def grouped(problems: Sequence[Problem], culprits: int,
            networks: Sequence[str] = ()) -> tuple[list[Problem], int]:
    """``problems`` with each group of at least ``GROUP`` tensors of one cause (one kind, found, expected and
    module type; parameters and buffers) replaced by one problem at the first one's place; and how many of the
    result are culprits (the first ``culprits`` of ``problems`` were). ``networks``: the names the program holds
    networks patched into a model's forward by (``network``): a group of one of those is said as that network."""
    keys: dict[tuple[str, ...], list[int]] = {}
    for i, p in enumerate(problems):
        if p.kind in ("device", "dtype") and p.role in _ROLES:
            keys.setdefault((p.kind, p.found, p.expected, p.module_type or "", str(i < culprits)), []).append(i)
    first: dict[int, list[int]] = {ix[0]: ix for ix in keys.values() if len(ix) >= GROUP}
    skip = {i for ix in first.values() for i in ix[1:]}
    out: list[Problem] = []
    kept = 0
    for i, p in enumerate(problems):
        if i in skip:
            continue
        members = first.get(i)
        if members is not None:
            p = _one(p, [problems[j].path for j in members], networks)
        out.append(p)
        kept += i < culprits
    return out, kept


def _one(p: Problem, paths: list[str], networks: Sequence[str] = ()) -> Problem:
    owner = _owner(paths)
    net = owner.split(".")[0] if owner else ""
    if net in networks and p.kind == "device":
        shown = ", ".join(paths[:_SHOWN]) + (", ..." if len(paths) > _SHOWN else "")
        message = (f"the LoRA network was not moved: `{net}.to(device)` ({net}.to({p.expected!r})): {len(paths)} "
                   f"tensors of `{net}`, patched into the model's forward, are on {p.found} while the run is on "
                   f"{p.expected}; e.g. {shown}")
        return replace(p, path=net, message=message, tensors=tuple(paths))
    held = f"{owner}" if owner else "model"
    via = " (a network patched into the model's forward)" if all(".forward.__self__." in x for x in paths) else ""
    what = f"{p.module_type} modules of the " if p.module_type and not owner else \
        f"{p.module_type} modules of " if p.module_type else ""
    shown = ", ".join(paths[:_SHOWN]) + (", ..." if len(paths) > _SHOWN else "")
    fix = f"{owner}.to({p.expected!r})" if owner else f"model.to({p.expected!r})"
    if owner and all(x[len(owner) + 1:].split(".", 1)[0].isdigit() for x in paths):  # numbered: a plain list has no
        fix = f"torchdoctor.move({owner}, {p.expected!r})"  # .to (``self.heads = [nn.Linear(...), ...]``)
    if via:
        fix = f"network.to({p.expected!r}) where the network is built"
    message = (f"{len(paths)} tensors of the {what}{held}{via} are on {p.found} while the run is on {p.expected}: "
               f"it was not moved ({fix}); e.g. {shown}") if p.kind == "device" else \
        (f"{len(paths)} tensors of the {what}{held}{via} are {p.found} while the run computes in {p.expected}: it "
         f"was not cast; e.g. {shown}")
    return replace(p, path=owner or p.path, message=message, tensors=tuple(paths))


def at_entry(p: Problem) -> bool:
    """Found by a module-entry check (a tensor the module owns, by path), or a model tensor on meta: culprits."""
    return p.role != "activation" and (p.kind == "meta" or p.op is not None and p.op.endswith(".forward") and
                                       p.module_path is not None)


def culprits_then_rest(problems: tuple[Problem, ...], n: int, limit: int) -> list[str]:
    """The culprits' lines, then where they surfaced."""
    if not n or n >= len(problems):
        return render_problems(problems, limit)
    return [*render_problems(problems[:n], limit), "  where they surfaced:",
            *render_problems(problems[n:], max(1, limit - n))]


def whole_component(culprits: list[tuple[str | None, str, str, Any]], have: Mapping[str, tuple[Any, Any]]
                    ) -> tuple[list[Any], list[tuple[str | None, str, str, Any]]]:
    """Culprits cast to one dtype that are all inside one component whose every floating tensor is in another dtype
    while the rest of the model is in the one asked (an fp32 ControlNet beside a bf16 UNet): that component is the
    culprit and the fix casts it (``model.controlnet.to(torch.bfloat16)``), never the whole model, never each tensor.
    The component is the outermost module holding them whose floating tensors are all in that other dtype."""
    from torchdoctor._guard.maps import code_path, value_code
    from torchdoctor._virtual.prove import Fix

    cast = [c for c in culprits if c[0] is not None and c[2] == "dtype" and isinstance(c[3], torch.dtype)]
    if len(cast) < 2 or len({c[3] for c in cast}) != 1 or any(c[0] not in have for c in cast):
        return [], culprits
    want, found = cast[0][3], {have[str(c[0])][0] for c in cast}
    floating = {p: dt for p, (dt, _) in have.items() if getattr(dt, "is_floating_point", False)}
    owner, comp = _owner([str(c[0]) for c in cast]).split("."), None
    for n in range(1, len(owner) + 1):  # outermost first
        prefix = ".".join(owner[:n]) + "."
        inside = {dt for p, dt in floating.items() if p.startswith(prefix)}
        if owner[0] and inside == found and len(found) == 1 and \
                any(dt == want for p, dt in floating.items() if not p.startswith(prefix)):
            comp = prefix[:-1]
            break
    if comp is None:
        return [], culprits
    (was,) = found
    held = [p for p in floating if p.startswith(comp + ".")]
    if all(p[len(comp) + 1:].isdigit() for p in held):  # a tuple or list of tensors (rope tables): no .to of its own
        c = code_path(comp)
        return [Fix(f"{c} = type({c})(t.to({value_code(want)}) for t in {c})  # every tensor of {comp} is "
                    f"{str(was)[6:]} while the rest of the model is {str(want)[6:]}", "path", want,
                    sets=tuple((p, want) for p in held))], [c for c in culprits if c not in cast]
    fix = Fix(f"{code_path(comp)}.to({value_code(want)})  # every floating tensor of {comp} is "
              f"{str(was)[6:]} while the rest of the model is {str(want)[6:]}: cast that component (or load it with "
              f"torch_dtype={value_code(want)})", "path", want, sets=((comp + ".", want),))
    return [fix], [c for c in culprits if c not in cast]


def policy_blamed(problems: list[Problem], roots: list[Any], have: set[str], split: bool,
                  sources: Mapping[tuple[str, ...], tuple[str, ...]]) -> list[Problem]:
    """The culprits of a run: the model tensors the placement policy finds off that match what the ops found wrong
    and that reached them (an operand, or a tensor one made in the run came from). ``split``: the program placed the
    model's parts on several devices itself, so only dtypes are judged."""
    kinds = {p.kind for p in problems} & ({"dtype"} if split else {"dtype", "device"})  # parts as placed
    bad = {p.found for p in problems if p.kind in kinds}
    if not bad:
        return []
    from torchdoctor._guard.provenance import policy_problems, suspects  # culprits: only when there are some
    from torchdoctor._walk import walk
    blamed: list[Problem] = []  # data flow: a tensor an op met, or one that a tensor made in the run came from
    reached = {p.path for p in problems} | {s for v in sources.values() for s in v}
    try:
        for root in roots:
            found = policy_problems(walk(root))
            for kind in sorted(kinds):
                for sus in suspects(found, kind, bad, [], None):
                    if sus.matches and sus.problem.path not in have and sus.problem.path in reached:
                        have.add(sus.problem.path)
                        blamed.append(replace(sus.problem, message=f"culprit: {sus.problem.message}"))
    except Exception:  # provenance is extra: the problems stand without it
        return []
    return blamed


def picked(groups: Mapping[Any, Any], asked: torch.device) -> torch.device:
    """The device a mismatch is judged against: the one asked for where an operand is on it, else the one of its
    kind the program picked itself (``cuda:0`` under ``--device cuda:1``) where every other operand is on the cpu
    (a caller's ``torch.arange`` meeting the model's side), else the one asked for."""
    if asked in groups:
        return asked
    same = [v for v in groups if isinstance(v, torch.device) and v.type == asked.type]
    rest = [v for v in groups if v not in same]
    return same[0] if len(same) == 1 and rest and all(v.type == "cpu" for v in rest) else asked


def root_holds(stack: Sequence[Any], path: str) -> bool:
    """The outermost running module holds a Parameter at ``path``: asked when no model of the run was seen moved
    (its layers placed by hooks of the program's own), whose own parameters are still parameters."""
    if not stack or not isinstance(stack[0], torch.nn.Module):
        return False
    owner, _, name = path.rpartition(".")
    try:
        mod = stack[0].get_submodule(owner) if owner else stack[0]
    except AttributeError:
        return False
    return name in getattr(mod, "_parameters", {})

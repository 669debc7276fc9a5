"""One cause, one finding in ``torchdoctor run``'s report: problems that are one tensor or one model said once.

A virtual run records a problem per op that meets a misplaced tensor. One cpu tensor handed to a UNet reaches every
cross-attention ``to_k`` / ``to_v`` (16 problems for one ``torch.cat``); one model a manager offloaded between prompts
reaches every layer (a dozen problems, some already folded by module type). The report says each such cause once:

- the same operand: problems whose tensor has one description (the same maker, argument and made-at line) and the
  same compact form, wherever the op runs, read as that tensor reaching N ops (``to_k, to_v in 8 attn2 modules``);
- the same model: parameters and buffers of one root module found on one device, read as that model's N tensors;
- the same call's arguments: tensors made in the model from arguments of one call that one line of the program made
  (``embeds.cpu()``, ``mask.cpu()`` parked between a pipeline's stages), read as those arguments reaching N ops.

The problem list itself (``--json``'s ``problems``) keeps every problem; ``causes`` names each cause's members.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

# a device problem's operand (``is on cpu while aten.mm.default runs on cuda:0``) or a dtype one's (``is float32
# while aten.scaled_dot_product_attention.default computes in bfloat16``)
_OPERAND = re.compile(r"^(?P<desc>.+?) (?P<form>[a-z0-9_]+\[[^\]]*\]@\S+) is (?:on )?(?P<found>\S+) while (?P<op>\S+) "
                      r"(?:runs on|computes in) (?P<on>\S+)")
_FROM = re.compile(r" from (?P<path>[\w.]+) \((?P<found>[^)]+)\)")  # a tensor made in forward from a named one
_MADE_AT = re.compile(r" at \S+:\d+")  # a description that names the line its tensor was made at
_IN = re.compile(r" in `[^`]*`")  # the module an op's view was taken in: one tensor, many modules
_AFTER = re.compile(r", \d+ ops? after (?P<src>aten\.\w+ in `[^`]*` from .+)$")  # the op whose output it came from
_ARG = re.compile(r"(?P<name>[\w.]+) \(an argument of the (?P<call>\S+) call, made by (?P<maker>`[^`]*`|\S+) at "
                  r"(?P<at>\S+:\d+)\)")  # what a tensor made in the model came from: the caller's argument
_ROLES = ("parameter", "buffer")
# a model tensor's move refused in its dtype: ``data_mean f64[1]@cpu (made by torch.from_numpy at app.py:16) moved to
# mps:0 as float64: mps cannot hold float64 tensors``
_REFUSED = re.compile(r"^(?P<path>[\w.]+) (?P<form>\S+@\S+)(?P<made> \(made by [^)]*\))? moved to (?P<to>\S+) as "
                      r"(?P<dtype>\w+)(?P<why>: .*)?$")
_SHOWN = 3


class Cause:
    """One cause: the line it is shown as (a ``Problem``) and its members' paths."""

    __slots__ = ("shown", "members", "first")

    def __init__(self, shown: Any, members: list[str], first: Any = None) -> None:
        self.shown, self.members, self.first = shown, members, first if first is not None else shown

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.shown.path, "message": self.shown.message, "problems": list(self.members)}


def _paths(p: Any) -> list[str]:
    """The tensor paths a problem stands for: a folded problem's members, else its own (a single problem's
    ``tensors`` are its op's operands as ``arg 0 (self): f32[16]@cpu``, not paths)."""
    return list(p.tensors) if p.tensors and not any(" " in t for t in p.tensors) else [p.path]


def _own(path: str) -> str:
    """A tensor's path as its model names it: an op's operand read off ``self`` (``self.enc.norm.bias``)."""
    return path[5:] if path.startswith("self.") else path


def causes(problems: Sequence[Any], roots: Sequence[tuple[Any, ...]] = ()) -> list[Cause]:
    """``problems`` (already folded by module type) as causes, in the order their first member came.
    ``roots``: the run's outermost modules, each as (class name, its parameter and buffer paths[, the devices they
    are on])."""
    owner: dict[int, int] = {}  # problem index -> index of the root that holds all its tensors
    for i, p in enumerate(problems):
        if p.kind != "device" or not (p.role in _ROLES or p.path.startswith("self.")):
            continue
        paths = [_own(x) for x in _paths(p)]
        hit = [r for r, root in enumerate(roots) if all(x in root[1] for x in paths)]
        if len(hit) == 1:
            owner[i] = hit[0]
    keys: dict[tuple[Any, ...], list[int]] = {}
    for i, p in enumerate(problems):
        if i in owner:
            keys.setdefault(("model", owner[i], p.found, p.expected), []).append(i)
            continue
        if p.kind == "device" and p.role == "quant_state" and p.module_type:  # the state of many quantized layers
            keys.setdefault(("state", p.module_type, p.found, p.expected), []).append(i)  # left behind: one mover
            continue
        moved = _REFUSED.match(p.message or "") if p.kind == "unsupported_dtype" and not p.path.startswith("<") \
            else None
        if moved is not None:  # model tensors one move sends to a device that cannot hold their dtype: one move
            keys.setdefault(("refused", p.found, moved.group("to")), []).append(i)
            continue
        m = _OPERAND.match(p.message or "")
        attr = _attribute(p, m)
        if attr is not None:  # one plain attribute of one class (``QLinear.scale``) in many of its modules
            keys.setdefault(("attribute", p.kind, p.module_type, attr, m.group("op") if m else "", p.found,
                             p.expected), []).append(i)
            continue
        after = _AFTER.search(m.group("desc")) if m is not None and p.role not in _ROLES else None
        if m is not None and after is not None and not _MADE_AT.search(m.group("desc")):  # views of what one op
            keys.setdefault(("after", p.kind, after.group("src"), p.found, m.group("on")), []).append(i)
            continue  # made, met by many layers (a projector's float32 output in a bfloat16 model's stream): one cause
        if p.role in _ROLES or m is None or not _MADE_AT.search(m.group("desc")):
            keys.setdefault(("one", i), []).append(i)
            continue
        arg = _ARG.search(m.group("desc"))
        if arg is not None and arg.start() > 0 and p.kind == "device":  # made from arguments of one call made at
            # one line (the argument itself, as it is, is one operand below): one cause
            keys.setdefault(("arguments", arg.group("call"), arg.group("maker"), arg.group("at"), p.found,
                             m.group("on")), []).append(i)
            continue
        keys.setdefault(("operand", p.kind, _IN.sub("", m.group("desc")), m.group("form"), m.group("on")),
                        []).append(i)
    out: list[tuple[int, Cause]] = []
    keys, joined = _with_their_tensor(problems, keys)
    for key, ix in keys.items():
        if joined.get(ix[0]):
            out.append((ix[0], _joined(_causes_of(problems, key, ix, roots), [problems[i] for i in joined[ix[0]]])))
        elif len(ix) < 2 or key[0] == "one":
            out += [(i, Cause(problems[i], _paths(problems[i]))) for i in ix]
        else:
            out.append((ix[0], _causes_of(problems, key, ix, roots)))
    return [c for _, c in sorted(out, key=lambda x: x[0])]


def _causes_of(problems: Sequence[Any], key: tuple[Any, ...], ix: list[int],
               roots: Sequence[tuple[Any, ...]]) -> Cause:
    """The one cause of ``problems[ix]`` under ``key``, shown as ``causes`` shows it."""
    members = [problems[i] for i in ix]
    paths = [x for p in members for x in _paths(p)]
    if len(ix) < 2 or key[0] == "one":
        return Cause(members[0], paths)
    if key[0] == "attribute":
        return Cause(_attr(members, str(key[2]), str(key[3]), str(key[4])), paths, members[0])
    if key[0] == "arguments":
        return Cause(_arguments(members, *(str(k) for k in key[1:])), paths, members[0])
    if key[0] == "state":
        return Cause(_state(members, str(key[1])), paths, members[0])
    if key[0] == "refused":
        return Cause(_refused(members, str(key[1]), str(key[2])), paths, members[0])
    if key[0] == "after":
        return Cause(_after(members, str(key[2]), str(key[3]), str(key[4]), str(key[1])), paths, members[0])
    if key[0] == "model":
        return Cause(_model(members, paths, roots[key[1]]), paths, members[0])
    return Cause(_operand(members, key[2], key[3], key[4], key[1]), paths, members[0])


def _with_their_tensor(problems: Sequence[Any], keys: dict[tuple[Any, ...], list[int]]
                       ) -> tuple[dict[tuple[Any, ...], list[int]], dict[int, list[int]]]:
    """``keys`` with the problems of the ops that met a named tensor joined to that tensor's own problem: one fix
    (the tensor moved or cast, or the line that made it) is one cause however many ops met it. An op's problem
    joins when its operand was made in forward from a tensor another problem names (``a tensor made in forward from
    layers.0.q.lora_A (cpu)``, the group of LoRA tensors left on the cpu), and the dtype problem the same op met
    once the run went on with that operand on the device (same module, op, dtype and shape) joins it too."""
    named: dict[tuple[str, str, str], int] = {}  # (kind, tensor path, found) -> the problem that names it
    for i, p in enumerate(problems):
        for x in _paths(p):
            named.setdefault((p.kind, _own(x), p.found), i)
    home: dict[int, int] = {}  # problem index -> the problem it joins
    first: dict[str, int] = {}  # tensor path -> the first problem of a group that names it (any kind)
    for i, p in enumerate(problems):
        if p.role in _ROLES and len(_paths(p)) > 1:
            for x in _paths(p):
                first.setdefault(_own(x), i)
    for i, p in enumerate(problems):
        hit = _FROM.search(p.message or "")
        j = named.get((p.kind, hit.group("path"), hit.group("found")), i) if hit is not None else i
        if j != i and hit is not None and hit.group("found") == p.found:
            home[i] = j
        elif len(_paths(p)) == 1 and (g := first.get(_own(p.path), i)) != i:
            home[i] = g  # a tensor of a group found off in the other kind too (its dtype beside its device): one fix
    for i, p in enumerate(problems):  # the same operand's dtype, met at the same op after its device was fixed
        if i in home or p.kind != "dtype":
            continue
        m = _OPERAND.match(p.message or "")
        twin = next((j for j in home if _same_operand(problems[j], p, m)), None) if m is not None else None
        if twin is not None:
            home[i] = home[twin]
    if not home:
        return keys, {}
    out: dict[tuple[Any, ...], list[int]] = {}
    for key, ix in keys.items():
        if (rest := [i for i in ix if i not in home]):
            out[key] = rest
    joined: dict[int, list[int]] = {}  # a cause's first member -> the op problems joined to it
    for i, j in home.items():
        for _ in range(len(home)):  # joined to a problem that joined another: the one it joined
            j = home.get(j, j)
        lead = next((v[0] for v in out.values() if j in v), None)
        if lead is not None:
            joined.setdefault(lead, []).append(i)
        else:  # never lost from the report
            out[("one", i)] = [i]
    return out, joined


def _same_operand(device: Any, p: Any, m: Any) -> bool:
    """``p`` (a dtype problem) met the operand of the device problem ``device`` at the same op of the same module:
    its form is that operand's, on the device the run moved it to."""
    d = _OPERAND.match(device.message or "")
    return device.kind == "device" and d is not None and device.module_path == p.module_path and \
        device.op == p.op and d.group("form").split("@")[0] == m.group("form").split("@")[0]


def _joined(cause: Cause, met: list[Any]) -> Cause:
    """``cause`` with the problems of the ops that met its tensors counted in its line and its members."""
    said = []
    for kind in dict.fromkeys(p.kind for p in met):
        ps = [p for p in met if p.kind == kind]
        where = list(dict.fromkeys(p.module_path or p.path for p in ps))
        inside = f"in {', '.join(where[:_SHOWN])}{', ...' if len(where) > _SHOWN else ''}"
        said.append(f"{len(ps)} op(s) met them {inside}" if kind == cause.shown.kind else
                    f"they are {ps[0].found} where {len(ps)} op(s) compute in {ps[0].expected} ({inside})"
                    if kind == "dtype" else f"{len(ps)} op(s) met them on {ps[0].found} ({inside})")
    shown = replace(cause.shown, message=f"{cause.shown.message}; one cause: {'; '.join(said)}")
    return Cause(shown, [*cause.members, *(x for p in met for x in _paths(p))], cause.first)


def _attribute(p: Any, m: Any) -> str | None:
    """The attribute's name when ``p`` is about a tensor its module holds as a plain attribute (``2.scale`` read in
    module ``2``, a ``QLinear``: not a parameter or buffer, met as an op's operand)."""
    if p.kind != "device" or p.role in _ROLES or not p.module_type or not p.module_path or m is None:
        return None
    mpath, _, leaf = p.path.rpartition(".")
    return leaf if mpath == p.module_path and leaf.isidentifier() and m.group("desc") == p.path else None


def _attr(members: list[Any], cls: str, name: str, op: str) -> Any:
    first = members[0]
    where = list(dict.fromkeys(p.module_path for p in members))
    shown = ", ".join(f"{w}.{name}" for w in where[:_SHOWN]) + (", ..." if len(where) > _SHOWN else "")
    message = (f"{cls}.{name}, a plain tensor attribute, is on {first.found} in {len(where)} {cls} modules while "
               f"{op} runs on {first.expected}: one cause, {len(members)} line(s) folded; {shown}")
    return replace(first, path=f"{cls}.{name}", message=message, tensors=tuple(p.path for p in members))


def _state(members: list[Any], cls: str) -> Any:
    """The quantization state of many quantized layers left on one device (a stream of ``p.data`` swaps moved each
    weight, not the state hanging off it), said once: how many layers, which parts, why."""
    first = members[0]
    layers = list(dict.fromkeys(p.module_path or p.path for p in members))
    parts = list(dict.fromkeys(p.path.rpartition("quant_state.")[2] for p in members))
    why = (first.message or "").partition(": ")[2] if ": " in (first.message or "") else ""
    message = (f"the quantization state ({', '.join(parts[:_SHOWN])}) of {len(layers)} {cls} layers is on "
               f"{first.found} when they start on {first.expected}" + (f": {why}" if why else "") +
               f"; one cause, {len(members)} line(s) folded; e.g. {', '.join(layers[:_SHOWN])}"
               f"{', ...' if len(layers) > _SHOWN else ''}")
    return replace(first, path=f"{cls}.weight.quant_state", message=message, tensors=tuple(p.path for p in members))


def _refused(members: list[Any], found: str, to: str) -> Any:
    """Model tensors one move sent to a device that cannot hold their dtype, said once with each one's maker."""
    first = members[0]
    said = []
    for p in members:
        hit = _REFUSED.match(p.message or "")
        said.append(p.path + (hit.group("made") or "" if hit is not None else ""))
    head = _REFUSED.match(first.message or "")
    tail = head.group("why") or "" if head is not None else ""
    message = (f"{len(members)} tensors of the model moved to {to} as {found}{tail}; one cause, {len(members)} "
               f"line(s) folded: {', '.join(said[:_SHOWN])}{', ...' if len(said) > _SHOWN else ''}")
    return replace(first, message=message, tensors=tuple(p.path for p in members))


def _model(members: list[Any], paths: list[str], root: tuple[Any, ...]) -> Any:
    first = members[0]
    own = list(dict.fromkeys(_own(x) for x in paths))
    shown = ", ".join(own[:_SHOWN]) + (", ..." if len(own) > _SHOWN else "")
    whole = len(own) == len(root[1])
    if not whole and len(root) > 2 and root[2] == {first.found}:  # all of it there, some of it read (``vae.decode``)
        message = (f"the {root[0]} model is on {first.found} (all its {len(root[1])} tensors; {len(own)} read here) "
                   f"while the run is on {first.expected}: it was left there (offloaded, or not moved, before this "
                   f"use); one cause, {len(members)} line(s) folded; e.g. {shown}")
        return replace(first, path=root[0], message=message, tensors=tuple(paths))
    # some of them only: the rest of the model was moved, so these were skipped (a placement of its layers that
    # leaves out the Parameters no layer owns), not the model left behind
    why = f"the {root[0]} model was left there (offloaded, or not moved, before this use)" if whole else \
        f"they were not moved with the rest of the {root[0]} model (a placement of its layers that skips them, or " \
        f"a move that missed them)"
    message = (f"{root[0]}'s {len(own)} tensors ({'all of them' if whole else f'of its {len(root[1])}'}) are on "
               f"{first.found} while the run is on {first.expected}: {why}; one cause, {len(members)} line(s) folded; "
               f"e.g. {shown}")
    return replace(first, path=root[0], message=message, tensors=tuple(paths))


def _operand(members: list[Any], desc: str, form: str, on: str, kind: str = "device") -> Any:
    first = members[0]
    where = [p.module_path or p.path for p in members]
    leaves = list(dict.fromkeys(w.rsplit(".", 1)[-1] for w in where))
    parents = list(dict.fromkeys(w.rsplit(".", 1)[0] for w in where if "." in w))
    kinds = {x.rsplit(".", 1)[-1] for x in parents}
    noun = f"{kinds.pop()} modules" if len(kinds) == 1 and not next(iter(kinds)).isdigit() else "modules"
    inside = f" in {len(parents)} {noun}" if len(parents) > 1 else f" in {parents[0]}" if parents else ""
    ops = len(members)
    said = f"is on {first.found} while the run is on {on}" if kind == "device" else \
        f"is {first.found} while the ops compute in {on}"
    message = (f"{desc} {form} {said}: one tensor reaches {ops} ops: "
               f"{', '.join(leaves[:6])}{', ...' if len(leaves) > 6 else ''}{inside}"
               + (f" ({', '.join(parents[:_SHOWN])}{', ...' if len(parents) > _SHOWN else ''})"
                  if len(parents) > 1 else ""))
    name = re.search(r"(?:^| from )([\w.]+) \(", desc)  # the operand as the call names it (an argument)
    return replace(first, path=name.group(1) if name else first.path, message=message,
                   tensors=tuple(x for p in members for x in _paths(p)))


def _after(members: list[Any], src: str, found: str, on: str, kind: str) -> Any:
    """Tensors computed from the output of one op (``aten.addmm in `<root>` from bias and weight``), met by many
    layers downstream: one cause, said once with the layers it reached."""
    first = members[0]
    where = list(dict.fromkeys(p.module_path or p.path for p in members))
    said = f"on {found} while the run is on {on}" if kind == "device" else f"{found} while the ops compute in {on}"
    message = (f"tensors computed from {src} are {said}: one cause, {len(members)} ops reached in "
               f"{', '.join(where[:_SHOWN])}{', ...' if len(where) > _SHOWN else ''}")
    return replace(first, message=message, tensors=tuple(x for p in members for x in _paths(p)))


def _arguments(members: list[Any], call: str, maker: str, at: str, found: str, on: str) -> Any:
    first = members[0]
    names = list(dict.fromkeys(hit.group("name") for p in members if (hit := _ARG.search(p.message or ""))))
    what = f"{names[0]} (an argument" if len(names) == 1 else f"{', '.join(names)} (arguments"
    leaves = list(dict.fromkeys((p.module_path or p.path).rsplit(".", 1)[-1] for p in members))
    message = (f"{what} of the {call} call, made by {maker} at {at}) {'is' if len(names) == 1 else 'are'} on {found} "
               f"while the run is on {on}: one cause, {len(members)} ops reached: {', '.join(leaves[:6])}"
               f"{', ...' if len(leaves) > 6 else ''}")
    return replace(first, path=names[0] if names else first.path, message=message,
                   tensors=tuple(x for p in members for x in _paths(p)))

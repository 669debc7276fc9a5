"""The odd component of a pipeline, found by what fed the failing op: an fp16 text encoder hands its output to a bf16
transformer, and the transformer's ops find their own weights "bfloat16 while the op computes in float16". Casting the
transformer (the consumer, and most of the pipeline) to float16 is the wrong side: the text encoder is the one
component in the other dtype, so it is cast (``pipe.text_encoder.to(torch.bfloat16)``), as guard's component rule says
for the same program. The components vote: the feeder is cast to the consumer's dtype unless more components are held
whole in the feeder's dtype than in the consumer's (then the consumer is the odd one, and the fix stands as written).

Data flow decides who fed: a failing op must have met, beside the consumer's own tensor, an operand of the feeder's
dtype computed from the feeder's tensors (the names the run's failing ops carry, ``atop.tags_of``). A feeder is a
module the program runs apart from the model (its paths are its own) or a top-level part of the model; in both cases
every floating tensor of it is in the feeder's dtype.
"""

from __future__ import annotations

import linecache
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchdoctor._virtual.apart import Apart
from torchdoctor._virtual.prove import Fix

Culprit = tuple[str | None, str, str, Any]


def odd_feeder(culprits: list[Culprit], have: Mapping[str, tuple[Any, Any]], apart: Sequence[Apart],
               cases: Sequence[Any], asked: torch.dtype | None = None) -> tuple[list[Fix], list[Culprit]]:
    """(the fix casting the feeding component, the culprits it replaces taken out), or ``([], culprits)`` when the
    consumer is the odd one, nothing fed it, or the cases do not show who did. ``asked``: the dtype the run was
    asked to check (a cast of the culprits to it is the fix as written)."""
    cast = [c for c in culprits if c[0] is not None and c[2] == "dtype" and isinstance(c[3], torch.dtype)]
    if not cast or not cases or len({c[3] for c in cast}) != 1 or any(c[0] not in have for c in cast) or \
            asked is not None and cast[0][3] == asked:
        return [], culprits  # (cast to the dtype the run asked for: the culprits are what is off, as said)
    fed = cast[0][3]  # the dtype the consumer's ops computed in: the feeder's
    found = {have[str(c[0])][0] for c in cast}
    if len(found) != 1:
        return [], culprits
    (own,) = found  # the consumer's dtype
    paths = {str(c[0]) for c in cast}
    floating = {p: dt for p, (dt, _) in have.items() if getattr(dt, "is_floating_point", False)}
    met = _fed_tags(cases, paths, fed)
    if met is None:
        return [], culprits
    hit = _apart_feeder(met, floating, apart, fed) or _inner_feeder(met, floating, paths, fed, own)
    if hit is None:
        return [], culprits
    comp, mod = hit
    mine, theirs = _votes(comp, mod, floating, apart, own), _votes(comp, mod, floating, apart, fed)
    if mine < theirs or (mine == theirs and mod is None):
        # more components are in the feeder's dtype: the consumer is the odd one; two parts of one model, one each
        # (a head built after the model's cast fed by its encoder): nothing says which is odd, the fix stays as written
        return [], culprits
    rest = [c for c in culprits if c not in cast]
    # the consumer stays as it is: what its ops compute from its own tensors is then in its dtype (the run went on
    # with them cast to the feeder's, so its later failing ops met operands made in that dtype)
    kept = tuple(dict.fromkeys((p.split(".", 1)[0] + "." if "." in p else p, own) for p in sorted(paths)))
    if isinstance(mod, Apart):
        fix = _apart_fix(mod, own, fed, floating)
        fix.sets += kept
        return [fix], rest
    from torchdoctor._guard.maps import code_path, value_code
    return [Fix(f"{code_path(comp)}.to({value_code(own)})  # every floating tensor of {comp} is {_s(fed)} while the "
                f"component it feeds is {_s(own)}, as most of the model: cast {comp} (or load it with "
                f"torch_dtype={value_code(own)})", "path", own, sets=((comp + ".", own), *kept))], rest


def _s(dt: torch.dtype) -> str:
    return str(dt)[6:]


def _fed_tags(cases: Sequence[Any], paths: set[str], fed: torch.dtype) -> set[str] | None:
    """The names of the operands in ``fed`` that failing ops met beside a consumer's tensor (``paths``); empty when
    such an operand carries no name at all (what made it kept no record: any component may have); None when every
    one came from the caller's arguments or from nothing a component holds."""
    out: set[str] = set()
    blank = False
    for c in cases:
        ops = operands(c.before)
        if not any(o.named and o.tags[:1] and o.tags[0] in paths for o in ops):
            continue  # the consumer's own tensor is no operand here (what reached the op was made from it)
        for o in ops:
            tags = [t for t in o.tags if not t.startswith("operand ")]  # what made it: never the line's own name
            if o.meta.dtype == fed and not set(tags) & paths:
                out.update(t for t in tags if not t.startswith(("input ", "kwarg ")))
                blank = blank or not tags
    return out if out or blank else None


def operands(call: tuple[Sequence[Any], Mapping[str, Any]]) -> list[Any]:
    """The operand twins of a kept failing op (``atop.Case``'s calls): tensors, also in a list or tuple."""
    out: list[Any] = []
    for v in (*call[0], *call[1].values()):
        if type(v) in (list, tuple):
            out.extend(x for x in v if hasattr(x, "tags"))
        elif hasattr(v, "tags"):
            out.append(v)
    return out


def _apart_feeder(met: set[str], floating: Mapping[str, torch.dtype], apart: Sequence[Apart],
                  fed: torch.dtype) -> tuple[str, Apart] | None:
    """The one module held apart, wholly in ``fed``, whose tensors (its own paths, none the model's) fed the op
    (``met`` empty: the one such module; what fed the op kept no name)."""
    hits = []
    for a in apart:
        mod = a.module()
        if a.prefix or not isinstance(mod, torch.nn.Module):
            continue
        own = _floating(mod)
        if own and set(own.values()) == {fed} and (not met or any(t in own and t not in floating for t in met)):
            hits.append(a)
    return ("", hits[0]) if len(hits) == 1 else None


def _inner_feeder(met: set[str], floating: Mapping[str, torch.dtype], paths: set[str], fed: torch.dtype,
                  own: torch.dtype) -> tuple[str, None] | None:
    """The one top-level part of the model, wholly in ``fed``, whose tensors fed the op (``met`` empty: the one such
    part), the consumer's part wholly in ``own``."""
    tops = {p.split(".", 1)[0] for p in (met or floating) if "." in p and p in floating}
    mine = {p.split(".", 1)[0] for p in paths if "." in p}
    hits = [t for t in tops if t not in mine and {dt for p, dt in floating.items() if p.startswith(t + ".")} == {fed}]
    if len(hits) != 1 or len(mine) != 1:
        return None
    (consumer,) = mine
    if {dt for p, dt in floating.items() if p.startswith(consumer + ".")} != {own}:
        return None
    return hits[0], None


def _votes(comp: str, mod: Apart | None, floating: Mapping[str, torch.dtype], apart: Sequence[Apart],
           dt: torch.dtype) -> int:
    """How many components compute in ``dt`` (most of their floating tensors are in it: a norm kept in float32 does
    not change a component's side): the model's top-level parts (the model itself, when the feeder is held apart)
    and the modules the program runs apart from it."""
    if mod is None:
        parts: dict[str, list[torch.dtype]] = {}
        for p, d in floating.items():
            if "." in p:
                parts.setdefault(p.split(".", 1)[0], []).append(d)
        groups = list(parts.values())
    else:
        groups = [list(floating.values())]
    for a in apart:
        m = a.module()
        if not a.prefix and isinstance(m, torch.nn.Module):
            groups.append(list(_floating(m).values()))
    return sum(1 for g in groups if g and max(set(g), key=g.count) == dt)  # its most tensors' dtype


def _floating(mod: torch.nn.Module) -> dict[str, torch.dtype]:
    try:
        return {n: t.dtype for n, t in (*mod.named_parameters(), *mod.named_buffers()) if t.is_floating_point()}
    except Exception:  # a strange module: not a component
        return {}


def _apart_fix(a: Apart, own: torch.dtype, fed: torch.dtype, model: Mapping[str, torch.dtype]) -> Fix:
    """The feeder held apart cast where the program builds it: its name ``.to(dtype)``, the dtype on its built line
    replaced (a diff), proven at the failing ops through the names its tensors give what it computes."""
    from torchdoctor._guard.maps import value_code
    from torchdoctor._virtual.apart import seen

    mod = a.module()
    name = (seen(mod).name if isinstance(mod, torch.nn.Module) else None) or a.name
    want = value_code(own)
    built = f", built at {a.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{a.line}" if a.file and a.line else ""
    who = name or f"the {a.cls} module"
    code = (f"{name}.to({want})" if name else f"torchdoctor.move(<the {a.cls} module>, dtype={want})") + (
        f"  # every floating tensor of {who} ({a.cls}{built}) is {_s(fed)} while the model it feeds is {_s(own)}: "
        f"cast that component (or load it with torch_dtype={want}), not the model")
    own_paths = _floating(mod) if isinstance(mod, torch.nn.Module) else {}
    tops = {p.split(".", 1)[0] for p in own_paths if "." in p}
    # a whole child by prefix (what it computes from its own tensors follows the cast), unless the model has a path
    # of that name too; then its tensors one by one
    sets = [(t + ".", own) for t in sorted(tops) if not any(p.startswith(t + ".") for p in model)]
    sets += [(p, own) for p in own_paths if p.split(".", 1)[0] not in {s[0][:-1] for s in sets}]
    return Fix(code, "apart", own, a.cls, diff=retyped_line(a.file, a.line, fed, own), sets=tuple(sets))


_SPELLED = {torch.float16: (r"torch\.(?:float16|half)\b", r"\.half\(\)"),
            torch.bfloat16: (r"torch\.bfloat16\b", r"\.bfloat16\(\)"),
            torch.float32: (r"torch\.(?:float32|float)\b", r"\.float\(\)")}


def retyped_line(file: str | None, line: int, old: torch.dtype, new: torch.dtype) -> str | None:
    """The program's line that built a component in ``old`` (``TextEncoder().to("cuda", torch.float16)``, ``.half()``)
    with that one dtype written as ``new``, as a diff; None when the line is not the user's or does not say ``old``
    exactly once."""
    from torchdoctor._guard.maps import value_code
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch

    spelled = _SPELLED.get(old)
    if not file or not line or spelled is None or not own_file(file):
        return None
    raw = linecache.getline(file, line).rstrip("\r\n")
    named, method = spelled
    hits = [(m, f"torch.{_s(new)}") for m in re.finditer(named, raw)] + \
        [(m, f".to({value_code(new)})") for m in re.finditer(method, raw)]
    if len(hits) != 1:
        return None
    m, text = hits[0]
    return line_patch(file, line, (raw[:m.start()] + text + raw[m.end():]).strip())

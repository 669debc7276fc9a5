"""The fix of a virtual run as code (``simulate``'s report and the pytest marker's error): guard's generator over
the tensors found by path and the sources of tensors made in the run."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES, device_str, dtype_str, parse_device, parse_dtype
from torchdoctor._report.model import Problem
from torchdoctor._virtual.groups import whole_component
from torchdoctor._virtual.origin import IN_SCOPE
from torchdoctor._virtual.prove import Fix

_NAMED = ("parameter", "buffer", "quant_state", "attribute", "container")
# makers of host data that take no device= (the tensor they make is moved after them)
_NO_DEVICE_ARG = ("torch.from_numpy", "torch.frombuffer", "torch.from_dlpack")


def fix_for(problems: Sequence[Problem], device: torch.device, dtype: torch.dtype | None,
            sources: dict[tuple[str, ...], tuple[str, ...]] | None = None,
            current: Mapping[str, tuple[torch.dtype, torch.device]] | None = None) -> str | None:
    """The fix as code (``fix_items`` joined): what the marker and ``run`` print (``current``: as in fix_items)."""
    items = fix_items(problems, device, dtype, sources, current)
    return "\n".join(f.code for f in items) if items else None


def fix_items(problems: Sequence[Problem], device: torch.device, dtype: torch.dtype | None,
              sources: dict[tuple[str, ...], tuple[str, ...]] | None = None,
              current: Mapping[str, tuple[torch.dtype, torch.device]] | None = None,
              module_path: Callable[[Any], str | None] | None = None) -> list[Fix] | None:
    """The fix, one ``Fix`` per part, from guard's generator: the named tensors cast or moved (``torchdoctor.move``
    for many), the model tensors a wrong tensor made in the run came from, a cast at a line of the user's code fixed
    there (or at the attribute it read its dtype from), tensors the test made passed on the right device; then what
    no cast of a tensor fixes. The lines never contradict each other: weights on meta are loaded before anything is
    moved (moving them raises), and a dtype the device cannot compute in is replaced by one that does not outgrow
    its memory. Never written: a cast to the dtype a tensor already has (``current``: path -> its dtype and device
    after the run), floating data cast to an integer or float8 dtype (the storage that met it is cast instead), a
    model-wide cast for tensors made outside the model. None when nothing but memory is wrong (that problem's
    message is its own fix)."""
    from torchdoctor._guard.maps import fix_code, value_code
    from torchdoctor._guard.proof import storage_target
    memory, problems = [p for p in problems if p.kind == "memory"], [p for p in problems if p.kind != "memory"]
    if not problems:
        return None
    have = current or {}
    culprits: list[tuple[str | None, str, str, Any]] = []
    factories: list[Fix] = []
    named = {p.path for p in problems if p.role in _NAMED}
    made: dict[str, dict[str, tuple[str, Any]]] = {}  # a factory's source -> kind -> (found, target)
    meta = [p for p in problems if p.kind == "meta"]
    ran = [p for p in problems if p.role == "run"]  # the run's own weights were in another dtype than asked
    for p in problems:
        if p.kind not in ("device", "dtype") or p.role == "run":
            continue  # meta: no move fixes it (below)
        try:
            target: Any = parse_dtype(p.expected) if p.kind == "dtype" else parse_device(p.expected)
        except (ValueError, TypeError, RuntimeError):
            target = dtype if p.kind == "dtype" else device
        made_from = (sources or {}).get((p.kind, p.path, p.op or "", p.found), ())
        if storage_target(target) and p.found not in _STORAGE_NAMES:  # activations never become storage
            factories.extend(_storage_fix(p, have))
            continue
        if made_from and made_from[0].startswith("cast at "):  # fixed at the cast, or where it read its dtype
            fix = _cast_fix(p, made_from[0][8:], target, module_path)
            if fix is not None and fix.code not in {f.code for f in factories}:
                factories.append(fix)
            continue
        if made_from and made_from[0].startswith("moved "):  # a copy moved inside the forward: fixed at that line
            name, at = made_from[0][6:].split(" at ", 1)
            factories.append(Fix(f"# {at} moves {name} to {p.found} inside the forward: move it to the device of the "
                                 f"tensors it meets (e.g. .to(x.device)) instead", "note", sets=((made_from[0], target),)))
            continue
        if p.role in _NAMED and p.found in _STORAGE_NAMES and isinstance(target, torch.dtype) and \
                target.is_floating_point:  # integer storage a plain layer computes with: the cast says what it is
            from torchdoctor._guard.maps import code_path
            c, why = code_path(p.path), "cast it before the model moves" if p.found in _FLOAT8_NAMES else (
                f"dequantize it (scale included) or load its {dtype_str(target)} weights; a bare cast keeps the stored integers")
            factories.append(Fix(f"{c}.data = {c}.data.to(torch.{dtype_str(target)})  # {p.found} storage computed "
                                 f"with directly: {why}", "path", sets=((p.path, target),)))
            continue
        if p.role in _NAMED:
            _add(culprits, p.path, p.path, p.kind, _with_dtype(p.path, target, dtype, have))
            continue
        if p.role == "held":  # a module the program holds and never moved (an EMA copy): moved where it is made
            holder = p.path.split(".", 1)[0]
            if holder not in named:
                named.add(holder)
                factories.append(Fix(f"{holder}.to({value_code(target)})  # {p.path} is on {p.found}: {holder} "
                                     "was made before the move, or never moved", "note", sets=((holder + ".", target),)))
            continue
        if made_from and made_from[0].startswith("factory torch.nn.Parameter "):  # a lazy layer
            if made_from[0] not in named:
                named.add(made_from[0])
                factories.append(Fix(f"# {made_from[0][8:]} (on {p.found}): build it in __init__, or run one "
                                     "forward before the model's .to so the move takes it", "note",
                                     sets=((made_from[0], target),)))
            continue
        if made_from and made_from[0].startswith("factory "):  # one fix per call, for its device and dtype
            made.setdefault(made_from[0], {})[p.kind] = (p.found, target)
            continue
        if made_from:  # fix the source: the tensor made from it follows
            for src in made_from:
                named.add(src)
                _add(culprits, None if src.startswith(("input ", "kwarg ")) else src, src, p.kind, target)
            continue
        if p.path.startswith(("input ", "kwarg ")):  # the caller's argument itself, by the name the run gave it
            _add(culprits, None, p.path, p.kind, target)
            continue
        if any(q.role in _NAMED and q.kind == p.kind and q.found == p.found for q in problems):
            continue  # a named culprit above holds this value: fixing it fixes what was made from it
        where = "on" if p.kind in ("device", "meta") else "in"
        culprits.append((None, f"the tensors made {where} {p.found}", p.kind, target))
    factories.extend(_factory_fix(key, wrong) for key, wrong in made.items())
    culprits = [c for c in culprits if not _no_op(c, have)]
    apart = [c for c in culprits if c[0] is not None and _HELD_APART in c[0]]
    if len(apart) >= _NETWORK:  # a network patched into forward, held apart: it is moved where it is built
        culprits = [c for c in culprits if c not in apart]
        factories.append(_network_fix(apart))
    items: list[Fix] = []
    if meta:  # moving a meta tensor raises "Cannot copy out of meta tensor": the weights are loaded first
        items.append(Fix(f"# {len(meta)} tensor{'s are' if len(meta) > 1 else ' is'} on meta (no data, e.g. "
                         f"{meta[0].path}): load the weights onto the device, e.g. "
                         "model.load_state_dict(state_dict, assign=True) or from_pretrained(..., device_map=...)",
                         "note"))
    whole, culprits = whole_component(culprits, have)  # one component in another dtype: that component is cast
    moves = fix_code([c for c in culprits if c[0] is not None])
    if meta and (moves or factories):
        items.append(Fix("# then, with the weights loaded:", "note"))
    if moves:
        items.append(Fix(moves, "path", sets=tuple((c[0], c[3]) for c in culprits if c[0] is not None)))
    items += [Fix(f"# pass {label} as tensor.to({value_code(t)})", "input", t, label, sets=((label, t),))
              for path, label, _, t in culprits if path is None and t is not None]
    items += [*whole, *factories]
    items += [Fix(f"model.to(torch.{p.expected})  # the code ran with {p.found} weights: cast them so the run "
                  f"checks {p.expected}", "path", sets=(("*", parse_dtype(p.expected)),)) for p in ran[:1]]
    items += _rest(problems, memory, device, any(not f.code.startswith("#") for f in items), have)
    return items or [Fix(f"torchdoctor.move(model, {device_str(device)!r})", "path", sets=(("*", device),))]


# dtypes that are storage, never compute: a tensor found in one of them is the stored side, not the activation
_STORAGE_NAMES = frozenset(dtype_str(d) for d in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                                  torch.bool, *FLOAT8_DTYPES))


def _storage_fix(p: Problem, have: Mapping[str, tuple[torch.dtype, torch.device]]) -> list[Fix]:
    """Floating activations met integer or float8 storage that the layer uses directly (a plain ``Conv3d`` holding
    uint8 weights): the storage is what is wrong; it is dequantized or cast to the activations' dtype, never the
    activations to it."""
    from torchdoctor._guard.maps import code_path

    want = parse_dtype(p.found)
    inside = (p.module_path or "") + "." if p.module_path else ""
    stored = [path for path, (dt, _) in have.items() if path.startswith(inside) and "." not in path[len(inside):]
              and dtype_str(dt) == p.expected]
    where = f"`{p.module_path}` ({p.module_type})" if p.module_path is not None else "the layer"
    why = (f"  # {where} computes with {p.expected} storage directly: dequantize it (scale included) or load its "
           f"{dtype_str(want)} weights; a bare cast keeps the stored integers")
    if not stored:
        return [Fix(f"#{why[3:]}", "note")]
    return [Fix("\n".join(f"{code_path(s)}.data = {code_path(s)}.data.to(torch.{dtype_str(want)})" +
                          (why if i == 0 else "") for i, s in enumerate(stored)), "path",
                sets=tuple((s, want) for s in stored))]


def _cast_fix(p: Problem, at: str, target: Any, module_path: Callable[[Any], str | None] | None) -> Fix | None:
    """A tensor a forward cast at ``at`` is in the wrong dtype: set the attribute the cast read its dtype from, on
    the module holding it, or else fix the cast at its line (with a diff of the user's file, when it is theirs)."""
    from torchdoctor._guard.maps import code_path
    from torchdoctor._virtual.castsites import SITES

    site = SITES.get(at)
    if site is None or not isinstance(target, torch.dtype):
        return None
    owner = site.owner()
    where = module_path(owner) if owner is not None and module_path is not None else None
    if site.attr is not None and where is not None:
        return Fix(f"{code_path(where)}.{site.attr} = torch.{dtype_str(target)}  # {site.read_from} is "
                   f"{dtype_str(site.dtype)}; `{site.cast}` at {site.at} casts to it, {p.op} computes in "
                   f"{dtype_str(target)}", "path", target, site=site, sets=((f"cast at {at}", target),))
    src = f" (dtype read from {site.read_from})" if site.read_from else ""
    return Fix(f"# {site.at}: `{site.text}` casts to {dtype_str(site.dtype)}{src} where {p.op} computes in "
               f"{dtype_str(target)}: cast to {dtype_str(target)} there (or to the dtype of the tensor it meets, "
               "x.to(other.dtype))", "line", target, site=site, diff=_diff(site, target),
               sets=((f"cast at {at}", target),))


def _factory_fix(key: str, wrong: dict[str, tuple[str, Any]]) -> Fix:
    """A factory called in the run made a tensor on the wrong device and/or in the wrong dtype: that call is fixed
    (``device=`` / ``dtype=`` the input's, a host-data maker moved and cast after it), for both at once."""
    from torchdoctor._guard.maps import value_code

    said, _, at = key[8:].partition(" at ")
    maker, x = said.split(" ", 1)[0], IN_SCOPE.get(at)  # the tensor's name in scope at that line
    dev, dt = wrong.get("device", (None, None))[1], wrong.get("dtype", (None, None))[1]
    exprs = {k: f"{x}.{k}" if x else value_code(t) for k, t in (("device", dev), ("dtype", dt)) if t is not None}
    found = " and ".join(f"{'on' if k == 'device' else 'in'} {f}" for k, (f, _) in wrong.items())
    if maker in _NO_DEVICE_ARG:
        how = f"move it: {maker}(...).to({', '.join(exprs.values())})"
    else:
        args = ", ".join(f"{k}={v}" for k, v in exprs.items())
        kinds = " and ".join(f"{k}=" for k in exprs)
        how = f"pass {kinds} the input's {' and '.join(exprs)} ({maker}(..., {args}))" if x else \
            f"pass {kinds} ({maker}(..., {args}))"
    target = (dev, dt) if dev is not None and dt is not None else dev if dev is not None else dt
    return Fix(f"# {said} made it {found}: {how}", "note", sets=((key, target),),
               diff=maker_diff(maker, at, dev if dev is not None else dt, exprs))


def _diff(site: Any, target: torch.dtype) -> str | None:
    """The cast's line rewritten to ``target`` as a unified diff, when the line is in the user's own file."""
    from torchdoctor._guard.remedy import own_file
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.castsites import patched_line

    if not own_file(site.file):
        return None
    new = patched_line(site, target)
    return line_patch(site.file, site.lineno, new) if new is not None else None


def maker_diff(op: str, at: str, target: Any, exprs: dict[str, str] | None = None) -> str | None:
    """The line of the user's own file where factory ``op`` made a tensor on the wrong device (or in the wrong
    dtype), fixed there (``device=`` added, as guard's remedy writes it), as a unified diff; None when the line is
    not the user's, or the call is not found on it alone."""
    import ast

    from torchdoctor._guard.maker import Maker
    from torchdoctor._guard.maps import value_code
    from torchdoctor._guard.remedy import own_file, remedy
    from torchdoctor._virtual.origin import IN_SCOPE, LINES

    file, line = LINES.get(at, ("", 0))
    if not file or not own_file(file):
        return None
    try:
        with open(file, encoding="utf-8") as fh:
            raw = fh.read().split("\n")[line - 1].rstrip("\r")
        body = raw.lstrip(" \t")
        tree = ast.parse(body)
    except (OSError, IndexError, SyntaxError, ValueError):  # a statement over several lines: no diff, the fix stands
        return None
    pad = len(raw) - len(body)
    method = op[7:] if op.startswith("Tensor.") else None  # x.new_full(...): called on a tensor
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.end_col_offset is not None and (
        ast.unparse(n.func) in (op, op[6:]) or isinstance(n.func, ast.Attribute) and n.func.attr == method)]
    if len(calls) != 1 or not body.isascii():  # offsets are bytes: only a plain-ASCII line is cut by them
        return None
    call = calls[0]
    name, exprs = IN_SCOPE.get(at), exprs or {}
    said = next((k.value for k in call.keywords if k.arg == "dtype"), None)  # a dtype= it passed: replaced there
    seg = (pad + said.col_offset, pad + int(said.end_col_offset), ast.unparse(said)) \
        if said is not None and said.end_col_offset is not None and isinstance(target, torch.dtype) else None
    span = (pad + call.col_offset, pad + (call.end_col_offset or 0))
    if isinstance(target, torch.dtype) and seg is None:  # no dtype= yet: added (a host-data maker: cast after it)
        from torchdoctor._report.diff import line_patch

        inner, want = raw[span[0]:span[1]], exprs.get("dtype") or value_code(target)
        sep = "" if inner[inner.index("(") + 1:-1].strip() == "" else ", "
        return line_patch(file, line, (raw[:span[1]] + f".to({want})" + raw[span[1]:] if op in _NO_DEVICE_ARG else
                                       raw[:span[1] - 1] + f"{sep}dtype={want}" + raw[span[1] - 1:]).strip())
    both = "dtype" in exprs and isinstance(target, torch.device)  # the device and the dtype in one call
    expr = exprs.get("device") or (f"{name}.device" if name else None)
    if both:
        expr = f"{expr or value_code(target)}, {exprs['dtype'] if op in _NO_DEVICE_ARG else 'dtype=' + exprs['dtype']}"
    m = Maker(op, file, line, body, span=span, factory=True,
              no_device=not any(k.arg == "device" for k in call.keywords) and op not in _NO_DEVICE_ARG,
              device_expr=expr if isinstance(target, torch.device) else None, segment=seg)
    fixed = remedy(m, target, {})
    return fixed.patch if fixed is not None else None


_HELD_APART = ".forward.__self__."  # a module patched into another's forward: the model does not hold it
_NETWORK = 4  # this many of its tensors: a network (LoRA) whose own .to was forgotten


def _network_fix(apart: list[tuple[str | None, str, str, Any]]) -> Fix:
    """The network whose modules were patched into the model's forward is held by the program, not the model:
    ``torchdoctor.move(model)`` and ``model.to`` never reach it; ``network.to`` where it is built does."""
    from torchdoctor._guard.maps import value_code

    target = apart[0][3]
    shown = ", ".join(str(c[0]) for c in apart[:2])
    return Fix(f"# network.to({value_code(target)}) where the network is built: {len(apart)} tensors of a network "
               f"patched into the model's forward are held apart from the model (e.g. {shown}); moving the model "
               "does not move them", "note", target, sets=tuple((str(c[0]), c[3]) for c in apart))


def _with_dtype(path: str, target: Any, dtype: torch.dtype | None,
                have: Mapping[str, tuple[torch.dtype, torch.device]]) -> Any:
    """A device fix of a floating tensor that is not in the dtype the run asked for moves and casts it in one
    ``.to``: a device-only fix would leave it in its old dtype, silently promoting what it meets."""
    now = have.get(path)
    if dtype is None or now is None or isinstance(target, torch.dtype) or not now[0].is_floating_point or \
            now[0] == dtype or now[0] in FLOAT8_DTYPES:
        return target
    return (target, dtype)


def _no_op(culprit: tuple[str | None, str, str, Any], have: Mapping[str, tuple[torch.dtype, torch.device]]) -> bool:
    """A cast to the dtype (or a move to the device) the tensor already has: it would change nothing."""
    path, _, _, target = culprit
    now = have.get(path or "")
    if now is None:
        return False
    wants = target if isinstance(target, tuple) else (target,)
    return all(w == (now[0] if isinstance(w, torch.dtype) else now[1]) for w in wants)


def _rest(problems: Sequence[Problem], memory: Sequence[Problem], device: torch.device, code: bool,
          have: Mapping[str, tuple[torch.dtype, torch.device]] | None = None) -> list[Fix]:
    """What no cast of one tensor fixes: a dtype the device cannot compute in, a packed layout, an op that cannot
    be simulated, the lasting fix of plain attributes, a model still too large. A model-wide cast only for a dtype
    the model's own tensors are in (``have``, when known): float64 made in a forward is fixed where it is made, and
    float8 storage where it is stored."""
    out: list[Fix] = []
    made = [p for p in problems if p.kind == "unsupported_dtype" and p.role == "factory"]
    unsupported = [p for p in problems if p.kind == "unsupported_dtype" and p.role != "factory"]
    held = {dtype_str(d) for d, _ in (have or {}).values()}
    inside = sorted({p.found for p in unsupported if (p.module_path is not None or p.role in _NAMED) and (
        not held or p.found in held) and p.found not in _FLOAT8_NAMES})
    for p in made:  # a factory made it in a dtype the device cannot hold: that call, never a model-wide cast
        other, found = _SAME_SIZE.get(p.found, "float32"), re.search(r" at (\S+:\d+): ", p.message)
        at = found.group(1) if found else None
        out.append(Fix(f"# pass dtype=torch.{other} to {p.op or 'the factory'}{f' at {at}' if at else ''} where "
                       f"{p.module_type or 'the code'} makes it on {device_str(device)} ({device.type} " + (
                           f"has no {p.found} kernels" if " kernels" in p.message else f"cannot hold {p.found}") +
                       "; the model's own dtype is not the cause)", "factory", parse_dtype(other),
                       sets=((f"factory {p.op} at {at}", parse_dtype(other)),),
                       diff=maker_diff(p.op or "", at, parse_dtype(other)) if at else None))
    if inside:
        out.append(_instead(inside, device, bool(memory)))
    outside = {p.found for p in unsupported if p.module_path is None and p.role not in _NAMED}
    for name in sorted(outside - set(inside)):  # made outside the model: that tensor, not it
        other = _SAME_SIZE.get(name, "float32")
        out.append(Fix(f"# a {name} tensor made outside the model moves to {device_str(device)}, which cannot hold "
                       f"{name}: cast that tensor to {other} before moving it (tensor.to(torch.{other}))", "note"))
    packed = [p for p in problems if p.kind == "quant_incomplete" and p.found == "cpu-packed"]
    if packed:  # Params4bit.to keeps bitsandbytes' CPU layout; only .cuda() / .xpu() unpack it (move refuses it)
        call = {"cuda": "cuda", "xpu": "xpu"}.get(device.type)
        out.append(Fix(f"model.{call}({device.index or 0})  # unpacks bitsandbytes' CPU-packed 4-bit layout "
                       f"({packed[0].path}); .to() keeps it", "path") if call else
                   Fix(f"# reload the model: bitsandbytes' CPU-packed 4-bit layout ({packed[0].path}) runs on cpu "
                       "only", "note"))
    ops = {p.found for p in problems if p.kind == "unsupported_op"}
    if "Tensor.backward" in ops:
        out.append(Fix("# backward() is not simulated: simulate the forward and its loss; run the training step on "
                       "the real device", "note"))
    if ops - {"Tensor.backward"}:
        out.append(Fix("# an op without a meta/fake kernel ran: it cannot be simulated; skip it under the marker",
                       "note"))
    attrs = sorted({p.path for p in problems if p.role == "attribute" and p.kind == "device"})
    if attrs:  # the cast above fixes this model; a buffer is moved by every later .to()
        out.append(Fix(f"# lasting fix: register {', '.join(attrs[:3])}{' …' if len(attrs) > 3 else ''} as a buffer "
                       "in its module's __init__ (self.register_buffer(name, tensor, persistent=False)): Module.to "
                       "moves buffers, never plain attributes", "note"))
    if memory and (code or any(f.kind == "path" for f in out)):  # the lines above do not make it fit
        m = memory[0]
        out.append(Fix(f"# still too large: it needs {m.found} on {m.path}, which has {m.expected.lstrip('<= ')}; "
                       "load it quantized (bitsandbytes) or offload (device_map='auto')", "note"))
    return out


def _add(culprits: list[tuple[str | None, str, str, Any]], path: str | None, label: str, kind: str,
         target: Any) -> None:
    """One culprit per tensor: a tensor wrong in device and in dtype gets one ``.to(device, dtype)``, not a move
    that leaves the dtype wrong (the fix of its second problem)."""
    for i, (p, lab, k, t) in enumerate(culprits):
        if lab != label:
            continue
        have = t if isinstance(t, tuple) else (t,)
        if kind == k or any(type(x) is type(target) for x in have):
            return
        both = tuple(sorted((*have, target), key=lambda v: isinstance(v, torch.dtype)))  # device first
        culprits[i] = (p, lab, "device" if "device" in (k, kind) else k, both)
        return
    culprits.append((path, label, kind, target))


_SAME_SIZE = {"bfloat16": "float16", "float16": "bfloat16", "float64": "float32"}  # float64: none, the next one down
_FLOAT8_NAMES = frozenset(dtype_str(d) for d in FLOAT8_DTYPES)  # storage: dequantized where stored, never run in


def _instead(unsupported: list[str], device: torch.device, over_memory: bool) -> Fix:
    """The dtype to run in where the device cannot compute in ``unsupported``, one of the same size (or smaller) first
    (bf16 -> fp16 on a T4: a model too large is never doubled); a switch whose proof re-runs asking the new dtype."""
    for name in unsupported:
        other = _SAME_SIZE.get(name)
        if other is not None and other not in unsupported:
            return Fix(f"model.to(torch.{other})  # {device.type} cannot compute in {name}; {other} " + (
                "has the same size" if parse_dtype(other).itemsize == parse_dtype(name).itemsize else "is half its "
                "size"), "path", asks=parse_dtype(other))
    if over_memory:
        return Fix(f"# {device.type} cannot compute in {', '.join(unsupported)} and the model already exceeds its "
                   "memory: float32 would double it; load it quantized (bitsandbytes) or offload", "note")
    return Fix(f"model.to(torch.float32)  # {device.type} cannot compute in {', '.join(unsupported)}", "path",
               asks=torch.float32)

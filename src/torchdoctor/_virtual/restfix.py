"""What no cast of one tensor fixes, as fixes of a virtual run: a dtype the device cannot compute in (a factory's
dtype, or the model's run in another dtype of the same size), a packed layout, an op without a kernel there or
that cannot be simulated, the lasting fix of plain attributes, a model still too large."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES, device_str, dtype_str, parse_dtype, short_dtype
from torchdoctor._report.model import Problem
from torchdoctor._virtual.castfix import maker_diff
from torchdoctor._virtual.dtypevar import SAID, fix as dtypevar_fix
from torchdoctor._virtual.libfloat import library_fixes, library_of, own_line
from torchdoctor._virtual.prove import Fix

_NAMED = ("parameter", "buffer", "quant_state", "attribute", "container")


def rest(problems: Sequence[Problem], memory: Sequence[Problem], device: torch.device, code: bool,
          have: Mapping[str, tuple[torch.dtype, torch.device]] | None = None, cases: Sequence[Any] = ()) -> list[Fix]:
    """What no cast of one tensor fixes: a dtype the device cannot compute in, a packed layout, an op that cannot
    be simulated, the lasting fix of plain attributes, a model still too large. A model-wide cast only for a dtype
    the model's own tensors are in (``have``, when known): float64 made in a forward is fixed where it is made, and
    float8 storage where it is stored."""
    out: list[Fix] = []
    made = [p for p in problems if p.kind == "unsupported_dtype" and p.role == "factory"]
    unsupported = [p for p in problems if p.kind == "unsupported_dtype" and p.role != "factory"]
    stored = [p for p in unsupported if _STORED in p.message]  # float8 the device holds but computes no op in
    unsupported = [p for p in unsupported if p not in stored]
    out.extend(float8_compute(stored, device, cases))  # ``cases``: the failing ops, where it is fixed
    held = {dtype_str(d) for d, _ in (have or {}).values()}
    # a dtype the model does not hold met by a library's own op (GradScaler's float64): the library's line, and what
    # the program can change there
    lib = [p for p in unsupported if library_of(p.message) is not None and not (held and p.found in held)]
    inside = sorted({p.found for p in unsupported if (p.module_path is not None or p.role in _NAMED) and (
        not held or p.found in held) and p.found not in FLOAT8_NAMES and p not in lib})
    for p in made:  # a factory made it in a dtype the device cannot hold: that call, never a model-wide cast
        other, found = _SAME_SIZE.get(p.found, "float32"), re.search(r" at (\S+:\d+): ", p.message)
        at = found.group(1) if found else None
        if at and (inside_call := library_made(p, at, device)) is not None:
            out.append(inside_call)  # torch's own factory under the program's line: nothing there to pass dtype= to
            unsupported = [q for q in unsupported if q.found != p.found or q.module_path is not None]
            continue
        if at and library_of(p.message) is not None and not own_line(at):  # a library's own factory line
            lib.append(p)
            continue
        out.append(Fix(f"# pass dtype=torch.{other} to {p.op or 'the factory'}{f' at {at}' if at else ''} where "
                       f"{p.module_type or 'the code'} makes it on {device_str(device)} ({device.type} " + (
                           f"has no {p.found} kernels" if " kernels" in p.message else f"cannot hold {p.found}") +
                       "; the model's own dtype is not the cause)", "factory", parse_dtype(other),
                       sets=((f"factory {p.op} at {at}", parse_dtype(other)),),
                       diff=maker_diff(p.op or "", at, parse_dtype(other)) if at else None))
    out.extend(library_fixes([p for p in problems if p in lib and (p in unsupported or p in made)], device))
    unsupported = [p for p in unsupported if p not in lib]
    if inside:
        out.append(_instead(inside, device, bool(memory)))
    held8 = [p for p in unsupported if p.found in FLOAT8_NAMES and p.role in _NAMED and p.op == "Tensor.to"]
    if held8 and not any(q.kind == "dtype" and q.found in FLOAT8_NAMES for q in problems):  # float8 weights the
        # device cannot hold, refused at the move, in layers that scale them (else computed with: fixed so above)
        out.append(_float8_held(held8, device, have or {}))
    outside = {p.found for p in unsupported if p.module_path is None and p.role not in _NAMED}
    for p in unsupported:  # a forward's line cast a tensor to a dtype its device refuses (a rope's
        if p.module_path is not None and p.role not in _NAMED and p.found not in inside and \
                (cast := _cast_here(p)) is not None:  # pos.to(torch.float64)): the dtype fixed at that line
            f = _at_cast(cast[0], parse_dtype(_SAME_SIZE.get(p.found, "float32")), p, cast[1])
            if f is not None and f.code not in {g.code for g in out}:
                out.append(f)  # never a move of the model, which is there already
    ran: dict[str, tuple[str, str]] = {}  # a float8 name -> (the capability, the op) of a float8 matmul refused
    for q in unsupported:
        said = re.search(r"\(capability (\d+\.\d+)\) cannot run (_?scaled_\w*mm) in (float8\w*)", q.message) \
            if q.found in FLOAT8_NAMES else None  # (_scaled_mm: the one float8 matmul torch has)
        if said is not None:
            ran.setdefault(said.group(3), (said.group(1), said.group(2)))
    for name, (cap, op) in sorted(ran.items()):  # a float8 kernel the GPU lacks: it holds float8, it cannot compute
        out.append(Fix(f"# {device_str(device)} (capability {cap}) holds {name} tensors but has no {name} kernel for "
                       f"{op} (float8 matmuls need capability 8.9+: Ada, Hopper, Blackwell): take the float8 path "
                       "only where torch.cuda.get_device_capability() >= (8, 9), else compute in bfloat16 "
                       "(x.to(torch.bfloat16) @ w.to(torch.bfloat16).t())", "note"))
        outside.discard(name)
    for name in sorted(outside - set(inside)):  # made outside the model: that tensor, not it
        other = _SAME_SIZE.get(name, "float32")
        at_maker = [f for p in unsupported if p.found == name and p.module_path is None for f in _at_maker(p, other)]
        if at_maker:
            out.extend(f for i, f in enumerate(at_maker) if f.code not in {g.code for g in at_maker[:i]})
            continue
        paths = tuple(p.path for p in unsupported if p.found == name and p.module_path is None and p.path and
                      not p.path.startswith("<"))  # named by the move (a buffer): its maker may fix it (``hostline``)
        out.append(Fix(f"# a {name} tensor made outside the model moves to {device_str(device)}, which cannot hold "
                       f"{name}: cast that tensor to {other} before moving it (tensor.to(torch.{other}))", "note",
                       sets=tuple((path, parse_dtype(other)) for path in paths)))
    from torchdoctor._rules.missing import missing_fix
    for p in {p.found: p for p in problems if p.kind == "missing_kernel"}.values():  # no kernel there: never a move
        at = re.search(r" at (\S+:\d+): ", p.message)
        out.append(Fix(missing_fix(device.type, p.found, at.group(1) if at else None), "note"))
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
    attrs = sorted({p.path for p in problems if p.role == "attribute" and p.kind == "device" and "<" not in p.path})
    if attrs:  # the cast above fixes this model; a buffer is moved by every later .to()
        out.append(Fix(f"# lasting fix: register {', '.join(attrs[:3])}{' …' if len(attrs) > 3 else ''} as a buffer "
                       "in its module's __init__ (self.register_buffer(name, tensor, persistent=False)): Module.to "
                       "moves buffers, never plain attributes", "note"))
    if memory and (code or any(f.kind == "path" for f in out)):  # the lines above do not make it fit
        m = memory[0]
        out.append(Fix(f"# still too large: it needs {m.found} on {m.path}, which has {m.expected.lstrip('<= ')}; "
                       "load it quantized (bitsandbytes) or offload (device_map='auto')", "note"))
    return out


# GradScaler met 16-bit parameters or gradients: what to do instead, said (no cast of anything fixes it)
SCALER = ("# GradScaler unscales float32 gradients only: keep the trained parameters float32 (drop the model's "
          ".half() / .to(torch.float16)) and run the forward under torch.autocast(device_type, dtype=torch.float16), "
          "or train in bfloat16 without GradScaler")
SCALER_BF16 = ("# bfloat16 gradients need no GradScaler (CUDA has no bfloat16 unscale kernel): drop the scaler "
               "(scaler.scale(loss).backward() -> loss.backward(); scaler.step(opt) -> opt.step()), or keep float32 "
               "weights and compute under torch.autocast(device_type, dtype=torch.bfloat16)")
def library_made(p: Problem, at: str, device: torch.device) -> Fix | None:
    """A factory (``torch.as_tensor(weights, dtype=torch.double)`` in torch's ``WeightedRandomSampler``) a library
    ran under the program's line ``at`` made a ``p.found`` tensor on ``device`` (the default device the program set):
    the line named, and the fix of its cause (that call made on the cpu, or no global default device); None when
    the program's line makes it itself."""
    import linecache

    from torchdoctor._virtual.origin import LINES

    file, line = LINES.get(at, ("", 0))
    text = linecache.getline(file, line).strip() if file else ""
    name = str(p.op or "").rpartition(".")[2]
    if not text or not name or re.search(rf"\b{re.escape(name)}\b", text):
        return None
    return Fix(f"# {at}: `{text}` calls a library that makes a {p.found} tensor itself ({p.op}, by design), and it "
               f"lands on {device_str(device)}, which cannot hold {p.found}, as the default device there "
               f"(torch.set_default_device, a `with torch.device(...)` block): run that line on the cpu (`with "
               f"torch.device('cpu'): {text}`), or do not make {device.type} the global default; nothing moves it, so "
               "no cast before a move fixes it", "note",
               tried=f"not re-run: the {p.found} is made inside the library, not at a line of the program")


_STORED = "float8 is a storage dtype on"  # the rules' words for an op a GPU has no float8 kernel of


def float8_compute(stored: Sequence[Problem], device: torch.device, cases: Sequence[Any] = ()) -> list[Fix]:
    """An op a GPU has no float8 kernel of, met by float8 operands it holds: never a move (the device holds them),
    never a cast of anything to float8; the operands are computed in a compute dtype at the op, or made in one where
    the program cast them to float8 for compute (its storage dtype taken as its compute dtype)."""
    out: list[Fix] = []
    for p in {(p.found, p.op): p for p in stored}.values():
        op = str(p.op or "the op").removeprefix("aten.").split(".")[0]
        from torchdoctor._virtual.f8dtype import f8_dtype_fix
        from torchdoctor._virtual.f8line import f8_line_fix
        if (at_line := f8_line_fix(p, cases, op, device.type) or f8_dtype_fix(p, cases, op, device.type)) is not None:
            out.append(at_line)
            continue
        seen = next((c.at for c in cases if c.op == p.op and c.at), None)
        out.append(Fix(f"# {device.type} holds {p.found} but computes no {op} in it (float8 is storage there; only "
                       f"torch._scaled_mm computes with it): cast the float8 operands to torch.bfloat16 at the {op}'s "
                       f"line (a.to(torch.bfloat16) {_SIGN.get(op, op)} b.to(torch.bfloat16)), or make them bfloat16 "
                       f"where the code casts them to {p.found} for compute (a dtype attribute set to {p.found} used "
                       "as the compute dtype); keep float8 for stored weights only, and never move them",
                       "note", tried=f"not re-run: the op's line {seen} casts to no dtype it names and holds no "
                       f"expression of it to rewrite" if seen else "not re-run: the op's line is not on record"))
    return out


_SIGN = {"add": "+", "mul": "*", "sub": "-", "div": "/", "matmul": "@"}
_SAME_SIZE = {"bfloat16": "float16", "float16": "bfloat16", "float64": "float32"}  # float64: none, the next one down
FLOAT8_NAMES = frozenset(dtype_str(d) for d in FLOAT8_DTYPES)  # storage: dequantized where stored, never run in


def _float8_held(held: Sequence[Problem], device: torch.device,
                 have: Mapping[str, tuple[torch.dtype, torch.device]]) -> Fix:
    """The float8 weights ``device`` cannot hold (mps), cast to bfloat16 where they are, before the model's move:
    the values are kept exactly (bfloat16 holds every float8 value); a layer that scales its weight per call
    still does. One line per tensor, or a loop over the model's tensors for more than four. ``have``: the model's
    tensors by path (a run stops at the first refused move: the others are cast too)."""
    from torchdoctor._guard.maps import code_path

    paths = list(dict.fromkeys([*(p.path for p in held), *(n for n, (d, _) in have.items() if d in FLOAT8_DTYPES)]))
    bf16 = torch.bfloat16
    why = f"  # {device.type} cannot hold float8: cast before the move (bfloat16 keeps every float8 value)"
    if len(paths) <= 4:
        lines = [f"{code_path(n)}.data = {code_path(n)}.data.to(torch.bfloat16)" for n in paths]
        code = "\n".join([lines[0] + why, *lines[1:]])
    else:
        code = ("for t in [*model.parameters(), *model.buffers()]:" + why + "\n    if t.dtype in (torch.float8_e4m3fn, "
                "torch.float8_e5m2):\n        t.data = t.data.to(torch.bfloat16)")
    return Fix(code, "path", bf16, sets=tuple((n, bf16) for n in paths))


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


_HOST_CAST = re.compile(r"\(cast to \w+ by `.*?` at (\S+:\d+)[,)].*? moved to (\w+)")
_HOLDS = {name: "float16" for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")}  # float8
# stored weights made float16 (not float32): a model that chose 8 bits keeps its memory small, and loses nothing
_MADE = re.compile(r"made by (torch\.\w+) in code outside the model at (\S+:\d+) \S+@(\S+) moved to (\S+) as ")


_CAST_HERE = re.compile(r"(\S+)@(\S+) moved to (\S+) as (\w+) \(cast at (\S+:\d+)\)")


def _cast_here(p: Problem) -> tuple[str, str] | None:
    """(line, device) of the program's cast that gave the tensor the dtype its device refuses (``(cast at …)``): a
    tensor already on that device cast there, or one whose move changed its dtype (``.to(x.device, torch.float64)``
    of integer positions); None when the tensor had that dtype before its move (its maker chose it)."""
    cast = _CAST_HERE.search(p.message)
    if cast is None:
        return None
    held, src, dst, found, at = cast.groups()
    try:
        changed = held.split("[", 1)[0] != short_dtype(parse_dtype(found))
    except (ValueError, TypeError):
        return None
    return (at, dst) if src == dst or changed else None


def _at_maker(p: Problem, other: str) -> list[Fix]:
    """A tensor the program's factory made on another device (numpy's float64 data, ``torch.from_numpy``) moved to
    a device that cannot hold its dtype: cast at that factory's line (a diff, proven as a factory's fix is). A
    tensor already on that device when it was cast (``sigmas.to(torch.float64)`` of a tensor made there) was not
    made so by its maker: the cast is said, never a cast at the maker, which changes nothing."""
    cast = _cast_here(p)
    if cast is not None and (fixed := _at_cast(cast[0], parse_dtype(other), p, cast[1])) is not None:
        return [fixed]  # a tensor on the device cast there by the program's line: fixed at that line
    host = _HOST_CAST.search(p.message)
    if host is not None and (rec := SAID.get(host.group(1))) is not None:  # the program's cast, at its dtype's line
        fixed = dtypevar_fix(rec, p.path if p.path and not p.path.startswith("<") else "it", p.found,
                             parse_dtype(_HOLDS.get(p.found, other)), host.group(2))
        return [fixed] if fixed is not None else []
    m = _MADE.search(p.message)
    if m is None:
        return []
    op, at, src, dst = m.groups()
    if src == dst:
        return [Fix(f"# {op} at {at} made it on {dst}; a later cast of it to {p.found} (Tensor.to, "
                    f".double()) on {dst}, which cannot hold {p.found}, raises: keep it {other} there, or do the "
                    f"{p.found} math on the cpu (t.cpu().to(torch.{p.found}))", "note",
                    tried="not re-run: the cast's line is not on record")]
    want = parse_dtype(other)
    return [Fix(f"# a {p.found} tensor made outside the model moves to {dst}, which cannot hold {p.found}: cast that "
                f"tensor to {other} before moving it, at {at} where {op} makes it", "factory", want,
                sets=((f"factory {op} at {at}", want),), diff=maker_diff(op, at, want))]


def _at_cast(at: str, want: torch.dtype, p: Problem, dst: str) -> Fix | None:
    """The program's cast of a tensor already on ``dst`` to a dtype ``dst`` cannot hold, written to ``want`` at its
    line (a diff); proven as a factory's dtype is: the device holds ``want``."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._virtual.castsites import CastSite, patched_line
    from torchdoctor._virtual.origin import LINES
    from torchdoctor._report.diff import line_patch
    import linecache

    file, line = LINES.get(at, ("", 0))
    if not file or not own_file(file):
        return None
    text = re.sub(r"\s+#[^'\"]*$", "", linecache.getline(file, line).strip())  # the code, not its comment
    new = patched_line(CastSite(at, file, line, text, text, parse_dtype(p.found)), want)
    diff = line_patch(file, line, new.strip()) if new is not None else None
    if diff is None:
        return None
    return Fix(f"# {at}: `{text}` casts to {p.found} on {dst}, which cannot hold {p.found}: cast to "
               f"{dtype_str(want)} there (or do the {p.found} math on the cpu: t.cpu().to(torch.{p.found}))",
               "factory", want, sets=((f"cast at {at}", want),), diff=diff)

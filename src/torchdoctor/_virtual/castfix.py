"""The fixes of a dtype met where it is stored or where a forward cast it: integer or float8 storage a plain layer
computes with (dequantized or cast where stored, never the activations to it), and a cast at a line (fixed at the
attribute it read its dtype from, or at the line, with a diff of the user's file; never a line of an installed
library, which casts by design)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from torchdoctor._placement import dtype_str, parse_dtype
from torchdoctor._report.model import Problem
from torchdoctor._virtual.prove import Fix

# makers of host data that take no device= (the tensor they make is moved after them)
NO_DEVICE_ARG = ("torch.from_numpy", "torch.frombuffer", "torch.from_dlpack")


def storage_fix(p: Problem, have: Mapping[str, tuple[torch.dtype, torch.device]]) -> list[Fix]:
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


def cast_fix(p: Problem, at: str, target: Any, module_path: Callable[[Any], str | None] | None) -> Fix | None:
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
    if _upcast_into_norm(p, site, target):  # a deliberate per-call upcast: the norm is kept float32, as intended
        norm = code_path(str(p.module_path))
        return Fix(f"{norm}.float()  # `{site.cast}` at {site.at} feeds {p.module_path} ({p.module_type}) float32 on "
                   f"purpose: keep that norm in float32 (its forward upcasts; never cast that path down)", "path",
                   torch.float32, sets=((str(p.module_path) + ".", torch.float32),))
    src = f" (dtype read from {site.read_from})" if site.read_from else ""
    return Fix(f"# {site.at}: `{site.text}` casts to {dtype_str(site.dtype)}{src} where {p.op} computes in "
               f"{dtype_str(target)}: cast to {dtype_str(target)} there (or to the dtype of the tensor it meets, "
               "x.to(other.dtype))", "line", target, site=site, diff=_diff(site, target, p.module_path),
               sets=((f"cast at {at}", target),))


_NORMS = ("layer_norm", "group_norm", "rms_norm", "batch_norm")


def _upcast_into_norm(p: Problem, site: Any, target: torch.dtype) -> bool:
    """A cast to float32 written in the forward (``norm(x.float())``) met a normalization layer held in a reduced
    dtype: the upcast is the program's intent, the layer's dtype is what is off."""
    return site.dtype == torch.float32 and target != torch.float32 and target.is_floating_point and \
        p.module_path not in (None, "") and any(n in str(p.op or "") for n in _NORMS) and \
        site.cast in ("float()", "to(torch.float32)", "to(torch.float)")


def in_library(site: Any) -> bool:
    """The cast's line is in an installed library (or torch), not in the user's own code."""
    from torchdoctor._guard.ownfile import own_file

    return site is not None and not own_file(site.file)


def library_note(fix: Fix) -> Fix:
    """A library's own cast (an upcast by design) meets a tensor in another dtype: the tensors it meets are fixed,
    the library's line never edited."""
    site = fix.site
    return Fix(f"# {site.at} (an installed library) casts with `{site.cast}` by design; the tensors it meets come "
               f"in another dtype: cast what feeds it (the model's inputs, or the component made before it) to "
               f"{dtype_str(fix.target)}, never that line", "note", fix.target, site=site)


def _diff(site: Any, target: torch.dtype, layer: str | None = None) -> str | None:
    """The cast's line rewritten to ``target`` as a unified diff, when the line is in the user's own file."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.castsites import patched_line

    if not own_file(site.file):
        return None
    new = patched_line(site, target, layer)
    return line_patch(site.file, site.lineno, new) if new is not None else None


def maker_diff(op: str, at: str, target: Any, exprs: dict[str, str] | None = None,
               wide: torch.dtype | None = None) -> str | None:
    """The line of the user's own file where factory ``op`` made a tensor on the wrong device (or in the wrong
    dtype), fixed there (``device=`` added, as guard's remedy writes it), as a unified diff; None when the line is
    not the user's, or the call is not found on it alone. ``wide``: the dtype it had, which a cast the line applies
    to the call (``.float()``) gave it: that cast goes when the fix moves and casts in one ``.to``."""
    import ast

    from torchdoctor._guard.maker import Maker
    from torchdoctor._guard.maps import value_code
    from torchdoctor._guard.remedy import own_file, remedy
    from torchdoctor._virtual.origin import IN_SCOPE, LINES

    from torchdoctor._virtual.loaded import map_diff, through

    if op == "torch.load" or through(at):  # its device is map_location= / the loader's device=, at that line
        mapped = map_diff(at, target)
        return mapped[1] if mapped is not None else None
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
    if len(calls) > 1 and isinstance(target, torch.dtype) and target.is_floating_point:
        calls = [c for c in calls if not _makes_ints(op, c)]  # ``torch.tensor([1, 2])`` beside it is an index
    if len(calls) > 1 and isinstance(target, torch.device) and "dtype" not in (exprs or {}) and body.isascii() and \
            op not in NO_DEVICE_ARG and not any(k.arg == "device" for c in calls for k in c.keywords):
        return _all_calls(file, line, raw, pad, calls, (exprs or {}).get("device") or (
            f"{IN_SCOPE[at]}.device" if IN_SCOPE.get(at) else value_code(target)))
    if len(calls) != 1 or not body.isascii():  # offsets are bytes: only a plain-ASCII line is cut by them
        return None
    call = calls[0]
    name, exprs = IN_SCOPE.get(at), exprs or {}
    if op.endswith("Tensor") and isinstance(target, torch.device) and "dtype" not in exprs:
        return _legacy_diff(file, line, raw, pad, call, exprs.get("device") or (
            f"{name}.device" if name else value_code(target)))
    said = next((k.value for k in call.keywords if k.arg == "dtype"), None)  # a dtype= it passed: replaced there
    seg = (pad + said.col_offset, pad + int(said.end_col_offset), ast.unparse(said)) \
        if said is not None and said.end_col_offset is not None and isinstance(target, torch.dtype) else None
    span = (pad + call.col_offset, pad + (call.end_col_offset or 0))
    if isinstance(target, torch.dtype) and seg is None:  # no dtype= yet: added (a host-data maker: cast after it)
        from torchdoctor._report.diff import line_patch

        inner, want = raw[span[0]:span[1]], exprs.get("dtype") or value_code(target)
        sep = "" if inner[inner.index("(") + 1:-1].strip() == "" else ", "
        return line_patch(file, line, (raw[:span[1]] + f".to({want})" + raw[span[1]:] if op in NO_DEVICE_ARG else
                                       raw[:span[1] - 1] + f"{sep}dtype={want}" + raw[span[1] - 1:]).strip())
    both = "dtype" in exprs and isinstance(target, torch.device)  # the device and the dtype in one call
    given = next((k.value for k in call.keywords if k.arg == "device"), None)
    if isinstance(target, torch.device) and not both and given is not None and given.end_col_offset is not None:
        # a device= it passed (``device="cuda"``, the current device; ``device=device`` left None): replaced there,
        # never a second move appended after the call
        from torchdoctor._report.diff import line_patch

        want = exprs.get("device") or (f"{name}.device" if name else value_code(target))
        return line_patch(file, line, raw[:pad + given.col_offset] + want + raw[pad + given.end_col_offset:])
    expr = exprs.get("device") or (f"{name}.device" if name else None)
    if both:
        expr = f"{expr or value_code(target)}, {exprs['dtype'] if op in NO_DEVICE_ARG else 'dtype=' + exprs['dtype']}"
    if both and op in NO_DEVICE_ARG and wide is not None:  # host data moved and cast in one .to, its cast dropped
        from torchdoctor._report.diff import line_patch
        from torchdoctor._virtual.keepdtype import drop_cast

        kept = drop_cast(raw, pad, call, tree, wide)
        return line_patch(file, line, (kept[:span[1]] + f".to({expr})" + kept[span[1]:]).strip())
    m = Maker(op, file, line, body, span=span, factory=True,
              no_device=not any(k.arg == "device" for k in call.keywords) and op not in NO_DEVICE_ARG,
              device_expr=expr if isinstance(target, torch.device) else None, segment=seg)
    fixed = remedy(m, target, {})
    return fixed.patch if fixed is not None else None


def _legacy_diff(file: str, line: int, raw: str, pad: int, call: Any, device: str) -> str | None:
    """A legacy constructor's call (``torch.LongTensor([0])``), which takes no device but the cpu, written as the
    factory that does (``torch.tensor([0], dtype=torch.int64, device=input_ids.device)``), as a diff."""
    from torchdoctor._report.diff import line_patch

    new = modern_call(call, device)
    if new is None or call.end_col_offset is None:
        return None
    return line_patch(file, line, (raw[:pad + call.col_offset] + new + raw[pad + call.end_col_offset:]).strip())


def legacy_call(maker: str, device: str) -> str | None:
    """``torch.tensor(..., dtype=torch.int64, device=<device>)`` for a legacy constructor's name (``torch.LongTensor``),
    which refuses any device but the cpu, said as a fix's note says it; None for any other maker."""
    dtype = getattr(getattr(torch, maker[6:], None), "dtype", None) if maker.startswith("torch.") and \
        maker.endswith("Tensor") else None
    return f"torch.tensor(..., dtype={dtype}, device={device}): a legacy constructor takes no device but the cpu" \
        if isinstance(dtype, torch.dtype) else None


def modern_call(call: Any, device: str) -> str | None:
    """``torch.LongTensor([0])`` (an ``ast.Call``) as the factory that takes a device: ``torch.tensor([0],
    dtype=torch.int64, device=<device>)`` for data, ``torch.empty(2, 3, dtype=torch.int64, device=<device>)`` for
    sizes (a legacy constructor refuses any device but the cpu: "legacy constructor expects device type: cpu").
    None for a call this cannot read (keywords, unpacking, no argument)."""
    import ast

    from torchdoctor._placement import dtype_str

    name = ast.unparse(call.func)
    dtype = getattr(getattr(torch, name.rpartition(".")[2], None), "dtype", None) if name.startswith("torch.") \
        and name.endswith("Tensor") and name.count(".") == 1 else None
    if not isinstance(dtype, torch.dtype) or not call.args or call.keywords or \
            any(isinstance(a, ast.Starred) for a in call.args):
        return None
    sizes = all(isinstance(a, ast.Constant) and type(a.value) is int for a in call.args)
    if not sizes and len(call.args) != 1:
        return None
    args = ", ".join(ast.unparse(a) for a in call.args)
    return f"torch.{'empty' if sizes else 'tensor'}({args}, dtype=torch.{dtype_str(dtype)}, device={device})"


def _all_calls(file: str, line: int, raw: str, pad: int, calls: list[Any], device: str) -> str | None:
    """Every call of the factory at the line gets ``device=`` (``{"input_ids": torch.tensor(a), "labels":
    torch.tensor(b)}``: which one made the tensor is not known at the line; the other one's later move is then a
    no-op), as a diff; a proof's re-run makes every call at the line so too."""
    from torchdoctor._report.diff import line_patch

    fixed = raw
    for call in sorted(calls, key=lambda c: c.end_col_offset, reverse=True):  # from the right: offsets stay valid
        end = pad + int(call.end_col_offset) - 1  # its closing parenthesis
        sep = "" if fixed[pad + call.col_offset:end].rstrip().endswith("(") else ", "
        fixed = fixed[:end] + f"{sep}device={device}" + fixed[end:]
    return line_patch(file, line, fixed.strip())


def _makes_ints(op: str, call: Any) -> bool:
    """A data or range factory call that makes integers whatever runs (``torch.tensor([1, 2])``, ``torch.arange(4)``:
    integer literals, no ``dtype=``): not the maker of a float."""
    import ast

    if op not in ("torch.tensor", "torch.as_tensor", "torch.asarray", "torch.arange") or not call.args or \
            any(k.arg == "dtype" for k in call.keywords):
        return False
    data = call.args if op == "torch.arange" else call.args[:1]
    items = [y for x in data for y in (x.elts if isinstance(x, (ast.List, ast.Tuple)) else [x])]
    return all(isinstance(x, ast.Constant) and type(x.value) is int for x in items)


def each_maker(problems: Sequence[Problem], sources: Mapping[tuple[str, ...], tuple[str, ...]]
                ) -> Iterator[tuple[Problem, tuple[str, ...]]]:
    """Each problem with its sources; one made by several lines (a cast's result times a default-dtype factory's
    tensor) once per line, so each is fixed where it is (a fix of one alone leaves the other's dtype, promoted)."""
    for p in problems:
        made_from = sources.get((p.kind, p.path, p.op or "", p.found), ())
        lines = len(made_from) > 1 and all(m.startswith(("cast at ", "factory torch.")) for m in made_from)
        yield from ((p, (m,)) for m in made_from) if lines else ((p, made_from),)


def traced_note(p: Problem, said: set[str]) -> list[Fix]:
    """A traced module's tensor constant (or a plain attribute its traced code reads) on another device: no move of
    the module or the attribute reaches the traced code; it is registered as a buffer before tracing, or the module
    is traced where it runs. Said once."""
    what = "a tensor constant" if "<" in p.path else p.path  # ``<root>.<constant>`` is no path code can reach
    note = (f"# {what} is on {p.found} in the traced code, which holds it as a constant (no move reaches it): "
            f"register it as a buffer in its module's __init__ (self.register_buffer(name, tensor)) before tracing, "
            f"or trace on {p.expected}")
    return [] if note in said else [Fix(note, "note", tried="not re-run: the traced code holds it")]


def op_moved(label: str, op: str, at: str, target: torch.device) -> Fix | None:
    """An argument of the model's call made by an op of the program's line on the CPU (``both =
    torch.cat([uncond, cond])`` of embeddings parked there): its result moved at that line, to the device of the
    tensor the line's function was given (``.to(x.device)``), a diff; proven at the failing op as the argument."""
    import ast

    from torchdoctor._guard.maps import value_code
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.origin import IN_SCOPE, LINES
    from torchdoctor._virtual.ownline import own_line

    read = own_line(*LINES.get(at, ("", 0)))
    if read is None:
        return None
    file, line = LINES[at]
    raw, body, tree = read
    name = op.rsplit(".", 1)[-1]
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, (ast.Attribute, ast.Name))
             and (n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id) == name]
    if len(calls) != 1 or not body.isascii() or calls[0].end_col_offset is None:
        return None
    end = len(raw) - len(body) + int(calls[0].end_col_offset)
    from torchdoctor._virtual.devexpr import device_name

    x = IN_SCOPE.get(at)
    want = f"{x}.device" if x else device_name(file, line) or value_code(target)
    diff = line_patch(file, line, (raw[:end] + f".to({want})" + raw[end:]).strip())
    if diff is None:
        return None
    return Fix(f"# {label} is made by {op[7:]} at {at} on the cpu (what it combines was left there): move the result "
               f"at that line ({ast.unparse(calls[0])}.to({want}))", "note", target, sets=((label, target),),
               diff=diff)

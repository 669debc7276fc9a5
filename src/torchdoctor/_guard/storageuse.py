"""Integer, packed or float8 storage a line outside any module computes with directly (issue 41 #3: storage is
judged by what computes with it): ``torch.matmul(hidden, lm_head.weight.t())`` multiplies bf16 activations by a
bitsandbytes ``Int8Params`` that only ``Linear8bitLt.forward`` dequantizes. The storage is the culprit, never cast
(a bare cast keeps the stored integers, the scale is lost); the fix is to compute with the layer that dequantizes it
(``lm_head(hidden)``), proven by calling that layer on a copy of what the line passes (its state put back), or,
where the line's form allows no such call, to dequantize there, unproven."""

from __future__ import annotations

import ast
import os
from typing import Any

import torch
from torch import nn

from torchdoctor._placement import compact, tensor_device

_MATMUL = {"matmul", "mm", "linear"}


def stored(t: torch.Tensor) -> bool:
    """Integer or one-byte floating storage (float8): no floating op computes with it as it is stored."""
    return not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool or \
        (t.is_floating_point() and t.element_size() == 1)


def stored_reads(source: str, frame: Any) -> list[tuple[str, torch.Tensor, nn.Module, str]]:
    """(the expression, the tensor, the module holding it, its attribute) for each ``name.sub.weight`` the line reads
    through the frame's modules that holds integer / float8 storage (attributes of modules only: nothing is run)."""
    from torchdoctor._guard.useline import parsed_line

    got = parsed_line(source)
    out: list[tuple[str, torch.Tensor, nn.Module, str]] = []
    for node in ast.walk(got[0]) if got is not None else ():
        chain: list[str] = []
        n: Any = node
        while isinstance(n, ast.Attribute):
            chain.insert(0, n.attr)
            n = n.value
        if not chain or not isinstance(n, ast.Name) or not isinstance(frame.f_locals.get(n.id), nn.Module):
            continue
        obj: Any = frame.f_locals[n.id]
        for attr in chain[:-1]:
            obj = obj._modules.get(attr) if isinstance(obj, nn.Module) else None
        t = (obj._parameters.get(chain[-1]) if chain[-1] in obj._parameters else obj._buffers.get(chain[-1])) \
            if isinstance(obj, nn.Module) else None
        if isinstance(t, torch.Tensor) and stored(t) and not any(t is x[1] for x in out):
            out.append((ast.unparse(node), t, obj, chain[-1]))
    return out


def _weight_of(node: ast.expr, text: str) -> bool:
    """``w.t()``, ``w.T`` or ``w.transpose(0, 1)`` of the storage's expression ``text``."""
    if isinstance(node, ast.Attribute) and node.attr in ("T", "mT"):
        return ast.unparse(node.value) == text
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
        "t", "transpose") and ast.unparse(node.func.value) == text


def layer_call(source: str, text: str, layer: nn.Module) -> tuple[str, str, str] | None:
    """(the call or ``@`` that computes with the weight, its operand's text, the same computed by the layer) for
    ``torch.matmul(x, w.t())`` / ``x @ w.t()`` / ``F.linear(x, w)`` with ``w`` the layer's ``weight`` and no bias
    on either side; None for any other form."""
    from torchdoctor._guard.useline import parsed_line

    if not text.endswith(".weight") or text == "self.weight" or getattr(layer, "bias", None) is not None:
        return None
    got = parsed_line(source)
    owner = text[:-len(".weight")]
    for node in ast.walk(got[0]) if got is not None else ():
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and _weight_of(node.right, text):
            x = ast.unparse(node.left)
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) and len(node.args) == 2 \
                and not node.keywords and (node.func.attr if isinstance(node.func, ast.Attribute) else
                                           node.func.id) in _MATMUL:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            ok = ast.unparse(node.args[1]) == text if name == "linear" else _weight_of(node.args[1], text)
            if not ok:
                continue
            x = ast.unparse(node.args[0])
        else:
            continue
        return ast.unparse(node), x, f"{owner}({x})"
    return None


def prove_call(layer: nn.Module, x_text: str, frame: Any, weight: torch.Tensor) -> str:
    """The layer called on a copy of what the line passes: "fix proven" when it gives a floating result of the
    matmul's shape, its state put back after; "fix unproven" with what happened."""
    from torchdoctor._guard.remedy import _kept, _put_back
    from torchdoctor._guard.useline import _eval, _NotRun, parsed_line

    tried = f"`{x_text}` passed to {type(layer).__name__}"
    got = parsed_line(x_text)
    stmt = got[0].body[0] if got is not None and got[0].body else None
    kept = _kept(layer)
    if not isinstance(stmt, ast.Expr) or kept is None:
        return f"fix unproven: not re-run ({tried}: not a value of the frame)"
    rng = torch.get_rng_state()
    try:
        with torch.no_grad():
            x = _eval(stmt.value, frame, set(), None)
            out = layer(x)
    except _NotRun as why:
        return f"fix unproven: not re-run ({why})"
    except Exception as err:  # the trial's own failure is the answer
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"fix unproven: {tried}: {type(err).__name__}: {first}"[:400]
    finally:
        _put_back(kept)
        torch.set_rng_state(rng)
    want = (*tuple(x.shape[:-1]), int(weight.shape[0])) if isinstance(x, torch.Tensor) else None
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or tuple(out.shape) != want:
        return f"fix unproven: {tried} gave {getattr(out, 'shape', type(out).__name__)}, not the product's {want}"
    return f"fix proven: the layer ({type(layer).__name__}) called on a copy of `{x_text}` gives the product's " \
        f"{list(want)} in {str(out.dtype)[6:]}"


def storage_lines(reads: list[tuple[str, torch.Tensor, nn.Module, str]], source: str, frame: Any, path: str,
                  lineno: int, maps: Any) -> tuple[list[str], str | None, str | None, str | None]:
    """(culprit lines, the fix, its proof, the fixed line) for the storage the line reads directly."""
    lines = []
    for text, t, layer, attr in reads:
        hit = maps.tensor_path(t) if maps is not None else None
        model = f", the model's `{hit[0]}`" if hit is not None and hit[0] != text else ""
        lines.append(f"culprit {text}: {compact(t.dtype, tuple(t.shape), tensor_device(t))}  ({type(t).__name__} "
                     f"storage{model}: {type(layer).__name__}.forward dequantizes it; this line computes with the "
                     f"stored values directly)")
    text, t, layer, _ = reads[0]
    where = f"{os.path.basename(path)}:{lineno}"
    call = layer_call(source, text, layer)
    if call is None:
        return lines, f"# compute with `{text}` through its layer (or dequantize it, scale included) at {where}; " \
            "never cast the storage", "fix unproven: no layer call of this line's form to re-run", None
    proof = prove_call(layer, call[1], frame, t)
    import linecache

    raw = linecache.getline(path, lineno).rstrip("\r\n")
    new = raw.replace(call[0], call[2], 1) if raw.count(call[0]) == 1 else None
    if new is None:  # the line's own spelling differs from its parsed form: say the call to write
        return lines, f"# {call[0]} -> {call[2]}  # {where}", proof, None
    return lines, f"{new.strip()}  # {where}", proof, new


def storage_report(exc: BaseException, frame: Any, lineno: int, source: str, reads: list[Any], ref: torch.dtype,
                   maps: Any, pool: list[tuple[str, torch.Tensor]], inside: tuple[str, str | None, str] | None = None
                   ) -> Any:
    """The report (a ``PlacementError``) naming the storage a line computes with directly as the culprit: outside any
    module, or ``inside`` one (its label, path and type) whose forward's line reads another layer's storage."""
    from torchdoctor._guard.remedy import own_file, with_patch
    from torchdoctor._placement import dtype_str
    from torchdoctor._report.diff import line_patch
    from torchdoctor._report.model import PlacementError, Problem, TensorInfo
    from torchdoctor._report.text import format_error

    path = frame.f_code.co_filename
    where = f"{os.path.basename(path)}:{lineno}"
    said, fix, proof, new = storage_lines(reads, source, frame, path, lineno, maps)
    kinds = ", ".join(dict.fromkeys(dtype_str(t.dtype) for _, t, _, _ in reads))
    head = f"dtype mismatch {f'in {inside[0]}' if inside else 'outside the guarded model'}, at {where}: {kinds} " \
           f"storage computed with directly where {dtype_str(ref)} was expected"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lines = ([f"line: {source}"] if source else []) + said
    lines += [f"{n}: {compact(t.dtype, tuple(t.shape), tensor_device(t))}" for n, t in pool][:4]
    lines += ([proof] if proof else []) + [f"original error: {type(exc).__name__}: {first}"]
    problems = [Problem("dtype", text, "parameter" if isinstance(t, torch.nn.Parameter) else "buffer",
                        dtype_str(t.dtype), dtype_str(ref), f"{text} is {dtype_str(t.dtype)} storage computed with "
                        f"directly at {where}, expected {dtype_str(ref)} (through {type(layer).__name__})")
                for text, t, layer, _ in reads]
    err = PlacementError(format_error(head, lines, fix), module_path=inside[1] if inside else None,
                         module_type=inside[2] if inside else None, op=None,
                         tensors=[TensorInfo.of(text, t, role="parameter") for text, t, _, _ in reads],
                         problems=problems, fix=fix)
    patch = line_patch(path, lineno, new) if new is not None and own_file(path) and proof and \
        proof.startswith("fix proven") else None
    return with_patch(err, patch, lines)


def inside_report(session: Any, exc: BaseException, frame: Any, mod: nn.Module, maps: Any, mpath: str | None) -> Any:
    """A module's forward whose failing line reads another layer's storage directly (``x @ self.lm_head.weight.t()``
    in the parent's forward): that storage is the culprit (``storage_report``); None when the line reads none."""
    import linecache

    lineno = frame.f_lineno
    source = linecache.getline(frame.f_code.co_filename, lineno).strip()
    me = frame.f_locals.get("self")  # its own storage: the layer itself computes with it (diagnose's `stored`)
    reads = [r for r in stored_reads(source, frame) if r[2] is not me]
    if not reads:
        return None
    used = set(source.replace(".", " ").replace("(", " ").replace(")", " ").replace(",", " ").split())
    pool = [(n, v) for n, v in frame.f_locals.items() if n in used and n != "self" and isinstance(v, torch.Tensor)
            and v.is_floating_point() and not stored(v)]
    dtypes = [t.dtype for _, t in pool]
    ref = max(dtypes, key=dtypes.count) if dtypes else getattr(maps, "dtype", None)
    if not isinstance(ref, torch.dtype):
        return None
    label = f"`{mpath}`" if mpath else "`<root>`"
    return storage_report(exc, frame, lineno, source, reads, ref, maps, pool,
                          (f"{label} ({type(mod).__name__})", mpath, type(mod).__name__))

"""A move of a model's parameter or buffer that a factory of the program made on the CPU in the run
(``hostmade``), replaced by the fix at that factory's line: ``torch.from_numpy(...).to('cuda:0')`` where a buffer is
registered under a ``torch.device`` context it ignores, ``torch.empty(..., device=...)`` where a state dict is filled
to be loaded with ``assign=True``. Proven as a factory fix is: at the failing op (the tensors it makes are on the
device) and, in ``simulate``, by a re-run with the line changed (``remake``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._guard.maps import value_code
from torchdoctor._placement import dtype_str, parse_dtype
from torchdoctor._virtual.hostmade import made_like, maker, recorded, refused_maker
from torchdoctor._virtual.prove import Fix


def made_lines(fixes: Sequence[Fix], root: Any) -> list[Fix]:
    """Each move of a model tensor (``model.table.data = ...to('cuda:0')``) whose tensor a factory of the program
    made on the CPU in this run, replaced by the fix at that factory's line (one per line, for every tensor it
    made); the model's other tensors keep their move. A buffer a host-data maker made in a dtype the device cannot
    hold (numpy's float64 on MPS) is cast at that line too."""
    if not recorded() or not isinstance(root, torch.nn.Module):
        return list(fixes)
    out: list[Fix] = []
    for f in fixes:
        if f.kind == "note" and f.sets and all(isinstance(t, torch.dtype) for _, t in f.sets):
            out.extend(_dtype_lines(f, root))
        elif f.kind == "path" and f.sets and all(isinstance(t, torch.device) for _, t in f.sets) and not (
                f.code.startswith("torchdoctor.move(") and not _made_here(f, root)):  # a module never moved: whole
            out.extend(_device_lines(f, root))
        else:
            out.append(f)
    return out


def _made_here(f: Fix, root: torch.nn.Module) -> bool:
    """A tensor ``f`` moves was made on the CPU by a factory of the program in this run, outside a module's
    ``__init__`` (``torch.empty`` filled for ``load_state_dict(assign=True)``): that line is its fix."""
    return any((hit := maker(_tensor_at(root, path))) is not None and (hit[2] or not hit[3]) for path, _ in f.sets)


def _device_lines(f: Fix, root: torch.nn.Module) -> list[Fix]:
    from torchdoctor._guard.maps import fix_code
    from torchdoctor._virtual.fixes import factory_fix

    lines: dict[str, list[tuple[str, Any]]] = {}
    keep: list[tuple[str, Any]] = []
    ctx: set[str] = set()
    for path, dev in f.sets:
        hit = maker(_tensor_at(root, path))
        if hit is None or dev.type == "cpu" or (hit[3] and not hit[2]):  # built on the cpu: the model's move
            keep.append((path, dev))
            continue
        key = f"factory {hit[0]} at {hit[1]}"
        lines.setdefault(key, []).append((path, dev))
        if hit[2]:
            ctx.add(key)
    if not lines:
        return [f]
    out = [Fix(fix_code([(p, p, "device", d) for p, d in keep]) or f.code, "path", sets=tuple(keep))] if keep else []
    for key, paths in lines.items():
        fix = factory_fix(key, {"device": ("cpu", paths[0][1])})
        fix.sets = ((key, paths[0][1]), *paths)  # it makes these model tensors on the device: judged so at an op
        said = f"{_named(key, paths)} on cpu" + (" (it ignores the torch.device context)" if key in ctx else "")
        fix.code = fix.code.replace(f"# {key[8:].partition(' at ')[0]} made it on cpu", said, 1)
        if key in ctx:  # the program's own choice of device, as its context says it, not the run's device
            want = value_code(paths[0][1])
            fix.code = fix.code.replace(f".to({want})", ".to(torch.get_default_device())")
            fix.diff = fix.diff.replace(f".to({want})", ".to(torch.get_default_device())") if fix.diff else None
        out.append(fix)
    return out


def _dtype_lines(f: Fix, root: torch.nn.Module) -> list[Fix]:
    from torchdoctor._virtual.castfix import NO_DEVICE_ARG
    from torchdoctor._virtual.fixes import factory_fix

    lines: dict[str, list[tuple[str, Any]]] = {}
    found = re.search(r"# a (\w+) tensor", f.code)
    was = parse_dtype(found.group(1)) if found else None
    for path, dt in f.sets:
        t = _tensor_at(root, path)
        hit = maker(t) or refused_maker(path) or (made_like(t, was, NO_DEVICE_ARG) if was is not None else None)  # a
        # refused move's stand-in: its maker kept by path at the move, else the one record of its shape
        if hit is None or hit[0] not in NO_DEVICE_ARG or not isinstance(t, torch.Tensor) or was is None:
            return [f]
        lines.setdefault(f"factory {hit[0]} at {hit[1]}", []).append((path, dt))
    out: list[Fix] = []
    for key, paths in lines.items():
        fix = factory_fix(key, {"dtype": (dtype_str(was), paths[0][1])})
        fix.sets = ((key, paths[0][1]), *paths)
        fix.code = fix.code.replace(f"# {key[8:].partition(' at ')[0]} made it in {dtype_str(was)}",
                                    f"{_named(key, paths)} in {dtype_str(was)} (the dtype of its data)", 1) \
            .replace(": move it: ", ": cast it there: ", 1)
        out.append(fix)
    return out


def _named(key: str, paths: list[tuple[str, Any]]) -> str:
    op, _, at = key[8:].partition(" at ")
    made = ", ".join(p for p, _ in paths[:3]) + (f" (+{len(paths) - 3} more)" if len(paths) > 3 else "")
    return f"# {op} at {at} made {made}"


def _tensor_at(root: torch.nn.Module, path: str) -> Any:
    prefix, _, leaf = path.rpartition(".")
    try:
        mod = root.get_submodule(prefix) if prefix else root
    except AttributeError:
        return None
    # a parameter or buffer only: a plain attribute is never moved by Module.to, whatever made it (its fix is a
    # buffer, said by its own line)
    return mod._parameters.get(leaf) if leaf in mod._parameters else mod._buffers.get(leaf)

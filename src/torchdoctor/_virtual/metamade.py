"""A tensor the program's own factory made on meta, handed to a model that runs on the device (``torch.randn(...,
device=unet.device)`` where accelerate's ``cpu_offload`` keeps the weights on meta, so ``unet.device`` says meta, while
its hook runs the model on cuda:0 and moves each input there: "Cannot copy out of meta tensor"). No weights are
missing: the factory is fixed, ``device=`` the device the model runs on, a diff of its line, proven at the failing
ops with that argument there. Weights on meta keep their own advice (load them first)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from torchdoctor._placement import parse_device
from torchdoctor._report.model import Problem
from torchdoctor._virtual.prove import Fix

__all__ = ["meta_made"]

_MADE = re.compile(r"made by (torch\.\w+) at (\S+:\d+)\)")  # ``x (an argument of the UNet call, made by ...)``


def meta_made(problems: Sequence[Problem], sources: Mapping[tuple[str, ...], tuple[str, ...]],
              made_args: Mapping[str, tuple[str, str, str]]) -> tuple[list[Fix], list[Problem]]:
    """(one fix per factory of the program that made a meta argument, the problems left to ``fixes.fix_items``)."""
    from torchdoctor._virtual.fixes import factory_fix
    from torchdoctor._virtual.origin import LINES

    fixes: dict[str, Fix] = {}
    rest: list[Problem] = []
    for p in problems:
        key = _factory(p, sources, made_args) if p.kind == "meta" and p.found == "meta" else None
        try:
            target = parse_device(p.expected) if key is not None and key.rpartition(" at ")[2] in LINES else None
        except (ValueError, TypeError, RuntimeError):
            target = None
        if key is None or target is None or target.type == "meta":
            rest.append(p)
            continue
        if key not in fixes:
            fix = factory_fix(key, {"device": ("meta", target)})
            fix.code = fix.code.replace("# ", f"# {p.path}: ", 1) if fix.code.startswith("# ") else fix.code
            read = re.search(r"device\s*=\s*([\w.]+\.device)\b", _text(*LINES[key.rpartition(" at ")[2]]))
            if read is not None:  # ``device=unet.device``: where the weights are kept, not where it runs
                fix.code += (f"; {read.group(1)} is meta: an offload keeps the model's weights there and runs it on "
                             f"{target}")
            # the failing ops know it as the model's argument: the proof moves it so there
            fix.sets = (*fix.sets, *((label, target) for label, hit in made_args.items()
                                     if f"factory {hit[0]} at {hit[1]}" == key))
            fixes[key] = fix
    return list(fixes.values()), rest


def _factory(p: Problem, sources: Mapping[tuple[str, ...], tuple[str, ...]],
             made_args: Mapping[str, tuple[str, str, str]]) -> str | None:
    """``factory torch.randn at app.py:19``: the program's factory that made the meta tensor ``p`` names (an
    argument of the model's call), or None."""
    for src in sources.get((p.kind, p.path, p.op or "", p.found), ()):
        hit = made_args.get(src)
        if hit is not None and hit[0].startswith("torch."):
            return f"factory {hit[0]} at {hit[1]}"
    m = _MADE.search(p.message)
    return f"factory {m.group(1)} at {m.group(2)}" if m else None


def _text(file: str, line: int) -> str:
    import linecache

    return linecache.getline(file, line)

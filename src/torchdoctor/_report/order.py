"""Which problems are not problems of the model: tensors of a component that sits, whole, on another device than
the one the user asked for. One ``.to()`` per component fixes them; the report lists them apart, after what the
user must act on (torch-free, as ``text``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchdoctor._report.text import _get, code_path

ASKED_RULES = frozenset({"explicit", "config", "env", "profile", "argument"})  # expectations the user set


@dataclass(frozen=True)
class Relocation:
    """Tensors of one component that sit, with the component, on ``found`` while the user asked for
    ``expected``: one ``.to()`` of the component fixes them all (nothing in the model itself is wrong)."""

    component: str
    found: str
    expected: str
    members: tuple[Any, ...]

    def fix(self, var: str = "model") -> str:
        return f"{code_path(self.component, var)}.to({self.expected!r})"

    def to_dict(self) -> dict[str, Any]:
        return {"component": self.component, "found": self.found, "expected": self.expected,
                "tensors": len(self.members), "fix": self.fix()}


def _component(path: str, components: Sequence[str]) -> str | None:
    best = None
    for c in components:
        if (not c or path == c or path.startswith(c + ".")) and (best is None or len(c) > len(best)):
            best = c
    return best


def split_relocations(problems: Sequence[Any], expected: Mapping[str, Mapping[str, Any]] | None,
                      tensors: Sequence[Any] = ()) -> tuple[list[Any], list[Relocation]]:
    """(the problems to act on, the relocations): a device problem of a parameter or buffer is a relocation
    when its component's device was asked for (``device=``, ``[tool.torchdoctor]``) and the component as a whole
    sits where the tensor is (most of its bytes, when ``tensors`` are given): "you asked for cuda:0, it is on
    cpu" is one move, not hundreds of findings. A tensor left behind by a component that did move, or one that
    ``Module.to`` never moves (``moved_by_module_to`` false in ``tensors``) or that is in another floating dtype
    than its component (a move alone would not make it right), stays a problem.

    >>> ps = [{"kind": "device", "path": f"unet.l{i}.w", "role": "parameter", "found": "cpu", "expected": "cuda:0"}
    ...       for i in range(3)] + [{"kind": "dtype", "path": "unet.l0.w", "role": "parameter"}]
    >>> real, moves = split_relocations(ps, {"unet": {"device": "cuda:0", "device_rule": "explicit"}})
    >>> [p["kind"] for p in real], [(m.component, len(m.members), m.fix()) for m in moves]
    (['dtype'], [('unet', 3, "model.unet.to('cuda:0')")])
    """
    expected = expected or {}
    asked = [c for c, e in expected.items() if isinstance(e, Mapping) and e.get("device_rule") in ASKED_RULES]
    if not asked:
        return list(problems), []
    home: dict[str, str] = {}
    stays: set[str] = set()  # paths Module.to does not move (a list-held module, a plain attribute)
    odd: set[str] = set()  # floating tensors in another dtype than their component's: more than a move is wrong
    if tensors:
        weight: dict[str, dict[str, int]] = {}
        for t in tensors:
            path = str(_get(t, "path") or "")
            if _get(t, "moved_by_module_to") is False:
                stays.add(path)
            c = _component(path, asked)
            dt = str(_get(t, "dtype")).removeprefix("torch.")  # a TensorInfo holds a torch.dtype, a document its name
            want = (expected.get(c) or {}).get("dtype") if c is not None else None
            if want and dt != want and dt.startswith(("float", "bfloat", "complex")):
                odd.add(path)
            if c is None or _get(t, "alias_of"):
                continue
            dev = str(_get(t, "device"))
            w = weight.setdefault(c, {})
            w[dev] = w.get(dev, 0) + int(_get(t, "nbytes") or 0) + 1
        home = {c: max(w, key=lambda d: w[d]) for c, w in weight.items()}
    real: list[Any] = []
    moves: dict[tuple[str, str, str], list[Any]] = {}
    for p in problems:
        path = str(_get(p, "path") or "")
        c = _component(path, asked) if _get(p, "kind") == "device" and _get(p, "role") in ("parameter", "buffer") \
            else None
        found = str(_get(p, "found") or "")
        if c is None or path in stays or path in odd or (home and home.get(c, found) != found):
            real.append(p)
            continue
        moves.setdefault((c, found, str(_get(p, "expected") or "")), []).append(p)
    return real, [Relocation(c, f, e, tuple(m)) for (c, f, e), m in moves.items()]


def render_relocations(moves: Sequence[Relocation], var: str = "model") -> list[str]:
    """One line per component not yet on the device asked for, with the move that fixes it."""
    if not moves:
        return []
    wanted = sorted({m.expected for m in moves})
    lines = [f"not yet on the device you asked for ({', '.join(wanted)}): one move per component fixes them"]
    w = max(len(m.component or "<root>") for m in moves)
    for m in sorted(moves, key=lambda m: m.component):
        lines.append(f"  {m.component or '<root>':<{w}}  {len(m.members)} tensors on {m.found}  ->  {m.fix(var)}")
    if len(moves) > 1 and len(wanted) == 1:
        lines.append(f"  or all at once: torchdoctor.move({var}, device={wanted[0]!r})")
    return lines

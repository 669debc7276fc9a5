"""Which problems are not problems of the model: tensors of a component that sits, whole, on another device than
the one the user asked for. One ``.to()`` per component fixes them; the report lists them apart, after what the
user must act on (torch-free, as ``text``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
from dataclasses import dataclass
from typing import Any

from torchdoctor._report.records import FrozenRecord
from torchdoctor._report.text import _get, code_path

ASKED_RULES = frozenset({"explicit", "config", "env", "profile", "argument"})  # expectations the user set
# where an expectation came from when nothing more precise was recorded (the API's arguments, the policy's rules)
_WHENCE = {
    ("device", "explicit"): "the device= argument", ("dtype", "explicit"): "the dtype= argument",
    ("device", "vote"): "the policy: where most of its layers are",
    ("dtype", "vote"): "the policy: the dtype most of its layers have",
    ("dtype", "declared-dtype"): "the policy: the dtype the model declares in its config",
}


def with_whence(expected: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """``expected`` with ``device_source`` / ``dtype_source`` on every row: where each expectation came from (an
    argument, ``[tool.torchdoctor]`` with its file, an option, an environment variable, a profile, a rule of the
    policy). A source already recorded (the command line's) is kept.

    >>> with_whence({"": {"device": "cuda:0", "device_rule": "explicit", "dtype": "bfloat16", "dtype_rule": "vote"}})
    ... # doctest: +NORMALIZE_WHITESPACE
    {'': {'device': 'cuda:0', 'device_rule': 'explicit', 'dtype': 'bfloat16', 'dtype_rule': 'vote',
          'device_source': 'the device= argument', 'dtype_source': 'the policy: the dtype most of its layers have'}}
    """
    out: dict[str, dict[str, Any]] = {}
    for comp, row in (expected or {}).items():
        row = dict(row)
        for key in ("device", "dtype"):
            rule = row.get(f"{key}_rule")
            if not row.get(f"{key}_source") and row.get(key) not in (None, "none") and rule is not None:
                row[f"{key}_source"] = _WHENCE.get((key, str(rule)), f"the policy: rule {rule}")
        out[comp] = row
    return out


@dataclass(init=False, repr=False, eq=False)  # a frozen record (torchdoctor._report.records)
class Relocation(FrozenRecord):
    """Tensors of one component that sit, with the component, on ``found`` while the user asked for
    ``expected``: one ``.to()`` of the component fixes them all (nothing in the model itself is wrong). ``dtype``:
    the dtype asked for when the whole component is in another one (``from_dtype``): the same ``.to()`` casts it."""

    component: str
    found: str
    expected: str
    members: tuple[Any, ...]
    dtype: str = ""
    from_dtype: str = ""
    _fields = ("component", "found", "expected", "members", "dtype", "from_dtype")

    def __init__(self, component: str, found: str, expected: str, members: tuple[Any, ...], dtype: str = "",
                 from_dtype: str = "") -> None:
        d = self.__dict__  # frozen: past __setattr__, as the generated __init__ stored them
        d["component"], d["found"], d["expected"], d["members"] = component, found, expected, members
        d["dtype"], d["from_dtype"] = dtype, from_dtype

    def fix(self, var: str = "model", keyed: bool = False) -> str:
        cast = f", torch.{self.dtype}" if self.dtype else ""
        return f"{code_path(self.component, var, keyed)}.to({self.expected!r}{cast})"

    def to_dict(self, keyed: bool = False) -> dict[str, Any]:
        return {"component": self.component, "found": self.found, "expected": self.expected,
                "tensors": len(self.members), "fix": self.fix(held_as(keyed), keyed), "dtype": self.dtype or None,
                "found_dtype": self.from_dtype or None}


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
    dtypes: dict[str, str] = {}  # path -> floating dtype
    main: dict[str, str] = {}  # component -> the floating dtype most of its bytes are in
    if tensors:
        weight: dict[str, dict[str, int]] = {}
        dweight: dict[str, dict[str, int]] = {}
        for t in tensors:
            path = str(_get(t, "path") or "")
            if _get(t, "moved_by_module_to") is False:
                stays.add(path)
            c = _component(path, asked)
            if c is None or _get(t, "alias_of"):
                continue
            size = int(_get(t, "nbytes") or 0) + 1
            dt = str(_get(t, "dtype")).removeprefix("torch.")  # a TensorInfo holds a torch.dtype, a document its name
            # compute dtypes only: float8 is storage (Module.to(dtype) would turn it into the compute dtype and lose
            # the quantization), never what a component's move casts to or from
            if dt.startswith(("float", "bfloat", "complex")) and not dt.startswith("float8"):
                dtypes[path] = dt
                dw = dweight.setdefault(c, {})
                dw[dt] = dw.get(dt, 0) + size
            dev = str(_get(t, "device"))
            w = weight.setdefault(c, {})
            w[dev] = w.get(dev, 0) + size
        home = {c: max(w, key=lambda d: w[d]) for c, w in weight.items()}
        main = {c: max(w, key=lambda d: w[d]) for c, w in dweight.items()}
    # a floating tensor in another dtype than its component's is a stray: more than a move is wrong with it
    # (unless no dtype problem was found for it — kept in float32 on purpose by _keep_in_fp32_modules — and its
    # component's move casts nothing: Module.to moves it and keeps its dtype)
    judged = {str(_get(p, "path") or "") for p in problems if _get(p, "kind") == "dtype"}
    odd = {p for p, dt in dtypes.items() if main.get(_component(p, asked) or "", dt) != dt
           and (p in judged or _cast(expected, _component(p, asked) or "", main))}
    real: list[Any] = []
    moves: dict[tuple[str, str, str], list[Any]] = {}
    casts: list[Any] = []  # dtype problems of tensors in their component's dtype, when another one was asked
    for p in problems:
        path = str(_get(p, "path") or "")
        kind, role = _get(p, "kind"), _get(p, "role")
        c = _component(path, asked) if kind in ("device", "dtype") and role in ("parameter", "buffer") else None
        found = str(_get(p, "found") or "")
        if kind == "dtype" and c is not None and path not in odd and path not in stays and _cast(expected, c, main):
            casts.append((c, p))
            continue
        if c is None or kind != "device" or path in stays or path in odd or (home and home.get(c, found) != found):
            real.append(p)
            continue
        moves.setdefault((c, found, str(_get(p, "expected") or "")), []).append(p)
    out = [Relocation(c, f, e, tuple(m), _cast(expected, c, main), main.get(c, "")) for (c, f, e), m in moves.items()]
    for c, p in casts:  # folded into the component's move, which casts too; else the component stays put: a cast
        hit = next((i for i, m in enumerate(out) if m.component == c), None)
        if hit is None:
            real.append(p)
        else:
            out[hit] = dataclasses.replace(out[hit], members=(*out[hit].members, p))
    return real, out


def _cast(expected: Mapping[str, Mapping[str, Any]], c: str, main: Mapping[str, str]) -> str:
    """The dtype asked for component ``c`` when the component as a whole is in another one, else ''."""
    e = expected.get(c) or {}
    want = e.get("dtype") if e.get("dtype_rule") in ASKED_RULES else None
    return str(want) if want and want != "none" and c in main and main[c] != want else ""


def held_as(keyed: bool) -> str:
    """The name a pasted fix gives the scanned object: ``obj`` for a dict of components (``obj['model']``)."""
    return "obj" if keyed else "model"


def render_relocations(moves: Sequence[Relocation], var: str = "model", keyed: bool = False) -> list[str]:
    """One line per component not yet on the device asked for, with the move that fixes it (``keyed``: the scanned
    object is a dict, its components its keys)."""
    if not moves:
        return []
    wanted = sorted({m.expected for m in moves})
    lines = [f"not yet on the device you asked for ({', '.join(wanted)}): one move per component fixes them"]
    w = max(len(m.component or "<root>") for m in moves)
    for m in sorted(moves, key=lambda m: m.component):
        dt = f" in {m.from_dtype}" if m.dtype else ""
        lines.append(f"  {m.component or '<root>':<{w}}  {len(m.members)} tensors on {m.found}{dt}  ->  {m.fix(var, keyed)}")
    casts = sorted({m.dtype for m in moves})
    if len(moves) > 1 and len(wanted) == 1 and len(casts) == 1:
        cast = f", dtype=torch.{casts[0]}" if casts[0] else ""
        lines.append(f"  or all at once: torchdoctor.move({var}, device={wanted[0]!r}{cast})")
    return lines

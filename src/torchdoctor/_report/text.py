"""Text every verb shares, torch-free: schema ids, exit codes, the one error / problem-list shape, byte sizes.

``torchdoctor._env`` and ``torchdoctor._explain`` import only this from the report layer, so they stay usable
when ``import torch`` itself is broken (which ``torchdoctor env`` must diagnose).

Problem lists are grouped: many tensors with the same finding under one numbered container (``model.layers.*``)
print as one line with a count, as a checkpoint scan's groups do, and every line stays within the output width
(set by the command line with :func:`line_width`; library text is not wrapped unless asked).
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2

# kinds that say "this could not be checked" (a nested tensor, an op the simulator cannot run, an unreadable
# file): exit 2 wherever they appear, never 1 ("problems found"), whatever else was found
CANNOT_CHECK = frozenset({"unsupported", "unsupported_op", "unreadable"})

GROUP_MIN = 4  # this many tensors with one finding under one numbered container print as one line

_WIDTH: contextvars.ContextVar[int | None] = contextvars.ContextVar("torchdoctor_line_width", default=None)
_COMPACT = r"[a-z0-9_]+\[[0-9, ]*\]@\S+ "  # bf16[4,4]@cuda:0 at the start of a message (compiled on first use)


def schema(verb: str) -> str:
    """The ``schema`` value of a verb's JSON document.

    >>> schema("scan")
    'torchdoctor/scan/1'
    """
    return f"torchdoctor/{verb}/1"


def exit_code(problems: Iterable[Any]) -> int:
    """The exit code of a list of problem records: 0 none, 2 when one says something could not be checked, else 1.

    >>> exit_code([]), exit_code([{"kind": "dtype"}]), exit_code([{"kind": "dtype"}, {"kind": "unsupported"}])
    (0, 1, 2)
    """
    kinds = {_get(p, "kind") for p in problems}
    if not kinds:
        return EXIT_OK
    return EXIT_USAGE if kinds & CANNOT_CHECK else EXIT_PROBLEMS


def human_bytes(n: int) -> str:
    """
    >>> human_bytes(1536)
    '1.5 KiB'
    """
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


@contextlib.contextmanager
def line_width(width: int | None) -> Iterator[None]:
    """Problem lists rendered inside wrap at ``width`` columns (``None``: no wrapping)."""
    token = _WIDTH.set(max(40, width) if width else None)
    try:
        yield
    finally:
        _WIDTH.reset(token)


def current_width() -> int | None:
    return _WIDTH.get()


def format_error(headline: str, culprits: Iterable[str] = (), fix: str | None = None, limit: int = 20) -> str:
    """Errors have one shape: headline, culprits, then the fix as code to paste."""
    lines = [headline]
    items = list(culprits)
    for c in items[:limit]:
        lines.append(f"  {c}")
    if len(items) > limit:
        lines.append(f"  ... and {len(items) - limit} more")
    if fix:
        lines.append("Fix:")
        lines.extend(f"    {ln}" for ln in fix.splitlines())
    return "\n".join(lines)


def _get(p: Any, name: str) -> Any:
    return p.get(name) if isinstance(p, Mapping) else getattr(p, name, None)


def reason(p: Any) -> str:
    """A problem's message without its own path and compact tensor text in front (what a group shares).

    >>> reason({"path": "a.w", "message": "a.w f32[4]@cpu is on cpu while aten.mm runs on cuda:1"})
    'is on cpu while aten.mm runs on cuda:1'
    """
    msg = str(_get(p, "message") or "")
    path = str(_get(p, "path") or "")
    if path and msg.startswith(path + " "):
        msg = msg[len(path) + 1:]
    m = re.match(_COMPACT, msg)
    return msg[m.end():] if m else msg


def _pattern(path: str) -> list[str]:
    return ["*" if part.isdigit() else part for part in path.split(".")]


class ProblemGroup:
    """Problems sharing kind, found, expected and reason; ``under`` is the numbered container they sit in
    (``model.layers.*``), or ``None`` for a single problem printed as is. Immutable. (A plain class, not a
    dataclass: a dataclass compiles its methods at import, and every verb's first call imports this module.)"""

    __slots__ = ("kind", "under", "members")
    kind: str
    under: str | None
    members: tuple[Any, ...]

    def __init__(self, kind: str, under: str | None, members: tuple[Any, ...]) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "under", under)
        object.__setattr__(self, "members", members)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ProblemGroup is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        return type(other) is ProblemGroup and (self.kind, self.under, self.members) == (
            other.kind, other.under, other.members)

    def __hash__(self) -> int:
        return hash((self.kind, self.under, self.members))

    def __repr__(self) -> str:
        return f"ProblemGroup(kind={self.kind!r}, under={self.under!r}, members={self.members!r})"

    @property
    def first(self) -> Any:
        return self.members[0]

    @property
    def sort_key(self) -> tuple[bool, str]:
        return (self.kind == "truncated", self.under or str(_get(self.first, "path")))


def group_problems(problems: Sequence[Any], min_size: int = GROUP_MIN) -> list[ProblemGroup]:
    """Group problem records (``Problem`` objects or their ``to_dict()``), sorted by path.

    >>> ps = [{"kind": "meta", "path": f"layers.{i}.w", "found": "meta", "expected": "cpu",
    ...        "message": f"layers.{i}.w f32[2]@meta holds no data"} for i in range(5)]
    >>> [(g.under, len(g.members)) for g in group_problems(ps + [dict(ps[0], path="head.w")])]
    [(None, 1), ('layers.*.w', 5)]
    """
    families: dict[tuple[Any, ...], list[Any]] = {}
    for p in problems:
        path = str(_get(p, "path") or "")
        parts = _pattern(path)
        star = parts.index("*") + 1 if "*" in parts else 0
        key = (_get(p, "kind"), _get(p, "found"), _get(p, "expected"), reason(p), ".".join(parts[:star]))
        families.setdefault(key, []).append(p)
    out: list[ProblemGroup] = []
    for (kind, _f, _e, _r, container), members in families.items():
        if container and len(members) >= min_size:
            common = _pattern(str(_get(members[0], "path")))
            for m in members[1:]:
                other = _pattern(str(_get(m, "path")))
                n = 0
                while n < min(len(common), len(other)) and common[n] == other[n]:
                    n += 1
                common = common[:n]
            out.append(ProblemGroup(str(kind), ".".join(common), tuple(members)))
        else:
            out.extend(ProblemGroup(str(kind), None, (m,)) for m in members)
    out.sort(key=lambda g: g.sort_key)
    return out


# what the user must act on first: a file that would run code, tensors without data, broken quantization, then
# tensors a move leaves behind or casts wrongly; "cannot check" and truncation notes last
_KIND_ORDER = {"unsafe_global": 0, "unreadable": 1, "meta": 2, "quant_incomplete": 3, "device": 4, "dtype": 5,
               "saved_device": 6, "unsupported_dtype": 7, "missing_kernel": 7, "unsupported_op": 8, "unsupported": 9, "truncated": 99}


def by_urgency(groups: Sequence[ProblemGroup]) -> list[ProblemGroup]:
    """Groups ordered by what the user must act on (kind), then by path."""
    return sorted(groups, key=lambda g: (_KIND_ORDER.get(g.kind, 50), g.sort_key[1]))


def _wrap(head: str, body: str, indent: int, width: int | None, sep: str = "  ") -> list[str]:
    line = f"{head}{sep}{body}" if body else head
    if width is None or len(line) <= width:
        return [line]
    import textwrap  # only when a line is too long for the terminal

    pad = " " * indent
    return [head, *textwrap.wrap(body, width=width, initial_indent=pad, subsequent_indent=pad,
                                 break_long_words=False, break_on_hyphens=False)]


def render_problems(problems: Sequence[Any], limit: int = 40, width: int | None = None,
                    urgent_first: bool = False) -> list[str]:
    """One line per problem or per group of alike problems (see :func:`group_problems`), kind column sized to
    the kinds shown, wrapped at ``width`` (default: the :func:`line_width` in force, else no wrapping);
    ``urgent_first`` orders them by what the user must act on (:func:`by_urgency`) instead of by path."""
    width = width or _WIDTH.get()
    groups = group_problems(problems)
    if urgent_first:
        groups = by_urgency(groups)
    shown = groups[:limit]
    kw = max((len(g.kind) for g in shown), default=4)
    lines: list[str] = []
    for g in shown:
        lead = f"  {g.kind:<{kw}} "
        p = g.first
        if g.under is not None:
            found = _get(p, "found")
            at = "at" if _pattern(str(_get(p, "path"))) == g.under.split(".") else "under"
            head = f"{lead}{len(g.members)} tensors {at} {g.under}" + (f" on {found}" if g.kind in ("meta", "device")
                                                                       and found else "") + ":"
            lines.extend(_wrap(head, reason(p), len(lead) + 2, width, sep=" "))
            example = f"{_get(p, 'path')}" + (f" ({_get(p, 'found')} -> {_get(p, 'expected')})"
                                                if g.kind not in ("meta", "device") else "")
            lines.extend(_wrap(f"{' ' * len(lead)}e.g.", example, len(lead) + 2, width, sep=" "))
            continue
        path, msg = escape(str(_get(p, "path") or "")), escape(str(_get(p, "message") or ""))
        if path and msg.startswith(path + " "):  # the message names the path itself: print it once
            lines.extend(_wrap(f"{lead}{path}", msg[len(path) + 1:], len(lead) + 2, width, sep=" "))
        else:
            lines.extend(_wrap(f"{lead}{path}", msg, len(lead) + 2, width))
    if len(groups) > limit:
        rest = sum(len(g.members) for g in groups[limit:])
        lines.append(f"  ... and {rest} more problems (use --json for all)")
    return lines


def code_path(path: str, var: str = "model", keyed: bool = False) -> str:
    """A dotted path as Python to paste: ``layers.0.mlp.weight`` -> ``model.layers[0].mlp.weight``; ``keyed``: the
    object is a dict, its first part a key (``obj['model'].layers``).

    >>> code_path("blocks.0.attn-1.weight")
    "model.blocks[0]['attn-1'].weight"
    >>> code_path("model.fc", "obj", keyed=True)
    "obj['model'].fc"
    """
    out = var
    for i, part in enumerate(path.split(".") if path else []):
        if keyed and i == 0:
            out += f"[{part!r}]"
        elif part.isdigit():
            out += f"[{part}]"
        else:
            out += f".{part}" if part.isidentifier() else f"[{part!r}]"
    return out


def _value(text: str, kind: str) -> str:
    if kind in ("dtype", "unsupported_dtype"):
        return f"torch.{text}" if text.isidentifier() else repr(text)
    return repr(text)


def problem_fix(p: Any, source: str | None = None) -> str | None:
    """The fix for one problem record as code to paste, or ``None`` when no line of code fixes it.

    >>> problem_fix({"kind": "dtype", "path": "lm_head.weight", "role": "parameter", "expected": "bfloat16"})
    'model.lm_head.weight.data = model.lm_head.weight.data.to(torch.bfloat16)'
    """
    own = _get(p, "fix")
    if own:
        return str(own)
    kind, path, expected = _get(p, "kind"), str(_get(p, "path") or ""), str(_get(p, "expected") or "")
    if kind == "meta":
        return (f"# {code_path(path)} is on meta (no data): load its weights, e.g.\n"
                "model.load_state_dict(state_dict, strict=False, assign=True)")
    if kind in ("device", "dtype") and expected and path and "/" not in path and not path.startswith("<"):
        expr = code_path(path)
        return f"{expr}.data = {expr}.data.to({_value(expected, kind)})"
    if kind == "saved_device" and expected:
        where = repr(source) if source else "path"
        return f"torch.load({where}, map_location={expected!r}, weights_only=True)"
    if kind == "unsupported_dtype":
        return f"model.to(torch.float32)  # {_get(p, 'found')} cannot run here"
    return None


def group_fix(group: ProblemGroup, source: str | None = None) -> str | None:
    """One fix for a group: ``torchdoctor.move`` for many tensors on one wrong device/dtype."""
    p = group.first
    kind, expected = _get(p, "kind"), _get(p, "expected")
    if len(group.members) > 4 and kind in ("device", "dtype") and expected:
        key = "dtype" if kind == "dtype" else "device"
        return f"torchdoctor.move(model, {key}={_value(str(expected), kind)})"
    return problem_fix(p, source)


def public_types(*classes: type) -> None:
    """Public result and error types print as ``torchdoctor.Name``, not by their private module (one place)."""
    for cls in classes:
        cls.__module__ = "torchdoctor"


def escape(text: str) -> str:
    r"""``text`` with every non-printable character (controls, bidi marks, lone surrogates) escaped.

    >>> escape("ok.weight"), escape("a\r\x1b[2Kb")
    ('ok.weight', 'a\\r\\x1b[2Kb')
    """
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c.isprintable():
            out.append(c)
        elif c in "\r\n\t":
            out.append({"\r": "\\r", "\n": "\\n", "\t": "\\t"}[c])
        else:
            o = ord(c)
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out)


_LIBRARIES = ("torchdoctor", "torch", "transformers", "diffusers", "peft", "accelerate", "bitsandbytes", "pluggy",
              "_pytest", "contextlib", "functools")


def call_stack(frame: Any, limit: int | None = None) -> list[tuple[str, int, str]]:
    """The live call stack from ``frame`` outward as (file, line, function), outermost first; ``limit`` keeps the
    innermost frames only (a problem's stack, where the line that made it is read)."""
    frames: list[tuple[str, int, str]] = []
    while frame is not None and (limit is None or len(frames) < limit):
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return frames[::-1]


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the user's line (the first frame outside torchdoctor, torch
    and the model libraries), for a ``warnings.warn`` made by the caller of this function."""
    frame, level = sys._getframe(1), 1
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if not name.split(".", 1)[0] in _LIBRARIES:
            return level
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return 1

"""The registry of error signatures for ``explain``: one entry per error family, with its wordings across versions.

A signature is data: literal ``anchors`` (any one of them makes a line worth a look; they are searched with
``str.find`` in a lower-cased copy of the text, so a whole log is scanned without a regex and capitalisation does
not matter), then bounded ``patterns`` that pull fields (devices, dtypes, op, argument) out of the lines around a
hit. Patterns are matched case-insensitively on a copy of those lines with wraps joined and whitespace runs
squeezed; every pattern is anchored on literal text and uses bounded repetition only, so matching stays linear on
any input. The tables live in ``sigs_device`` and ``sigs_dtype``; ``catalog`` assembles them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CATEGORIES", "DEV", "DT", "WRITTEN", "Signature", "define", "register", "signatures"]

CATEGORIES = (
    "device_mismatch",
    "input_weight_type_mismatch",
    "dtype_mismatch",
    "unsupported_dtype_on_device",
    "backend_op_missing",
    "deserialize_device",
    "no_accelerator",
    "mixed_device_model",
    "quantization_device",
    "cpu_gpu_indexing",
)

# A device as torch prints it; bounded so a pattern can never run away on adversarial text.
DEV = r"(?:cuda|cpu|xpu|mps|meta|hpu|npu|xla|mtia|privateuseone)(?::\d{1,3})?"
DT = r"[\w:]{1,30}"


@dataclass(frozen=True)
class Signature:
    """One error family.

    ``causes`` are ``(cause id, base weight)``: the ranking before context is considered. ``alternatives`` are
    ``(category, weight, why)``: other categories the same message fits (the signature's own category weighs 1.0).
    ``follow`` is how many lines after the matched one still belong to the message (xformers and bitsandbytes
    print details below it). With ``require_pattern`` an anchor alone is not enough (the anchor is a common
    phrase).
    """

    name: str
    category: str
    title: str
    anchors: tuple[str, ...]
    what: str
    causes: tuple[tuple[str, float], ...]
    patterns: tuple[str, ...] = ()
    confidence: float = 0.9
    follow: int = 0
    require_pattern: bool = False
    before: int = 300  # characters before / after the anchor that the patterns see
    after: int = 2000
    alternatives: tuple[tuple[str, float, str], ...] = ()

    def compiled(self) -> tuple[re.Pattern[str], ...]:
        got = _COMPILED.get(self.patterns)
        if got is None:
            got = _COMPILED[self.patterns] = tuple(re.compile(p, re.IGNORECASE) for p in self.patterns)
        return got


_COMPILED: dict[tuple[str, ...], tuple[re.Pattern[str], ...]] = {}
_REGISTRY: dict[str, Signature] = {}
# An anchor that is one camelCase identifier (cudaErrorNoKernelImageForDevice, LoweringException) as its table
# writes it: identifiers are never re-capitalised, so the prefilter keys that spelling (the lower-case one is no key)
WRITTEN: dict[str, str] = {}
_CAMEL = re.compile(r"[A-Za-z][a-z0-9]*(?:[A-Z][a-z0-9]+)+")


def register(sig: Signature) -> Signature:
    """Add a signature; a second one with the same name (or an unknown category) is refused."""
    if sig.name in _REGISTRY:
        raise ValueError(f"duplicate explain signature {sig.name!r}")
    if sig.category not in CATEGORIES or any(c not in CATEGORIES for c, _, _ in sig.alternatives):
        raise ValueError(f"signature {sig.name!r}: unknown category")
    if not sig.anchors or any(not a or a != a.lower() for a in sig.anchors):
        raise ValueError(f"signature {sig.name!r} needs non-empty lower-case literal anchors")
    _REGISTRY[sig.name] = sig
    return sig


def signatures() -> tuple[Signature, ...]:
    return tuple(_REGISTRY.values())


def define(name: str, category: str, title: str, anchors: tuple[str, ...], what: str,
           causes: tuple[tuple[str, float], ...], *patterns: str, **kw: object) -> None:
    """Register one signature; anchors may be written in any case (they are stored lower-case; a camelCase
    identifier's spelling is kept in ``WRITTEN``)."""
    WRITTEN.update((a.lower(), a) for a in anchors if _CAMEL.fullmatch(a))
    anchors = tuple(a.lower() for a in anchors)
    register(Signature(name, category, title, anchors, what, causes, tuple(patterns), **kw))  # type: ignore[arg-type]

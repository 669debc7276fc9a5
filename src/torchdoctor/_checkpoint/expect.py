"""The dtype a checkpoint is expected to hold, and the modules it keeps in float32 on purpose.

The expected dtype is the one asked for (``dtype=``, rule ``explicit``), else what the ``config.json`` beside
the file declares (``dtype``, or ``torch_dtype`` as transformers 4 wrote it; rule ``declared-dtype``), else none:
without either, the checkpoint's own dtypes are only summarised (its majority is named in the report), never
judged, since a file mixing dtypes on purpose (optimizer states, fp32 norms) looks the same as a broken one.

Modules kept in float32: the transformers class named in ``architectures`` decides, as ``from_pretrained`` does
(``_keep_in_fp32_modules`` for float16, ``_keep_in_fp32_modules_strict`` for float16 and bfloat16, patterns
searched in the key as transformers 5 does). transformers is imported only when a config names a class and a
float32 tensor would otherwise be judged; when it is not importable the kept set is unknown and messages say so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchdoctor._checkpoint.collect import read_json
from torchdoctor._checkpoint.unpickle import CheckpointError
from torchdoctor._placement import dtype_str, parse_dtype

__all__ = ["DtypeExpectation", "expectation", "majority_dtype"]

_F32 = torch.float32


@dataclass(frozen=True)
class DtypeExpectation:
    """What dtype a group of tensors should hold and why; ``kept`` patterns are float32 by design."""

    dtype: torch.dtype
    rule: str  # "explicit" or "declared-dtype"
    why: str
    architecture: str | None = None
    kept: tuple[str, ...] = ()
    kept_why: str = ""

    def keeps(self, key: str) -> bool:
        """True when the model class keeps this key in float32 (searched as transformers 5 matches it)."""
        return any(re.search(p.replace(".", r"\.").replace("*", ".*"), key) for p in self.kept)

    def with_kept(self, cls_name: str | None) -> DtypeExpectation:
        """The same expectation with the kept-fp32 patterns of the transformers class ``cls_name`` filled in."""
        if cls_name is None or self.dtype not in (torch.float16, torch.bfloat16):
            return self
        kept, why = _kept_fp32(cls_name, self.dtype)
        return DtypeExpectation(self.dtype, self.rule, self.why, cls_name, kept, why)


def _config(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return {}
    try:
        doc = read_json(path, "config.json")
    except CheckpointError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _declared(config: dict[str, Any]) -> tuple[torch.dtype | None, str]:
    for field in ("dtype", "torch_dtype"):
        value = config.get(field)
        if isinstance(value, str) and value != "auto":
            try:
                dtype = parse_dtype(value.removeprefix("torch."))
            except (ValueError, TypeError):
                continue
            if dtype.is_floating_point:
                return dtype, field
    return None, ""


def _architecture(config: dict[str, Any]) -> str | None:
    names = config.get("architectures")
    if isinstance(names, list) and names and isinstance(names[0], str) and names[0].isidentifier():
        return names[0]
    return None


def _kept_fp32(cls_name: str, dtype: torch.dtype) -> tuple[tuple[str, ...], str]:
    try:
        import transformers  # heavy: only when a config names a class and float32 tensors need judging
    except Exception:  # not installed or broken: the kept set is unknown, and the message says so
        return (), f"transformers is not importable, so which modules {cls_name} keeps in float32 is unknown"
    try:
        cls = getattr(transformers, cls_name, None)
    except Exception:  # transformers' lazy module raises for classes whose backend is missing
        cls = None
    if cls is None:
        return (), f"transformers {transformers.__version__} has no class {cls_name}"
    keep = list(getattr(cls, "_keep_in_fp32_modules", None) or [])
    strict = list(getattr(cls, "_keep_in_fp32_modules_strict", None) or [])
    names = (keep if dtype == torch.float16 else []) + (strict if dtype in (torch.float16, torch.bfloat16) else [])
    names = [n for n in dict.fromkeys(names) if isinstance(n, str)]
    if not names:
        return (), f"{cls_name} keeps no module in float32 for {dtype_str(dtype)}"
    attr = "_keep_in_fp32_modules_strict" if set(names) <= set(strict) else "_keep_in_fp32_modules"
    return tuple(names), f"{cls_name}.{attr} keeps {', '.join(names)} in float32 when loaded in {dtype_str(dtype)}"


def expectation(folder: str | None, want_dtype: torch.dtype | None) -> DtypeExpectation | None:
    """The dtype expectation for a checkpoint in ``folder`` (its ``config.json``), or None when nothing says."""
    config = _config(folder) if folder else {}
    arch = _architecture(config)
    if want_dtype is not None:
        return DtypeExpectation(want_dtype, "explicit", f"you asked for {dtype_str(want_dtype)}", arch)
    declared, field = _declared(config)
    if declared is None:
        return None
    why = f"config.json declares {field} {dtype_str(declared)}"
    return DtypeExpectation(declared, "declared-dtype", why, arch)


def majority_dtype(dtypes: Sequence[torch.dtype]) -> tuple[torch.dtype, int, int] | None:
    """The most common floating dtype among ``dtypes`` by count (float8 storage excluded), with counts.

    >>> majority_dtype([torch.bfloat16, torch.bfloat16, torch.float32, torch.int64])
    (torch.bfloat16, 2, 3)
    """
    floats = [d for d in dtypes if d.is_floating_point and d.itemsize > 1]
    if not floats:
        return None
    counts: dict[torch.dtype, int] = {}
    for d in floats:
        counts[d] = counts.get(d, 0) + 1
    best = max(counts, key=lambda d: counts[d])
    return best, counts[best], len(floats)

"""The dtype a checkpoint is expected to hold, and the modules it keeps in float32 on purpose.

The expected dtype is the one asked for (``dtype=``, rule ``explicit``), else what the ``config.json`` beside
the file declares (``dtype``, or ``torch_dtype`` as transformers 4 wrote it; rule ``declared-dtype``), else none:
without either, the checkpoint's own dtypes are only summarised (its majority is named in the report), never
judged, since a file mixing dtypes on purpose (optimizer states, fp32 norms) looks the same as a broken one.

Modules kept in float32: the transformers class named in ``architectures`` decides, as ``from_pretrained`` does
(``_keep_in_fp32_modules`` for float16, ``_keep_in_fp32_modules_strict`` for float16 and bfloat16, patterns
searched in the key as transformers 5 does). Only when a config names a class and a float32 tensor would
otherwise be judged: the class's literal lists are read from the installed transformers' source (importing
transformers costs seconds and starts subprocesses); a class that computes them is imported. When transformers
is not installed the kept set is unknown and messages say so.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

from torchdoctor._checkpoint.collect import read_json
from torchdoctor._checkpoint.dtypes import BFLOAT16, FLOAT16, DType, parse_dtype
from torchdoctor._checkpoint.errors import CheckpointError

__all__ = ["DtypeExpectation", "expectation"]

class DtypeExpectation:
    """What dtype a group of tensors should hold and why; ``kept`` patterns are float32 by design. Immutable (a
    plain class: see ``stubs.StorageRef``)."""

    __slots__ = ("dtype", "rule", "why", "architecture", "model_type", "kept", "kept_why")
    dtype: DType
    rule: str  # "explicit" or "declared-dtype"
    why: str
    architecture: str | None
    model_type: str | None
    kept: tuple[str, ...]
    kept_why: str

    def __init__(self, dtype: DType, rule: str, why: str, architecture: str | None = None,
                 model_type: str | None = None, kept: tuple[str, ...] = (), kept_why: str = "") -> None:
        for name, value in (("dtype", dtype), ("rule", rule), ("why", why), ("architecture", architecture),
                            ("model_type", model_type), ("kept", kept), ("kept_why", kept_why)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"DtypeExpectation is immutable (set {name!r})")

    def __eq__(self, other: object) -> bool:
        return type(other) is DtypeExpectation and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in self.__slots__))

    def __repr__(self) -> str:
        return "DtypeExpectation(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"

    def keeps(self, key: str) -> bool:
        """True when the model class keeps this key in float32 (searched as transformers 5 matches it)."""
        return any(re.search(p.replace(".", r"\.").replace("*", ".*"), key) for p in self.kept)

    def with_kept(self) -> DtypeExpectation:
        """The same expectation with the kept-fp32 patterns of its transformers class filled in."""
        if self.architecture is None or self.dtype not in (FLOAT16, BFLOAT16):
            return self
        kept, why = _kept_fp32(self.architecture, self.model_type, self.dtype)
        return DtypeExpectation(self.dtype, self.rule, self.why, self.architecture, self.model_type, kept, why)


def _config(folder: str) -> dict[str, Any]:
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return {}
    try:
        doc = read_json(path, "config.json")
    except CheckpointError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _declared(config: dict[str, Any]) -> tuple[DType | None, str]:
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


_ATTRS = ("_keep_in_fp32_modules", "_keep_in_fp32_modules_strict")


def _modeling_files(root: str, cls_name: str, model_type: str | None) -> list[str]:
    """The transformers source files that may define ``cls_name``: the model type's own first."""
    models = os.path.join(root, "models")
    if model_type:
        name = model_type.replace("-", "_")
        first = os.path.join(models, name, f"modeling_{name}.py")
        if os.path.isfile(first):
            return [first]
    needle = f"class {cls_name}("
    try:
        folders = sorted(os.listdir(models))
    except OSError:
        return []
    for folder in folders:  # an architecture whose model_type is not its folder: look for the class
        path = os.path.join(models, folder, f"modeling_{folder}.py")
        try:
            with open(path, encoding="utf-8") as f:
                if needle in f.read():
                    return [path]
        except OSError:
            continue
    return []


def _static_attrs(cls_name: str, model_type: str | None) -> dict[str, list[str]] | None:
    """``_keep_in_fp32_modules*`` of a transformers class read from its source, without importing transformers
    (importing it costs seconds and starts subprocesses). None when the source does not say plainly."""
    import ast  # only with a config.json naming a transformers class: a bare file never needs it

    spec = importlib.util.find_spec("transformers")  # locates the package; imports nothing
    if spec is None or not spec.submodule_search_locations:
        return None
    for path in _modeling_files(list(spec.submodule_search_locations)[0], cls_name, model_type):
        try:
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            return None
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        found: dict[str, list[str]] = {}
        todo, seen = [cls_name], set()
        while todo:  # the class, then its bases defined in the same file (T5PreTrainedModel holds the list)
            node = classes.get(todo.pop(0))
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            for stmt in node.body:
                if isinstance(stmt, ast.Assign):
                    targets, expr = stmt.targets, stmt.value
                elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                    targets, expr = [stmt.target], stmt.value
                else:
                    continue
                for t in targets:
                    if isinstance(t, ast.Name) and t.id in _ATTRS and t.id not in found:
                        try:
                            value = ast.literal_eval(expr)
                        except ValueError:
                            return None  # computed: only the class itself can tell
                        found[t.id] = [v for v in (value or []) if isinstance(v, str)]
            todo += [b.id for b in node.bases if isinstance(b, ast.Name)]
        if cls_name in classes:
            return found
    return None


def _kept_fp32(cls_name: str, model_type: str | None, dtype: DType) -> tuple[tuple[str, ...], str]:
    attrs = _static_attrs(cls_name, model_type) if importlib.util.find_spec("transformers") else None
    if attrs is None:
        try:
            import transformers  # heavy: only when the source does not say and float32 tensors need judging
        except Exception:  # not installed or broken: the kept set is unknown, and the message says so
            return (), f"transformers is not importable, so which modules {cls_name} keeps in float32 is unknown"
        try:
            cls = getattr(transformers, cls_name, None)
        except Exception:  # transformers' lazy module raises for classes whose backend is missing
            cls = None
        if cls is None:
            return (), f"transformers {transformers.__version__} has no class {cls_name}"
        attrs = {a: list(getattr(cls, a, None) or []) for a in _ATTRS}
    keep, strict = attrs.get(_ATTRS[0], []), attrs.get(_ATTRS[1], [])
    names = (keep if dtype is FLOAT16 else []) + (strict if dtype in (FLOAT16, BFLOAT16) else [])
    names = [n for n in dict.fromkeys(names) if isinstance(n, str)]
    if not names:
        return (), f"{cls_name} keeps no module in float32 for {_name(dtype)}"
    attr = "_keep_in_fp32_modules_strict" if set(names) <= set(strict) else "_keep_in_fp32_modules"
    return tuple(names), f"{cls_name}.{attr} keeps {', '.join(names)} in float32 when loaded in {_name(dtype)}"


def expectation(folder: str | None, want_dtype: DType | None) -> DtypeExpectation | None:
    """The dtype expectation for a checkpoint in ``folder`` (its ``config.json``), or None when nothing says."""
    config = _config(folder) if folder else {}
    arch = _architecture(config)
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    if want_dtype is not None:
        return DtypeExpectation(want_dtype, "explicit", f"you asked for {_name(want_dtype)}", arch, model_type)
    declared, field = _declared(config)
    if declared is None:
        return None
    why = f"config.json declares {field} {_name(declared)}"
    return DtypeExpectation(declared, "declared-dtype", why, arch, model_type)


def _name(dtype: DType) -> str:
    return dtype.name

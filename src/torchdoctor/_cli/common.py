"""What every verb's command shares: usage errors, TARGET resolution, ``--device``/``--dtype`` parsing, JSON output.

Verbs never import this package; the command handlers in ``torchdoctor._cli`` call the verbs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit 2."""


def load_target(spec: str) -> Any:
    """Resolve ``path/to/file.py:name`` or ``package.module:name`` (split on the last ``:``).

    A function, class or ``functools.partial`` is called with no arguments (again, if it returns one); the result (or the object itself) is returned. A 2-tuple
    whose second item is a tuple or dict becomes a ``Target(obj, args/kwargs)``.
    """
    from torchdoctor._report.model import Target

    if ":" not in spec or spec.endswith(":"):
        raise UsageError(
            f"TARGET {spec!r} is neither an existing file or directory nor 'path/to/file.py:name' or 'package.module:name'"
        )
    where, name = spec.rsplit(":", 1)
    if where.endswith(".py") or os.sep in where or "/" in where:
        if not os.path.isfile(where):
            raise UsageError(f"no such file: {where!r} (TARGET {spec!r})")
        mod_name = "_torchdoctor_target_" + os.path.splitext(os.path.basename(where))[0].replace("-", "_")
        spec_obj = importlib.util.spec_from_file_location(mod_name, where)
        if spec_obj is None or spec_obj.loader is None:
            raise UsageError(f"cannot import {where!r}")
        module = importlib.util.module_from_spec(spec_obj)
        sys.modules[mod_name] = module
        sys.path.insert(0, os.path.dirname(os.path.abspath(where)))
        try:
            spec_obj.loader.exec_module(module)
        except (Exception, SystemExit) as exc:  # a script that exits on import must not set our exit code
            raise UsageError(f"importing {where!r} failed: {failure(exc)}") from exc
        finally:
            sys.path.pop(0)
    else:
        try:
            module = importlib.import_module(where)
        except (Exception, SystemExit) as exc:
            raise UsageError(f"cannot import module {where!r}: {failure(exc)}") from exc
    if not hasattr(module, name):
        raise UsageError(f"{where!r} has no attribute {name!r}")
    obj = getattr(module, name)
    for _ in range(8):  # a factory may return another factory (a function returning a functools.partial)
        if not is_factory(obj):
            break
        try:
            obj = obj()
        except (Exception, SystemExit) as exc:
            raise UsageError(f"calling {spec} with no arguments failed: {failure(exc)}") from exc
    if obj is None:
        raise UsageError(f"{spec} is None (a function that returns nothing?): there is nothing to check")
    if isinstance(obj, Target):
        return obj
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], (tuple, dict)):
        inputs = obj[1]
        if isinstance(inputs, dict):
            return Target(obj[0], (), dict(inputs))
        return Target(obj[0], tuple(inputs), {})
    return obj


def is_factory(obj: Any) -> bool:
    """Called to get the object: functions, methods, builtins, classes and ``functools.partial``; never an
    instance with ``__call__`` (a module or a pipeline would run its forward)."""
    import functools
    import inspect

    return isinstance(obj, (type, functools.partial)) or inspect.isroutine(obj)


def failure(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def resolve_target(spec: str) -> Any:
    """A TARGET from the command line: an existing path is returned as a path string (a checkpoint)."""
    if os.path.exists(spec):
        return spec
    return load_target(spec)


def parse_common(args: argparse.Namespace) -> tuple[Any, Any]:
    """``--device`` / ``--dtype`` parsed, with usage errors instead of tracebacks."""
    from torchdoctor._placement import parse_device, parse_dtype

    try:
        device = parse_device(args.device) if getattr(args, "device", None) else None
        dtype = parse_dtype(args.dtype) if getattr(args, "dtype", None) else None
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
        raise UsageError(f"--dtype {args.dtype}: a floating dtype is expected (e.g. bfloat16, float16, float32); "
                         "integer and bool tensors are never cast or judged by dtype")
    return device, dtype


def print_json(doc: Any) -> None:
    import json

    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


GUARD_MODES = ("off", "explain", "strict", "fix", "warn")
CONFIG_KEYS = {"device": str, "dtype": str, "profile": str, "assume_device": str, "mode": str, "limit": int}


def positive_int(text: str) -> int:
    """argparse type for counts and limits: a whole number >= 1 (``--limit -1`` is refused, not ignored)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def find_pyproject(start: str | None = None) -> str | None:
    """The nearest ``pyproject.toml`` from ``start`` (default: the current directory) upward."""
    here = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(here, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def read_config(start: str | None = None) -> tuple[str | None, dict[str, Any]]:
    """``[tool.torchdoctor]`` of the nearest ``pyproject.toml``: (its path, the validated table).

    Keys: ``device``, ``dtype``, ``profile``, ``assume_device``, ``mode`` (the pytest plugin's guard mode) and
    ``limit``. The command line's own options win over it. An unknown key or a wrong type is a usage error.
    """
    path = find_pyproject(start)
    if path is None:
        return None, {}
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if b"tool.torchdoctor" not in raw:
        return path, {}
    try:
        import tomllib as toml
    except ImportError:  # Python 3.10
        try:
            import tomli as toml  # type: ignore[no-redef]
        except ImportError:
            raise UsageError(f"{path} has [tool.torchdoctor]; reading it on Python 3.10 needs `pip install tomli`") \
                from None
    try:
        doc = toml.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from exc
    table = doc.get("tool", {}).get("torchdoctor", {})
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [tool.torchdoctor] must be a table")
    for key, value in table.items():
        want = CONFIG_KEYS.get(key)
        if want is None:
            raise UsageError(f"{path}: [tool.torchdoctor] has no key {key!r}; known keys: {', '.join(CONFIG_KEYS)}")
        if not isinstance(value, want) or isinstance(value, bool):
            raise UsageError(f"{path}: [tool.torchdoctor] {key} must be a {want.__name__}, got {value!r}")
    if "mode" in table and table["mode"] not in GUARD_MODES:
        raise UsageError(f"{path}: [tool.torchdoctor] mode {table['mode']!r} is not one of {', '.join(GUARD_MODES)}")
    if "limit" in table and table["limit"] < 1:
        raise UsageError(f"{path}: [tool.torchdoctor] limit must be >= 1, got {table['limit']}")
    return path, dict(table)


def each_target(verb: str, targets: list[str], args: Any, one: Callable[[str, list[Any]], int]) -> int:
    """Run ``one(spec, docs)`` for every TARGET: one usage error ends a single-target run; with several, it is
    reported and the others still run. The exit code is the worst; ``--json`` prints one document or a list."""
    docs: list[Any] = []
    worst = 0
    for i, spec in enumerate(targets):
        if len(targets) > 1 and not getattr(args, "json", False) and i:
            print()
        try:
            code = one(spec, docs)
        except UsageError as exc:
            if len(targets) == 1:
                raise
            print(f"torchdoctor {verb}: {spec}: {exc}", file=sys.stderr)
            code = 2
        worst = max(worst, code)
    if getattr(args, "json", False) and docs:
        print_json(docs[0] if len(targets) == 1 else docs)
    return worst

"""What every verb's command shares: usage errors, TARGET resolution, ``--device``/``--dtype`` parsing, JSON output.

Verbs never import this package; the command handlers in ``torchdoctor._cli`` call the verbs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from torchdoctor._cli.child import in_child, tell_parent


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit 2."""


def load_target(spec: str) -> Any:
    """Resolve ``path/to/file.py:name`` or ``package.module:name`` (split on the last ``:``).

    A function, class or ``functools.partial`` is called with no arguments (again, if it returns one); the result (or the object itself) is returned. A 2-tuple
    whose second item is a tuple or dict becomes a ``Target(obj, args/kwargs)``.
    """
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
        folder = os.path.dirname(os.path.abspath(where))
        # the file's folder is importable while it loads, while its factory runs (a `def build():` that imports a
        # sibling module inside its body) and, in the CLI's child, for the whole run, as under `python file.py`
        sys.path.insert(0, folder)
        try:
            try:
                spec_obj.loader.exec_module(module)
            except (Exception, SystemExit) as exc:  # a script that exits on import must not set our exit code
                raise UsageError(f"importing {where!r} failed: {failure(exc)}") from exc
            return _resolved(spec, where, name, module)
        finally:
            if not in_child() and folder in sys.path:
                sys.path.remove(folder)
    try:
        module = importlib.import_module(where)
    except (Exception, SystemExit) as exc:
        raise UsageError(f"cannot import module {where!r}: {failure(exc)}") from exc
    return _resolved(spec, where, name, module)


def _resolved(spec: str, where: str, name: str, module: Any) -> Any:
    """The object ``name`` of ``module``: factories called, a (model, inputs) pair made a Target."""
    from torchdoctor._report.model import Target

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
    """A TARGET from the command line: an existing path is returned as a path string (a checkpoint); a Python
    file without ``:name`` is a usage error that says what to type."""
    if os.path.isfile(spec) and spec.endswith(".py"):
        raise UsageError(python_file_hint(spec))
    if os.path.exists(spec):
        return spec
    return load_target(spec)


def python_file_hint(path: str) -> str:
    """What to type for ``scan my_app.py``: the names the file defines at top level, read without running it."""
    import ast

    names: list[str] = []
    try:
        with open(path, "rb") as fh:
            tree = ast.parse(fh.read())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.append(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.extend(t.id for t in targets if isinstance(t, ast.Name))
    except (OSError, SyntaxError, ValueError):
        pass
    names = [n for n in dict.fromkeys(names) if not n.startswith("_") and not n.isupper()]
    example = names[0] if names else "model"
    listed = f"; it defines {', '.join(names[:8])}" + (", ..." if len(names) > 8 else "") if names else ""
    return (f"{path} is a Python file, not a checkpoint: name the object to check as {path}:{example} (a model, "
            f"a pipeline, or a function that returns one, called with no arguments){listed}")


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


def mps_is_one(device: Any, count: int | None) -> None:
    """A Mac has one GPU, ``mps`` (``mps:0``): ``--device mps:1`` or ``--count 2`` with mps describe no machine."""
    if device is None or device.type != "mps":
        return
    if device.index:
        raise UsageError(f"--device mps:{device.index}: a Mac has one GPU, mps (mps:0); there is no "
                         f"mps:{device.index}")
    if count is not None and count > 1:
        raise UsageError(f"--count {count}: a Mac has one GPU (mps); --count is for cuda and xpu")


def assume_option(value: Any) -> Any:
    """``--assume-device``: a device that tensors on meta are taken as loaded on; ``off`` checks them as missing
    (False); unset (None), a model whose parameters are all on meta is taken as loaded on ``--device``."""
    from torchdoctor._placement import parse_device

    if value is None or value == "":
        return None
    if str(value).strip().lower() in ("off", "none", "no", "false"):
        return False
    try:
        return parse_device(value)
    except ValueError as exc:
        raise UsageError(f"--assume-device {value}: {exc}; or 'off' to check meta tensors as missing") from None


def print_json(doc: Any) -> None:
    import json

    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


GUARD_MODES = ("off", "explain", "strict", "fix", "warn")


def positive_int(text: str) -> int:
    """argparse type for counts and limits: a whole number >= 1 (``--limit -1`` is refused, not ignored)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def schema_id(verb: str) -> str:
    from torchdoctor._report.text import schema

    return schema(verb)


def each_target(verb: str, targets: list[str], args: Any, one: Callable[[str, list[Any]], int]) -> int:
    """Run ``one(spec, docs)`` for every TARGET: one usage error ends a single-target run; with several, it is
    reported and the others still run. The exit code is the worst; ``--json`` prints one document or a list."""
    docs: list[Any] = []
    worst = 0
    for i, spec in enumerate(targets):
        if len(targets) > 1 and not getattr(args, "json", False) and i:
            print()
        tell_parent(f"target {spec}")
        try:
            code = one(spec, docs)
        except UsageError as exc:
            if len(targets) == 1:
                raise
            print(f"torchdoctor {verb}: {spec}: {exc}", file=sys.stderr)
            code = 2
            if getattr(args, "json", False):  # a failed TARGET is an entry of the list, not a gap in it
                docs.append({"schema": schema_id(verb), "ok": False, "source": spec, "error": str(exc)})
        worst = max(worst, code)
    if getattr(args, "json", False) and docs:
        print_json(docs[0] if len(targets) == 1 else docs)
    return worst


def positive_float(text: str) -> float:
    """argparse type for ``--timeout``: seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text}")
    return value

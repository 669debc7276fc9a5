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
from typing import Any, NoReturn


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
        _tell_parent(f"target {spec}")
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


# A verb that runs the user's code runs it in a child process: ``os._exit`` in a TARGET kills the process that
# called it, and a TARGET that never returns can only be stopped from outside. The child reports, in a small
# status file named by this variable, the TARGET it is working on and its exit code just before it ends.
CHILD_ENV = "TORCHDOCTOR_CLI_CHILD"
_STATE = {"status": ""}


def in_child() -> bool:
    """True in the child process of :func:`run_in_child` (the variable is removed, so the user's code never
    sees it and a ``torchdoctor`` the user's code starts is a parent again)."""
    path = os.environ.pop(CHILD_ENV, None)
    if path:
        _STATE["status"] = path
    return bool(_STATE["status"])


def _tell_parent(line: str) -> None:
    path = _STATE["status"]
    if path:
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError:
            pass


def child_exit(code: int) -> NoReturn:
    """The child's end: output flushed, the code written for the parent, then gone (a thread the TARGET
    started and never stopped must not keep a finished check alive)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    _tell_parent(f"exit {code}")
    os._exit(code)


def _status(path: str) -> tuple[str | None, int | None]:
    target, code = None, None
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                word, _, rest = line.rstrip("\n").partition(" ")
                if word == "target":
                    target = rest
                elif word == "exit" and rest.lstrip("-").isdigit():
                    code = int(rest)
    except OSError:
        pass
    return target, code


def _stop(proc: Any) -> None:
    proc.kill()
    try:
        proc.wait(timeout=10)
    except Exception:  # pragma: no cover - a process that survives SIGKILL is the kernel's business
        pass


def run_in_child(argv: Sequence[str], verb: str, first: str, timeout: float | None) -> int:
    """Run ``torchdoctor ARGV`` in a child Python with this interpreter's flags, ``sys.path`` and ``sys.argv``
    (so TARGET resolves exactly as it would here), sharing stdout and stderr. Returns the child's exit code, or
    2 with one line when the child ended without finishing (``os._exit``, a signal) or outlived ``timeout``."""
    import json
    import signal
    import subprocess
    import tempfile

    fd, path = tempfile.mkstemp(prefix="torchdoctor-", suffix=".status")
    os.close(fd)
    env = dict(os.environ)
    env[CHILD_ENV] = path
    env["TORCHDOCTOR_CLI_STATE"] = json.dumps({"path": sys.path, "argv": [sys.argv[0] if sys.argv else "torchdoctor",
                                                                         *argv]})
    boot = ("import json, os, sys; s = json.loads(os.environ.pop('TORCHDOCTOR_CLI_STATE')); sys.path[:] = s['path']; "
            "sys.argv[:] = s['argv']; from torchdoctor._cli.main import main; sys.exit(main())")
    cmd = [sys.executable, *subprocess._args_from_interpreter_flags(), "-c", boot]  # type: ignore[attr-defined]
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    try:
        proc = subprocess.Popen(cmd, env=env)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            target, _ = _status(path)
            print(f"torchdoctor {verb}: {target or first}: still running after {timeout:g} s (--timeout); "
                  "stopped, nothing was checked", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            try:
                proc.wait(timeout=5)  # the child got the same Ctrl-C
            except BaseException:
                _stop(proc)
            return 130
        target, code = _status(path)
        if code is not None:
            return code
        rc = proc.returncode
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 and -rc in set(signal.Signals) else f"exit code {rc}"
        print(f"torchdoctor {verb}: {target or first}: the TARGET ended the process ({how}; os._exit or "
              "sys.exit in its code?) before the check finished: nothing was checked", file=sys.stderr)
        return 2
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass

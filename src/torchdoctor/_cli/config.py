"""``[tool.torchdoctor]`` of the nearest ``pyproject.toml``: the one reader the command line and the pytest plugin share.

The table is read with a TOML parser (``tomllib``, or ``tomli`` on Python 3.10), so every spelling TOML allows
counts: ``[tool.torchdoctor]``, ``[tool."torchdoctor"]``, ``[tool]`` with ``torchdoctor = {...}``, dotted keys
``tool.torchdoctor.device = ...``. A file the parser cannot read, a key or a value that is wrong, and a document
nested so deeply that the parser gives up are one line and exit 2, never a traceback.

Torch-free and cheap: a checkpoint scan reads the config before anything else, so the parser is imported only
when the file could hold the table at all (see :func:`could_hold_table`).
"""

from __future__ import annotations

import os
from typing import Any

from torchdoctor._cli.common import GUARD_MODES, UsageError

CONFIG_KEYS = {"device": str, "dtype": str, "profile": str, "assume_device": str, "mode": str, "limit": int}


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


def could_hold_table(raw: bytes) -> bool:
    """False only when no spelling of ``[tool.torchdoctor]`` can be in ``raw``. A key is bare (its letters as
    written), a literal string (as written) or a basic string, where only ``\\u`` / ``\\U`` escapes can spell a
    letter; and a key is followed, after its closing quote and blanks, by ``.``, ``=`` or ``]``. So without such
    an occurrence of the word and without those escapes there is no such key (``"torchdoctor>=0.1"`` in a
    dependency list is not one); anything else is parsed.

    >>> could_hold_table(b'[tool]\\ntorchdoctor = {device = "cpu"}'), could_hold_table(b'[tool.black]\\n')
    (True, False)
    >>> could_hold_table(b'[tool."torch\\\\u0064octor"]'), could_hold_table(b'deps = ["torchdoctor>=0.1"]')
    (True, False)
    >>> could_hold_table(b"[tool . 'torchdoctor' ]"), could_hold_table(b'tool.torchdoctor.device = "cpu"')
    (True, True)
    """
    if b"\\u" in raw or b"\\U" in raw:
        return True
    if b"torchdoctor" not in raw:
        return False
    import re

    return re.search(rb"torchdoctor[\"']?[ \t]*[.=\]]", raw) is not None


def shown(value: Any, limit: int = 60) -> str:
    """A config value as a message shows it: containers by type and length (a deeply nested array has no
    printable repr), text clipped."""
    if isinstance(value, (list, dict)):
        return f"{'a table' if isinstance(value, dict) else 'an array'} of {len(value)} item(s)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _parse(path: str, raw: bytes) -> dict[str, Any]:
    try:
        import tomllib as toml
    except ImportError:  # Python 3.10
        try:
            import tomli as toml  # type: ignore[no-redef]
        except ImportError:
            raise UsageError(f"{path} may hold [tool.torchdoctor]; reading it on Python 3.10 needs "
                             "`pip install tomli`") from None
    try:
        return toml.loads(raw.decode("utf-8"))
    except RecursionError:  # arrays or tables nested thousands deep: the parser recurses per level
        raise UsageError(f"{path} is nested too deeply to read (arrays or tables inside each other); "
                         "flatten it") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start}): save it as UTF-8") from None
    except ValueError as exc:  # tomllib.TOMLDecodeError
        raise UsageError(f"{path} is not valid TOML: {str(exc)[:200]}") from None
    except MemoryError:
        raise UsageError(f"{path} is too large to read") from None


def _check_value(path: str, key: str, value: Any) -> None:
    """A value of the right type that no verb could use: named by its key, before any verb reads it."""
    where = f"{path}: [tool.torchdoctor] {key}"
    if key == "mode" and value not in GUARD_MODES:
        raise UsageError(f"{where} {shown(value)} is not one of {', '.join(GUARD_MODES)}")
    if key == "limit" and value < 1:
        raise UsageError(f"{where} must be >= 1, got {value}")
    if key in ("device", "assume_device"):
        from torchdoctor._checkpoint.dtypes import parse_location

        text = value.strip()
        if key == "assume_device" and text.lower() in ("off", "none", "no", "false"):
            return
        if parse_location(text) is None:
            raise UsageError(f"{where} {shown(value)} is not a device: use a torch device string such as "
                             "'cpu', 'cuda:0', 'cuda:1', 'xpu', 'mps' or 'meta'"
                             + (", or 'off'" if key == "assume_device" else ""))
    if key == "dtype":
        from torchdoctor._checkpoint.dtypes import parse_dtype

        try:
            dtype = parse_dtype(value)
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}") from None
        if not (dtype.is_floating_point or dtype.is_complex):
            raise UsageError(f"{where} {shown(value)}: a floating dtype is expected (e.g. bfloat16, float16, "
                             "float32)")


def read_config(start: str | None = None) -> tuple[str | None, dict[str, Any]]:
    """``[tool.torchdoctor]`` of the nearest ``pyproject.toml``: (its path, the validated table).

    Keys: ``device``, ``dtype``, ``profile``, ``assume_device``, ``mode`` (the pytest plugin's guard mode) and
    ``limit``. The command line's own options win over it. An unknown key or a wrong value is a usage error
    that names the key.
    """
    path = find_pyproject(start)
    if path is None:
        return None, {}
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not could_hold_table(raw):
        return path, {}
    doc = _parse(path, raw)
    tool = doc.get("tool")
    if not isinstance(tool, dict) or "torchdoctor" not in tool:
        return path, {}
    table = tool["torchdoctor"]
    if not isinstance(table, dict):
        raise UsageError(f"{path}: tool.torchdoctor must be a table ([tool.torchdoctor]), got {shown(table)}")
    for key, value in table.items():
        want = CONFIG_KEYS.get(key)
        if want is None:
            raise UsageError(f"{path}: [tool.torchdoctor] has no key {shown(key)}; known keys: "
                             f"{', '.join(CONFIG_KEYS)}")
        if not isinstance(value, want) or isinstance(value, bool):
            raise UsageError(f"{path}: [tool.torchdoctor] {key} must be a {want.__name__}, got {shown(value)}")
        _check_value(path, key, value)
    return path, dict(table)


CONFIGURED = ("device", "dtype", "profile", "assume_device", "limit")  # the options a table may default


def apply_config(args: Any) -> None:
    """Options the command line left unset take their value from ``[tool.torchdoctor]``; ``args.sources`` says
    where each came from (reports say where an expectation came from)."""
    path, table = read_config()
    args.config = path if table else None
    args.sources = {key: f"--{key.replace('_', '-')}" for key in CONFIGURED if getattr(args, key, None) is not None}
    for key in CONFIGURED:
        if key in table and hasattr(args, key) and getattr(args, key) is None:
            setattr(args, key, table[key])
            args.sources[key] = f"[tool.torchdoctor] in {path}"
    if args.sources.get("profile", "").startswith("[tool.torchdoctor]"):  # a preset name only simulate can check
        from torchdoctor._rules.presets import preset

        try:
            preset(args.profile)
        except ValueError as exc:
            raise UsageError(f"{path}: [tool.torchdoctor] profile: {exc}") from None
    if getattr(args, "limit", None) is None and hasattr(args, "limit"):
        args.limit = 40

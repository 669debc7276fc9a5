"""Pickle globals that were not imported: what each one could do, in words the user can act on.

One problem per global; a harmless data type that only serves as an argument of another global (numpy's
``ndarray`` / ``dtype`` inside ``_reconstruct``) is named in that one's message instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdoctor._report.model import Problem

__all__ = ["unsafe_problems"]


_SCRIPT_MODULES = frozenset(
    "os posix nt subprocess sys shutil socket importlib runpy pty webbrowser pickle _pickle marshal ctypes code codeop "
    "types operator functools pdb timeit multiprocessing threading signal asyncio urllib http requests ftplib smtplib "
    "tempfile io _io _posixsubprocess builtins dill cloudpickle".split()
)
_DATA_MODULES = frozenset(
    "numpy pathlib argparse collections datetime enum decimal fractions uuid omegaconf typing copyreg".split()
)
_LIBRARY_MODULES = frozenset(
    "torch __torch__ pytorch_lightning lightning transformers diffusers accelerate peft tokenizers".split()
)


def _verdict(name: str) -> str:
    top = name.split(".", 1)[0]
    if top in _SCRIPT_MODULES or name.startswith(("torch.hub", "numpy.testing")):
        return "can run code or touch the system: torch.load(weights_only=False) would run it; do not load this file"
    if top in _LIBRARY_MODULES:
        return "a library class, harmless to import, that torch.load(weights_only=True) refuses (save a state_dict)"
    if top in _DATA_MODULES:
        return "a plain data type, usually harmless, that torch.load(weights_only=True) refuses"
    return f"code from module {name.rsplit('.', 1)[0]!r}: torch.load(weights_only=False) would import and run it"


def _short_repr(obj: Any) -> str:
    """Bounded by depth and length: pickle arguments can be deep or huge on purpose."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxtuple, r.maxlist, r.maxdict = 3, 100, 60, 4, 4, 4
    try:
        text = r.repr(obj)
    except Exception:  # a hostile object must not break the report
        text = "<unprintable arguments>"
    return text if len(text) <= 160 else text[:157] + "..."


def _inside(path: str, outer: str) -> bool:
    return path.startswith(outer + ".") if outer else bool(path)


def unsafe_problems(
    path_of: Callable[[str], str], label: str, unsafe: list[tuple[str, str | None, tuple[Any, ...]]]
) -> list[Problem]:
    """One problem per global; a harmless global that only serves as an argument of another one (numpy's
    ``ndarray`` / ``dtype`` inside ``_reconstruct`` / ``scalar``) is named in that one's message instead."""
    where_of = {name: where for name, where, _ in unsafe}
    folded: dict[str, list[str]] = {}
    for name, where, _ in unsafe:
        if where is None or name.split(".", 1)[0] not in _DATA_MODULES:
            continue
        outers = [o for o, w in where_of.items() if o != name and w is not None and _inside(where, w)]
        if outers:  # the nearest enclosing global names it
            folded.setdefault(max(outers, key=lambda o: len(where_of[o] or "")), []).append(name)
    hidden = {n for names in folded.values() for n in names}
    out = []
    for name, where, args in unsafe:
        if name in hidden:
            continue
        path = path_of(where) if where is not None else label
        call = f" called with {_short_repr(args)}" if args else ""
        also = f" (with {', '.join(sorted(folded[name]))})" if name in folded else ""
        msg = f"pickle global {name}{call}{also} in {label} was not imported (placeholder); {_verdict(name)}"
        out.append(Problem("unsafe_global", path, "container", name, "an allow-listed global", msg))
    return out

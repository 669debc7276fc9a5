"""Pickle globals that were not imported: what each one could do, in words the user can act on.

One problem per global; a harmless data type that only serves as an argument of another global (numpy's
``ndarray`` / ``dtype`` inside ``_reconstruct``) is named in that one's message instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdoctor._checkpoint.dtypes import clipped
from torchdoctor._checkpoint.modclass import HOLDS_MODULE_CLASSES, ModuleClassName
from torchdoctor._checkpoint.names import DATA_TYPES, LIBRARY_CLASSES
from torchdoctor._checkpoint.result import Finding as Problem

__all__ = ["CAN_RUN_CODE", "unsafe_problems", "verdict"]


# Modules whose attributes reach the system; a dotted name passing through one (``torch.os.system``,
# ``argparse._os.system``) is named by what it resolves to.
_SYSTEM_MODULES = frozenset(
    "os posix nt subprocess sys shutil socket importlib runpy pty webbrowser pickle _pickle marshal ctypes code "
    "codeop builtins __builtins__ io _io _posixsubprocess".split()
)
CAN_RUN_CODE = "can run code"


def _resolves_to(name: str) -> str:
    """What a dotted name resolves to when it passes through a module attribute (``torch.os`` is ``os``)."""
    parts = name.split(".")
    for i in range(len(parts) - 2, 0, -1):
        if parts[i].lstrip("_") in _SYSTEM_MODULES:
            return f" ({'.'.join(parts[:i + 1])} is the {parts[i].lstrip('_')} module: this is " \
                   f"{parts[i].lstrip('_')}.{'.'.join(parts[i + 1:])})"
    return ""


def verdict(name: str) -> str:
    """What importing the global ``name`` (the full dotted name the unpickler resolves) could do: decided by exact
    membership in an allow-list, never by a prefix; anything not on it can run code.

    >>> verdict("argparse.Namespace").startswith("a plain data type")
    True
    >>> verdict("argparse._os.system")[:12], verdict("pathlib.Path.touch")[:12]
    ('can run code', 'can run code')
    """
    if name in LIBRARY_CLASSES:
        return "a library class, harmless to import, that torch.load(weights_only=True) refuses (save a state_dict)"
    if name in DATA_TYPES:
        return "a plain data type, usually harmless, that torch.load(weights_only=True) refuses"
    return (f"{CAN_RUN_CODE}{_resolves_to(name)}: not on the allow-list of harmless names, so "
            "torch.load(weights_only=False) would import and call it; do not load this file")


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
    path_of: Callable[[str], str], label: str, unsafe: list[tuple[str, str | None, tuple[Any, ...]]], failure: str = ""
) -> list[Problem]:
    """One problem per global; a harmless global that only serves as an argument of another one (numpy's
    ``ndarray`` / ``dtype`` inside ``_reconstruct`` / ``scalar``) is named in that one's message instead."""
    where_of = {name: where for name, where, _ in unsafe}
    folded: dict[str, list[str]] = {}
    for name, where, _ in unsafe:
        if where is None or name not in DATA_TYPES:
            continue
        outers = [o for o, w in where_of.items() if o != name and w is not None and _inside(where, w)]
        if outers:  # the nearest enclosing global names it
            folded.setdefault(max(outers, key=lambda o: len(where_of[o] or "")), []).append(name)
    hidden = {n for names in folded.values() for n in names}
    out = []
    classes = [name for name, _, _ in unsafe if isinstance(name, ModuleClassName)]
    if classes:  # one finding for a whole pickled model, not one per class
        shown_names = ", ".join(clipped(n.rsplit(".", 1)[-1], 60) for n in classes[:6])
        more = f" and {len(classes) - 6} more" if len(classes) > 6 else ""
        msg = (f"{clipped(label)} {HOLDS_MODULE_CLASSES} ({len(classes)} class(es) of installed libraries, only named "
               f"as a pickled model names them, never called: {shown_names}{more}); save model.state_dict() and "
               "load it into a model you build")
        if failure:
            msg += f" (the pickle then fails to load: {failure})"
        out.append(Problem("unsafe_global", label, "container", clipped(classes[0], 300), "an allow-listed global", msg))
    for name, where, args in unsafe:
        if name in hidden or isinstance(name, ModuleClassName):
            continue
        path = path_of(where) if where is not None else label
        call = f" called with {_short_repr(args)}" if args else ""
        also = f" (with {', '.join(sorted(folded[name]))})" if name in folded else ""
        msg = (f"pickle global {clipped(name)}{call}{clipped(also, 200)} in {clipped(label)} was not imported "
               f"(placeholder); {verdict(clipped(name))}")
        if failure:
            msg += f" (the pickle then fails to load: {failure})"
        out.append(Problem("unsafe_global", path, "container", clipped(name, 300), "an allow-listed global", msg))
    return out

"""Unpickle ``torch.save`` records without running a single line of their pickle code.

A restricted :class:`pickle.Unpickler` maps a short allow-list of torch / collections rebuild functions to
stand-ins that build :class:`TensorStub` records (dtype, shape, stride, the storage's *saved* location) and
never touch storage data. Any other global is never imported: it becomes a :class:`Placeholder` class that
records how the pickle tried to use it, so the tensors around it are still found and the global is named.

The container formats around the pickle live in :mod:`torchdoctor._checkpoint.torchfile`, which hands this
unpickler its storage records and its reader for storages embedded as small streams.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from typing import IO, Any

from torchdoctor._checkpoint.known import TORCH_RECORDS, torch_allows
from torchdoctor._checkpoint.modclass import ModuleClassName, candidate, stand_in
from torchdoctor._checkpoint.rebuild import complex_from, safe_table
from torchdoctor._checkpoint.stubs import (
    CheckpointError,
    Placeholder,
    Safe,
    StorageRef,
    StorageType,
    TensorStub,
    UnsafePickle,
    placeholder_class,
)

__all__ = [
    "CheckpointError", "Placeholder", "SafeUnpickler", "SlowUnpickler", "StorageRef", "StorageType", "TensorStub",
    "UnsafePickle", "placeholder_class",
]


_SAFE: dict[str, Any] = {}
_MODULE_ALIASES = {"__builtin__": "builtins", "copy_reg": "copyreg", "torch.tensor": "torch._tensor"}


def _compat(module: str, name: str) -> tuple[str, str]:
    """The name Python's own unpickler resolves for a protocol 0-2 pickle (``__builtin__.eval`` is
    ``builtins.eval``): what ``torch.load`` would import."""
    import _compat_pickle

    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, _MODULE_ALIASES.get(module, module)), name


def _what(obj: Any) -> str:
    """A value on the stack where a name was expected, as the call that computed it."""
    if isinstance(obj, Placeholder):
        return f"{obj._td_global}{_short(obj._td_args)}"
    return f"a {type(obj).__name__}"


def _short(args: tuple[Any, ...]) -> str:
    text = repr(args) if all(isinstance(a, (str, int, float, bytes)) for a in args) else "(...)"
    return text if len(text) <= 80 else text[:77] + "..."


class _Resolving:
    """What both unpicklers share: only allow-listed globals resolve; everything else becomes a placeholder and
    is recorded by its full dotted name (module, then the attribute path)."""

    unknown: dict[str, type[Placeholder]]
    extensions: dict[int, tuple[str, str]]

    def __init__(
        self,
        file: IO[bytes],
        persistent: Callable[[Any], Any] | None = None,
        nested: Callable[[dict[str, type[Placeholder]], Any], Any] | None = None,
        hashes: Any = None,
    ) -> None:
        super().__init__(file, encoding="latin1")  # type: ignore[call-arg]  # the unpickler next in the MRO
        self._setup(persistent, nested, hashes)

    def _setup(self, persistent: Any, nested: Any, hashes: Any) -> None:
        if not _SAFE:
            _SAFE.update(safe_table())
        self.unknown = {}
        self.misused: set[str] = set()  # module-class candidates the pickle did more than name (modclass)
        self.extensions = {}  # copyreg codes the pickle itself registers (through copyreg.add_extension)
        self._persistent = persistent
        self._nested = nested
        self._complex = Safe("builtins.complex", functools.partial(complex_from, hashes))

    def find_class(self, module: str, name: str) -> Any:
        module, name = _compat(module, name)
        full = f"{module}.{name}"
        safe = _SAFE.get(full)
        if safe is not None:
            return safe
        if full == "builtins.complex":
            return self._complex
        if full == "torch.storage._load_from_bytes" and self._nested is not None:
            return Safe(full, functools.partial(self._nested, self.unknown))
        if full in TORCH_RECORDS or torch_allows(full):  # read as a record, not reported: torch loads it
            return placeholder_class(full)
        if full not in self.unknown:
            self.unknown[full] = stand_in(full, self.misused) if candidate(full) else placeholder_class(full)
        if full == "copyreg.add_extension":  # recorded, so that a later EXT opcode names what it would import
            return Safe(full, self._add_extension)
        return self.unknown[full]

    def names(self) -> tuple[str, ...]:
        """The globals named, in order; a model class only named as such is a :class:`ModuleClassName`."""
        return tuple(ModuleClassName(n) if getattr(c, "_td_stand_in", False) and n not in self.misused else n
                     for n, c in self.unknown.items())

    def _add_extension(self, *args: Any) -> Any:
        if len(args) == 3 and isinstance(args[0], str) and isinstance(args[1], str) and type(args[2]) is int:
            self.extensions[args[2]] = (args[0], args[1])
        return placeholder_class("copyreg.add_extension")(*args)

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise pickle.UnpicklingError("persistent id in a plain pickle")
        return self._persistent(pid)


class SafeUnpickler(_Resolving, pickle.Unpickler):
    """Resolves only allow-listed globals; everything else becomes a placeholder and is recorded.

    ``nested(unknown, data)`` reads a storage that the pickle embeds as a small ``torch.save`` stream
    (``torch.storage._load_from_bytes``); the container readers of :mod:`torchdoctor._checkpoint.torchfile` supply it,
    so this module does not depend on them. Without it that global is a placeholder like any other.
    """


class SlowUnpickler(_Resolving, pickle._Unpickler):  # type: ignore[name-defined,misc]
    """The pure-Python unpickler, for the two opcodes whose C implementation hides what they would import: copyreg
    extension codes (EXT1/2/4, resolved through the file's own ``copyreg.add_extension`` calls, then the registry
    ``torch.load`` would use) and a STACK_GLOBAL whose module or name is computed at load time (refused, naming
    the call that computes it). Used only for pickles that hold them (about ten times slower)."""

    stack: list[Any]
    append: Callable[[Any], None]

    def get_extension(self, code: int) -> None:
        import copyreg

        key = self.extensions.get(code) or copyreg._inverted_registry.get(code)  # type: ignore[attr-defined]
        if not key:
            raise pickle.UnpicklingError(f"copyreg extension code {code} is not registered (torch.load fails on "
                                         "it too)")
        self.append(self.find_class(*key))

    def _load_stack_global(self) -> None:
        name = self.stack.pop()
        module = self.stack.pop()
        if type(name) is not str or type(module) is not str:
            calls = " and ".join(_what(x) for x in (module, name) if type(x) is not str)
            raise pickle.UnpicklingError(f"the module or name of a global is computed at load time by {calls}")
        self.append(self.find_class(module, name))

    dispatch = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]
    dispatch[pickle.STACK_GLOBAL[0]] = _load_stack_global  # type: ignore[assignment]

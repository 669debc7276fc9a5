"""``FrozenRecord``: what ``@dataclass(frozen=True)`` gives a class — equality and hash over its fields, the
dataclass repr, no assignment after ``__init__`` — written once instead of compiled per class.

The decorator compiles each generated method with ``exec`` when the module is imported (about a millisecond
apiece), and the first ``scan`` or ``move`` of a process paid that for every result type (issue 28). A record class
stays a dataclass (``@dataclass(init=False, repr=False, eq=False)``: ``fields``, ``replace``, ``asdict`` and
``__match_args__`` work), lists its field names in ``_fields``, and writes its own ``__init__`` storing into
``self.__dict__``. tests/report/test_records.py and tests/move/test_results.py compare each record with a twin made
by the decorator.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class FrozenRecord:
    """Equality, hash, repr and frozenness of a frozen dataclass over ``_fields``."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def _values(self) -> tuple[Any, ...]:
        d = self.__dict__
        return tuple([d[n] for n in self._fields])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return record_repr(self, self._fields)

    # frozen as the decorator makes it: any name on the class that declared the fields, field names on a subclass
    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._fields or "_fields" in type(self).__dict__:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._fields or "_fields" in type(self).__dict__:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super().__delattr__(name)


class MutableRecord:
    """Equality and repr of a plain (mutable) dataclass over ``_fields``; unhashable, as the decorator leaves it.
    For the internal records a virtual run imports before the program's first line (issue 43 point 4)."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            d, o = self.__dict__, other.__dict__
            return tuple([d[n] for n in self._fields]) == tuple([o[n] for n in self._fields])
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return record_repr(self, self._fields)


def record_repr(obj: Any, names: Any) -> str:
    """``Name(field=value, ...)``, as the generated ``__repr__`` writes it."""
    d = obj.__dict__
    return f"{obj.__class__.__qualname__}(" + ", ".join(f"{n}={d[n]!r}" for n in names) + ")"

"""A class with the fields of a hand-written record (names, defaults, and the init/repr/compare flags) whose methods
the dataclass decorator generates: the twin a record is compared with, so writing its methods by hand (import cost)
changes nothing it does."""

from __future__ import annotations

import dataclasses


def dataclass_twin(cls: type, frozen: bool = False) -> type:
    ns: dict[str, object] = {"__annotations__": {}}
    for f in dataclasses.fields(cls):
        ns["__annotations__"][f.name] = object  # type: ignore[index]
        flags = dict(init=f.init, repr=f.repr, compare=f.compare)
        if f.default is not dataclasses.MISSING:
            ns[f.name] = dataclasses.field(default=f.default, **flags)  # type: ignore[call-overload]
        elif f.default_factory is not dataclasses.MISSING:
            ns[f.name] = dataclasses.field(default_factory=f.default_factory, **flags)  # type: ignore[call-overload]
        else:
            ns[f.name] = dataclasses.field(**flags)  # type: ignore[call-overload]
    return dataclasses.dataclass(frozen=frozen)(type(cls.__name__, (), ns))

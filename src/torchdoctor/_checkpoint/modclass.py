"""Classes of a whole pickled model (``torch.save(model)``) from transformers, diffusers and peft.

``torch.save(model)`` pickles each submodule as its class (``NEWOBJ`` with no arguments) plus its saved fields;
``torch.load(weights_only=True)`` refuses every such class, and that is the finding: "holds module classes". It
is not "can run code" as long as the pickle only *names* the class the way a pickled model does. A candidate is a
plain class name (one CamelCase identifier, no dotted attribute path, no private module on the way) inside one of
those libraries' packages; the restricted unpickler hands out a stand-in that notices any other use (called with
arguments through ``REDUCE``, built with arguments, an instance called), and such a name stays "can run code".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from torchdoctor._checkpoint.stubs import Placeholder, placeholder_class

__all__ = ["HOLDS_MODULE_CLASSES", "ModuleClassName", "candidate", "merge", "stand_in"]

HOLDS_MODULE_CLASSES = "holds module classes: torch.load(weights_only=True) refuses it"
_LIBRARIES = ("transformers", "diffusers", "peft")
_CLASS = re.compile(r"[A-Z][A-Za-z0-9_]*\Z")
_MODULE_PART = re.compile(r"[a-z][a-z0-9_]*\Z")


class ModuleClassName(str):
    """A global's name that the pickle only used as a model class (the verdict is "holds module classes")."""

    __slots__ = ()


def candidate(full: str) -> bool:
    """A plain class name inside transformers, diffusers or peft (exact shape, never a prefix).

    >>> candidate("transformers.models.llama.modeling_llama.LlamaForCausalLM")
    True
    >>> candidate("transformers.models.llama.modeling_llama.os.system"), candidate("transformers.pipeline")
    (False, False)
    >>> candidate("transformers._internal.Thing"), candidate("torch.nn.Linear")
    (False, False)
    """
    module, _, name = full.rpartition(".")
    parts = module.split(".")
    return (parts[0] in _LIBRARIES and len(parts) >= 2 and _CLASS.match(name) is not None
            and all(_MODULE_PART.match(p) for p in parts[1:]))


def stand_in(full: str, misused: set[str]) -> type[Placeholder]:
    """A placeholder class for ``full`` that adds ``full`` to ``misused`` when the pickle does more than name it:
    a call with arguments through ``REDUCE`` (``__init__`` runs only then), arguments to ``NEWOBJ``, an instance
    called."""
    base = placeholder_class(full)

    def new(cls: type[Placeholder], *args: Any, **kwargs: Any) -> Placeholder:
        if args or kwargs:
            misused.add(full)
        return base.__new__(cls, *args, **kwargs)

    def init(self: Placeholder, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:  # REDUCE with no arguments is how a dict subclass (diffusers' FrozenDict) is pickled
            misused.add(full)

    def call(self: Placeholder, *args: Any, **kwargs: Any) -> Placeholder:
        misused.add(full)
        return base.__call__(self, *args, **kwargs)

    return type(base.__name__, (base,), {"__new__": new, "__init__": init, "__call__": call, "_td_global": full,
                                         "_td_stand_in": True, "__module__": base.__module__})


def merge(names: Iterable[str]) -> tuple[str, ...]:
    """Names once each, in order; a name used otherwise anywhere (a plain ``str``) wins over a module class."""
    out: dict[str, str] = {}
    for n in names:
        if n not in out or (isinstance(out[n], ModuleClassName) and not isinstance(n, ModuleClassName)):
            out[n] = n
    return tuple(out.values())

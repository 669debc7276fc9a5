"""The optimizers that hold the parameters a ``move`` changes, found without being told (``optimizer="auto"``).

``Module.to`` never touches an optimizer, so after ``model.double()`` Adam's float32 ``exp_avg`` sits under float64
parameters and the next ``step()`` raises. ``move`` finds the optimizers itself, at no cost when there are none:

1. **Who else holds a parameter?** A parameter held only by its module has exactly the references the walk found
   slots for, plus one per plan entry (the entry holds the tensor too). ``sys.getrefcount`` per parameter says
   whether anything else holds it (~0.1 µs a tensor); a model nobody else holds is done here, with no search.
2. **The caller's frames.** A training script keeps its optimizer in a local or a global, or one level down (a
   trainer's ``.optimizer``, a scheduler's ``.optimizer``, a list of optimizers). Those values are read through
   ``__dict__`` and the builtin container methods, never a property or ``__getattr__`` of a user type, and are
   bounded in number. (Before Python 3.13, reading a function frame's ``f_locals`` leaves a snapshot of its locals
   on the frame until it returns, as a debugger's look does: a local the caller deletes after the move is freed
   when that function returns.)
3. **Every object the cyclic GC tracks**, only when the optimizers found so far do not account for every extra
   reference counted in 1: one pass, filtered in C by class (``gc.get_objects`` then ``type(o) in classes``). It
   costs about as much as a cast of a GPT-2-small model (docs/move-speed.md), so it runs only then.

An optimizer is anything whose class derives from ``torch.optim.Optimizer`` (bitsandbytes' 8-bit optimizers and
accelerate's ``AcceleratedOptimizer`` do); a wrapper sharing its inner optimizer's ``state`` counts once.
"""

from __future__ import annotations

import gc
import itertools
import sys
import types
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["Search", "held_elsewhere", "search"]

_FRAMES = 64  # caller frames read; a training loop sits a few frames above the move
_VALUES = 20_000  # values looked at in all frames together (a notebook's globals hold its whole history)
_ITEMS = 256  # items read per container or ``__dict__``
_SKIP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, str, bytes,
         int, float, bool, torch.Tensor)


class Search:
    """What the search found: ``found`` optimizers (in the order found) and ``error``, a one-line reason when it
    could not look (then ``found`` holds what it saw before it stopped)."""

    __slots__ = ("found", "error", "heap", "extra")

    def __init__(self) -> None:
        self.found: list[Any] = []
        self.error: str | None = None
        self.heap = False  # whether the pass over every tracked object ran
        self.extra = 0  # parameters held elsewhere that no optimizer accounts for (a user's own list)


def held_elsewhere(steps: Iterable[Any]) -> dict[int, tuple[torch.Tensor, int]]:
    """id -> (parameter, references beyond its module slots and the plan) for the planned tensors an optimizer
    could hold (a ``Parameter``, or a tensor that requires grad), wherever that count is not zero.

    Read right after the plan: each canonical entry and each alias holds the tensor once, as does its slot."""
    out: dict[int, tuple[torch.Tensor, int]] = {}
    count = sys.getrefcount
    param = torch.nn.Parameter
    for s in steps:
        e = s.entry
        t = e.tensor
        if not (isinstance(t, param) or t.requires_grad):
            continue
        # ``t`` (this frame) and getrefcount's own argument are the two references beyond slots and entries
        extra = count(t) - 2 * (1 + len(s.aliases)) - 2
        if extra:
            out[id(t)] = (t, extra)
    return out


def _classes() -> set[type]:
    out: set[type] = set()
    todo: list[type] = [torch.optim.Optimizer]
    while todo:
        c = todo.pop()
        if c not in out:
            out.add(c)
            try:
                todo.extend(c.__subclasses__())
            except TypeError:  # ``type.__subclasses__`` needs the class itself; a metaclass may differ
                todo.extend(type.__subclasses__(c))
    return out


def _frame_values(frame: Any, classes: set[type]) -> Iterable[Any]:
    """Optimizers reachable from the frames' locals and globals, at most two levels down."""
    budget = _VALUES
    seen_globals: set[int] = set()
    frames = 0
    while frame is not None and frames < _FRAMES and budget > 0:
        frames += 1
        spaces = [frame.f_locals]
        if id(frame.f_globals) not in seen_globals:
            seen_globals.add(id(frame.f_globals))
            spaces.append(frame.f_globals)
        for space in spaces:
            for v in list(itertools.islice(space.values(), _ITEMS * 4)):
                budget -= 1
                yield from _near(v, classes, 2)
        frame = frame.f_back


def _near(v: Any, classes: set[type], depth: int) -> Iterable[Any]:
    tp = type(v)
    if tp in classes:
        yield v
        return
    if depth == 0 or issubclass(tp, _SKIP):  # the class alone: ``isinstance`` may ask the object its __class__
        return
    if tp is list or tp is tuple:
        items: Iterable[Any] = itertools.islice(v, _ITEMS)
    elif tp is dict:
        items = itertools.islice(dict.values(v), _ITEMS)
    else:
        try:
            d = object.__getattribute__(v, "__dict__")  # the instance's own attributes, no descriptor of its class
        except Exception:
            return
        if type(d) is not dict:
            return
        items = itertools.islice(dict.values(d), _ITEMS)
    for x in list(items):
        yield from _near(x, classes, depth - 1)


def _holders(opt: Any) -> tuple[list[Any], Any]:
    """The optimizer's parameter lists and its state dict (what holds references to parameters)."""
    lists = []
    for group in opt.param_groups:
        params = group.get("params") if isinstance(group, dict) else None
        if isinstance(params, list):
            lists.append(params)
    return lists, opt.state


def _refs(opts: list[Any]) -> Counter[int]:
    """References the optimizers hold, by parameter id: each param list and each state dict counted once (a
    wrapper and the optimizer it wraps share both)."""
    refs: Counter[int] = Counter()
    seen: set[int] = set()
    for o in opts:
        lists, state = _holders(o)
        for holder in [*lists, state]:
            if id(holder) in seen:
                continue
            seen.add(id(holder))
            refs.update(id(k) for k in (holder if isinstance(holder, list) else list(holder)))
    return refs


def _add(out: Search, seen: set[int], o: Any, wanted: dict[int, tuple[torch.Tensor, int]]) -> None:
    """Keep ``o`` when it holds a wanted parameter, once per state dict (a wrapper after its inner optimizer); an
    optimizer whose groups or state cannot be read is named in ``out.error`` and left alone."""
    if id(o) in seen:
        return
    seen.add(id(o))
    try:
        lists, state = _holders(o)
        if id(state) in seen or not any(id(p) in wanted for ps in lists for p in ps):
            return
    except Exception as exc:
        out.error = out.error or f"{type(o).__name__}: {type(exc).__name__}: {_line(exc)}"
        return
    seen.add(id(state))
    out.found.append(o)


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else "no message"


def search(wanted: dict[int, tuple[torch.Tensor, int]], given: list[Any], frame: Any) -> Search:
    """The optimizers, other than ``given``, that hold parameters in ``wanted`` (see ``held_elsewhere``);
    ``frame`` is the caller's frame, where the search starts."""
    out = Search()
    seen: set[int] = set()
    for o in given:
        try:
            seen.update((id(o), id(o.state)))
        except Exception:  # a given optimizer was already checked by ``optim.optimizers``
            seen.add(id(o))
    try:
        classes = _classes()
        for o in _frame_values(frame, classes):
            _add(out, seen, o, wanted)
        if _unexplained(wanted, given + out.found):
            out.heap = True
            objs = gc.get_objects()
            candidates = list(itertools.compress(objs, map(classes.__contains__, map(type, objs))))
            del objs  # every tracked object, held only for the filter
            for o in candidates:
                _add(out, seen, o, wanted)
        out.extra = _unexplained(wanted, given + out.found)
    except Exception as exc:  # a search that fails must not fail the move it serves: say it could not look
        out.error = f"{type(exc).__name__}: {_line(exc)}"
    return out


def _unexplained(wanted: dict[int, tuple[torch.Tensor, int]], opts: list[Any]) -> int:
    """How many wanted parameters have more references than the optimizers account for."""
    refs = _refs(opts)
    return sum(1 for pid, (_, extra) in wanted.items() if extra != refs.get(pid, 0))

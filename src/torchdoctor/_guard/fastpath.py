"""strict at the module boundary: the per-op dispatch mode only inside a module whose tensors disagree.

Any ``TorchDispatchMode`` costs Python on every aten op, doing nothing (bench/guard.py, docs/guard-speed.md): around
``generate()`` that floor alone is about strict's whole budget. Yet a placement rule can only fire where tensors
disagree: two devices, two floating dtypes, a meta or a subclass tensor among real ones. So when a module starts,
its own tensors (parameters, buffers, plain tensor attributes) and the tensors among its positional inputs are
compared, in one loop. When they agree, its ops run with no mode at all. When they disagree (an fp32 bias in a bf16
model, a CPU buffer, a meta weight, an fp32 input, an offloaded or per-call-cast layer whose weights arrive later),
the dispatch mode is pushed until the module returns, and every op inside it, submodules included, is checked by
the rules exactly as before. A suspect module whose output takes part in autograd keeps the mode on until the next
outermost forward starts, so its backward (where a saved tensor of the wrong dtype surfaces) is checked too.
The code around the model (outside any module: a generate loop's sampling, a function that calls no module) is
checked call by call (``_guard/aftergrad.py``): a torch call whose tensors disagree runs under the dispatch mode, so
the rules see each of its aten ops; the others pay one Python hop per torch call, not one per aten op. Between a
forward whose output autograd will differentiate and the end of its backward nothing is checked (the backward of
modules that agreed); what follows the backward (the optimizer step, an unscale, an EMA update) is checked so too.

What the boundary cannot see is not checked per op: a tensor made inside a module that agreed, read from
elsewhere (a global, a cache object, another module's attribute) or passed by keyword. There torch's own kernel
check still raises, and the error is explained as in explain mode. ``guard(mode="strict")`` without a model, with a
device profile, in a running simulation, or with ``every_op=True`` keeps the mode on every op (``eligible``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from itertools import chain
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

ENABLED = True  # False: strict checks every op again (bench/guard.py times both in one process)
AFTER = True  # False: nothing after a backward is checked (bench/guard.py times the first stage's cost)
BY_CALL = True  # False: the code around the model runs under the dispatch mode, every op (bench/guard.py times both)
CHAINED = True  # False: the gate registers a global hook pair of its own, as before (bench/guard.py times both)

_T, _P = torch.Tensor, torch.nn.Parameter
_grad_enabled = torch.is_grad_enabled
_get_ident = threading.get_ident
_CONTAINERS = (list, tuple)


def eligible(session: Any) -> bool:
    """Does this session's strict run use the boundary check? Not without a model (a decorated function's ops are
    all it has), not with a device profile (its limits hold for single-tensor ops too), not in a simulation."""
    g = session.g
    return ENABLED and session.mode == "strict" and g.profile is None and g.model is not None \
        and not getattr(g, "every_op", False)


def odd(values: Any) -> bool:
    """Do the tensors among ``values`` disagree: two devices, two floating (or complex) dtypes, or a tensor
    subclass, whose meaning the rules decide? What is no tensor is skipped.

    >>> import torch
    >>> odd([torch.ones(2), torch.ones(2, dtype=torch.int64)]), odd([torch.ones(2), torch.ones(2).double()])
    (False, True)
    """
    return _odd(values, False)


# the floating and complex dtypes: a set look-up is cheaper than a dtype's ``is_floating_point`` per tensor
_FLOATING = frozenset(d for d in vars(torch).values()
                      if isinstance(d, torch.dtype) and (d.is_floating_point or d.is_complex))


def _odd(values: Any, nest: bool) -> bool:
    """``odd``, run per module call: ``nest`` also looks one level into the lists and tuples among ``values``
    (a module's ``*args``), without building a list of what it reads."""
    dev = fdt = None
    more: list[Any] | None = None
    while True:
        for t in values:
            tp = type(t)
            if tp is not _T and tp is not _P:
                if nest and (tp is list or tp is tuple):
                    if more is None:
                        more = []
                    more.append(t)
                elif isinstance(t, _T):
                    return True
                continue
            if dev is None:
                dev = t.device
            elif t.device != dev:
                return True
            dt = t.dtype
            if dt in _FLOATING:
                if fdt is None:
                    fdt = dt
                elif dt is not fdt:
                    return True
        if not more:
            return False
        values, more, nest = _flat(more), None, False


_flat = chain.from_iterable


def _attributes(mod: torch.nn.Module) -> tuple[str, ...]:
    """The names of a module's plain tensor attributes (and lists / tuples holding tensors), read once a session."""
    names = []
    for k, v in vars(mod).items():
        if isinstance(v, torch.Tensor) or (type(v) in _CONTAINERS and any(isinstance(x, torch.Tensor) for x in v)):
            names.append(k)
    return tuple(names)


def _disagree(mod: torch.nn.Module, args: tuple[Any, ...], names: tuple[str, ...]) -> bool:
    """Do a module's own tensors (parameters, buffers, the tensor attributes ``names``) and its positional inputs
    disagree (``odd``, lists and tuples among them looked into)?"""
    if names:
        return _odd(chain(mod._parameters.values(), mod._buffers.values(), map(mod.__dict__.get, names), args),
                    True)
    params, buffers = mod._parameters, mod._buffers
    if not params and not buffers:  # a container (a block, an MLP) or a parameterless layer: its inputs alone
        if len(args) == 1 and type(args[0]) is _T:  # most module calls: one plain tensor agrees with itself
            return False
        return _odd(args, True)
    if not buffers and len(args) == 1 and type(args[0]) is _T:  # a layer and its one input: no chain, no nesting
        x = args[0]
        dev = x.device
        fdt: torch.dtype | None = x.dtype if x.dtype in _FLOATING else None
        for t in params.values():
            tp = type(t)
            if t is None or (tp is not _P and tp is not _T):
                if isinstance(t, _T):  # a subclass: the rules decide what it means
                    return True
                continue
            if t.device != dev:
                return True
            dt = t.dtype
            if dt in _FLOATING:
                if fdt is None:
                    fdt = dt
                elif dt is not fdt:
                    return True
        return False
    return _odd(chain(params.values(), buffers.values(), args), True)


class Gate:
    """When the dispatch mode of one strict session is on: inside suspect modules (and the backward they feed);
    outside any module the first stage decides call by call (``by_call``; else the mode is on there too, except
    after a forward that autograd will differentiate)."""

    def __init__(self, enter: Callable[[], Any], leave: Callable[[], bool], stack: list[Any],
                 chain: list[Any] | None = None) -> None:
        self.enter, self.leave = enter, leave  # push / pop the dispatch mode itself (pop: False when not on top)
        self.stack = stack  # the session's module stack (its pre-hook runs before ours, its post-hook before ours)
        self.chain = chain  # the session's hooks call ours (pre, post, our suspects); else a global pair of our own
        self.active: list[torch.nn.Module] = []  # suspect modules running now, outermost first
        self.sticky = False  # a suspect module fed autograd: keep checking through its backward
        self.trained = False  # the last outermost forward fed autograd: what follows is its backward
        self.on = False
        self.handles: list[Any] = []
        self.suspects = 0  # module calls that turned the mode on (bench/guard.py reports it)
        self.after: Any = None  # the first stage around the model and after a backward (_guard/aftergrad.py)
        self.by_call = BY_CALL and AFTER  # the code around the model: the first stage, not the dispatch mode

    def start(self) -> None:
        pre, post = self._hooks()
        if self.chain is not None and CHAINED:
            self.chain[:] = [pre, post, self.active]
        else:
            self.handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
        if BY_CALL and AFTER:  # the code before the first forward: checked by the first stage
            self._after().arm(None, ready=True)
        self.sync()

    def stop(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        if self.chain is not None:
            self.chain[:] = [None, None, ()]
        if self.after is not None:
            self.after.stop()
        self.active.clear()
        self.sticky = self.trained = False
        if self.on and self.leave():
            self.on = False

    def sync(self) -> None:
        """Push or pop the mode to match the state (a pop waits while a mode entered later sits above ours)."""
        want = bool(self.active) or self.sticky or (not self.stack and not self.trained and not self.by_call)
        if want and not self.on:
            self.enter()
            self.on = True
        elif self.on and not want and self.leave():
            self.on = False

    def _hooks(self) -> tuple[Callable[..., None], Callable[..., None]]:
        tid, stack, active, sync = _get_ident(), self.stack, self.active, self.sync
        names: dict[int, tuple[torch.nn.Module, tuple[str, ...]]] = {}  # a module's tensor attributes
        roots: dict[int, tuple[torch.nn.Module, bool]] = {}  # an outermost module: does it hold compiled code?

        def pre(mod: torch.nn.Module, args: tuple[Any, ...]) -> None:
            if _get_ident() != tid:
                return
            whole = False
            if len(stack) <= 1 and (not stack or stack[0] is mod):  # the outermost module starts: the last run
                # and its backward are over (a no-grad forward keeps its outermost module alone on the stack)
                active.clear()
                if self.after is not None and self.after.pushed:
                    self.after.disarm()
                self.sticky = self.trained = False
                root = roots.get(id(mod))
                if root is None or root[0] is not mod:
                    root = roots[id(mod)] = (mod, _compiled_inside(mod))
                whole = root[1]
            hit = names.get(id(mod))
            if hit is None or hit[0] is not mod:
                hit = names[id(mod)] = (mod, _attributes(mod))
            if whole or _disagree(mod, args, hit[1]):
                active.append(mod)
                self.suspects += 1
            if self.on is not bool(active):
                sync()

        def post(mod: torch.nn.Module, args: tuple[Any, ...], out: Any) -> None:
            if (stack and not active) or _get_ident() != tid:
                return
            for i in range(len(active) - 1, -1, -1):
                if active[i] is mod:
                    del active[i:]
                    if _grad_enabled() and _feeds_autograd(out):
                        self.sticky = True
                    break
            if not stack:  # the outermost module returned
                self.trained = _grad_enabled() and _feeds_autograd(out)
                if self.trained and AFTER:  # what follows its backward (the optimizer step, an EMA update)
                    self._after().arm(out)
                elif self.by_call:  # the code around the model (a generate loop's sampling)
                    self._after().arm(None, ready=True)
            sync()

        return pre, post


    def _after(self) -> Any:
        if self.after is None:
            from torchdoctor._guard.aftergrad import AfterBackward

            self.after = AfterBackward(self.enter, self.leave, lambda: self.on, _odd)
        return self.after


def _compiled_inside(root: torch.nn.Module) -> bool:
    """Does a model hold compiled code (``torch.compile(module)``, ``module.compile()``)? Then strict checks its
    every op as before: under a dispatch mode dynamo runs the compiled parts eagerly, and never traces these hooks
    (tracing them mid-forward is what dynamo cannot do)."""
    return any(type(m).__name__ == "OptimizedModule" or getattr(m, "_compiled_call_impl", None) is not None
               for m in root.modules())


def _feeds_autograd(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return out.requires_grad
    values = dict.values(out) if isinstance(out, dict) else out if type(out) in _CONTAINERS else ()
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in values)

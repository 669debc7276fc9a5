"""``move(..., optimizer=opt)``: optimizer state follows its parameters, and rolls back with them.

``Module.to`` never touches an optimizer, so after ``model.double()`` Adam's ``exp_avg`` is still float32 and the next
``step()`` raises. The rule here is "state that sat with its parameter moves with it": a state tensor that was on
its parameter's device before the move goes to the parameter's new device, and one that had its parameter's dtype
gets the parameter's new dtype. State kept elsewhere on purpose stays: ``step`` counters on cpu, fp32 master state
of a bf16 parameter, and the keys an optimizer declares non-castable (bitsandbytes 8-bit optimizers' ``state1``,
``qmap1``, ``absmax1``: moved, never cast). Capturable / fused
optimizers keep ``step`` on the parameter's device in float32, as ``Optimizer.load_state_dict`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import nn

from torchdoctor._move.undo import Outcome, UndoLog, _Record, compact_of, exact_cast
from torchdoctor._placement import same_device

__all__ = ["OptimStep", "optimizers", "before", "rekey", "plan", "apply", "left_behind", "holding", "rows"]


def optimizers(arg: Any) -> list[Any]:
    """The optimizers passed as ``optimizer=``: one, or a list/tuple of them; anything else is a clear error."""
    if arg is None:
        return []
    items = list(arg) if isinstance(arg, (list, tuple)) else [arg]
    for i, o in enumerate(items):
        if not (isinstance(getattr(o, "state", None), dict) and isinstance(getattr(o, "param_groups", None), list)):
            where = f"optimizer[{i}]" if isinstance(arg, (list, tuple)) else "optimizer"
            raise TypeError(f"{where} must be a torch.optim.Optimizer (something with .state and .param_groups), "
                            f"not {type(o).__name__}: pass move(model, ..., optimizer=opt) or optimizer=[opt1, opt2]")
    return items


def _params(opt: Any) -> Iterator[tuple[int, int, Any]]:
    for gi, group in enumerate(opt.param_groups):
        for pi, p in enumerate(group.get("params", ())):
            yield gi, pi, p


def before(opts: list[Any]) -> dict[int, tuple[torch.device, torch.dtype]]:
    """Each parameter's device and dtype before the move (by id: a Parameter stays the same object)."""
    return {id(p): (p.device, p.dtype) for o in opts for _, _, p in _params(o) if isinstance(p, torch.Tensor)}


class _Rekey(_Record):
    """A Parameter the move replaced (cpu <-> meta: ``.data =`` cannot cross those tensor types) takes the old one's
    place in the optimizer: in its param group and as the key of its state."""

    def __init__(self, opt: Any, group: list[Any], j: int, old: Any, new: Any) -> None:
        self.opt, self.group, self.j, self.old, self.new = opt, group, j, old, new
        self.path = f"optimizer param {j}"

    def undo(self, out: Outcome) -> None:
        if self.group[self.j] is self.new:
            self.group[self.j] = self.old
        if self.new in self.opt.state:
            self.opt.state[self.old] = self.opt.state.pop(self.new)

    def check(self) -> list[tuple[str, str, str]]:
        return [] if self.group[self.j] is self.old else [(self.path, "the moved Parameter", "the original")]


def rekey(opts: list[Any], swapped: dict[int, Any], log: UndoLog,
          was: dict[int, tuple[torch.device, torch.dtype]]) -> None:
    """Point each optimizer at the Parameters the move put in place of the old ones."""
    for opt in opts:
        for group in opt.param_groups:
            params = group.get("params")
            if not isinstance(params, list):
                continue
            for j, p in enumerate(params):
                new = swapped.get(id(p)) if isinstance(p, torch.Tensor) else None
                if new is None or new is p:
                    continue
                log.add(_Rekey(opt, params, j, p, new))
                params[j] = new
                was[id(new)] = was.get(id(p), (p.device, p.dtype))
                if p in opt.state:
                    opt.state[new] = opt.state.pop(p)


class OptimStep(NamedTuple):
    holder: Any  # the dict (or list) holding the tensor
    key: Any
    tensor: torch.Tensor
    device: torch.device
    dtype: torch.dtype
    path: str


def _names(obj: Any) -> dict[int, str]:
    if isinstance(obj, nn.Module):
        try:
            return {id(p): n for n, p in obj.named_parameters(remove_duplicate=False)}
        except Exception:  # a module whose parameters cannot be listed still gets positional names
            return {}
    return {}


def _fused(group: dict[str, Any]) -> bool:
    return bool(group.get("fused") or group.get("capturable"))


def _leaves(holder: Any, prefix: str) -> Iterator[tuple[Any, Any, torch.Tensor, str]]:
    items = holder.items() if isinstance(holder, dict) else enumerate(holder) if isinstance(holder, list) else ()
    for k, v in items:
        path = f"{prefix}.{k}" if isinstance(k, str) and k.isidentifier() else f"{prefix}[{k!r}]"
        if isinstance(v, torch.Tensor):
            yield holder, k, v, path
        elif isinstance(v, (dict, list)):
            yield from _leaves(v, path)


def plan(obj: Any, opts: list[Any], was: dict[int, tuple[torch.device, torch.dtype]]) -> list[OptimStep]:
    """What each state tensor becomes now that its parameter has moved (nothing for state kept apart on purpose)."""
    if not opts:  # no optimizer: the model's parameter names (a walk of every module) are not needed
        return []
    names = _names(obj)
    steps: list[OptimStep] = []
    for oi, opt in enumerate(opts):
        head = "optimizer" if len(opts) == 1 else f"optimizer[{oi}]"
        for gi, pi, p in _params(opt):
            state = opt.state.get(p) if isinstance(p, torch.Tensor) else None
            if not state or id(p) not in was:
                continue
            old_dev, old_dt = was[id(p)]
            fixed = getattr(opt, "non_castable_tensor_keys", ())  # bitsandbytes 8-bit: moved, never cast
            name = names.get(id(p), f"param_groups[{gi}].params[{pi}]")
            for holder, key, t, path in _leaves(state, f"{head}.state[{name}]"):
                if key == "step" and holder is state:
                    if not _fused(opt.param_groups[gi]):
                        continue  # a plain optimizer's step counter lives on cpu whatever the parameter does
                    dev, dt = p.device, torch.float32
                else:
                    dev = p.device if same_device(t.device, old_dev) else t.device
                    same = t.dtype == old_dt and t.is_floating_point() and not (isinstance(key, str) and key in fixed)
                    dt = p.dtype if same else t.dtype
                if not (same_device(t.device, dev) and t.dtype == dt):
                    steps.append(OptimStep(holder, key, t, dev, dt, path))
    return steps


class _SetItem(_Record):
    """``holder[key] = new``: undone while the holder still holds ``new``."""

    def __init__(self, s: OptimStep, new: torch.Tensor, keep: bool) -> None:
        self.holder, self.key, self.new, self.path = s.holder, s.key, new, s.path
        self.old: torch.Tensor | None = s.tensor if keep else None
        self.was_dev, self.was_dt, self.was = s.tensor.device, s.tensor.dtype, compact_of(s.tensor)

    def undo(self, out: Outcome) -> None:
        if self.holder[self.key] is not self.new:
            return  # the change never landed
        if self.old is not None:
            self.holder[self.key] = self.old
            return
        self.holder[self.key] = self.new.to(self.was_dev, self.was_dt)
        if not exact_cast(self.was_dt, self.new.dtype):
            out.lossy.append((self.path, self.was))

    def check(self) -> list[tuple[str, str, str]]:
        now = self.holder[self.key]
        desc = compact_of(now) if isinstance(now, torch.Tensor) else repr(now)
        return [] if desc == self.was and now is not self.new else [(self.path, desc, self.was)]


def apply(steps: list[OptimStep], log: UndoLog, non_blocking: bool, cursor: list[str]
          ) -> Iterator[tuple[str, str, str, int]]:
    """Carry out the steps, each after its undo record; yields (path, before, after, nbytes) as each lands.
    ``cursor[0]`` names the step under way, so a failure names the tensor it failed at."""
    for s in steps:
        cursor[0] = s.path
        new = s.tensor.to(device=s.device, dtype=s.dtype, non_blocking=non_blocking)
        keep = log.keeps(not same_device(s.tensor.device, s.device))
        log.add(_SetItem(s, new, keep))
        s.holder[s.key] = new
        yield s.path, compact_of(s.tensor), compact_of(new), new.nelement() * new.element_size()


def left_behind(obj: Any, opts: list[Any], was: dict[int, tuple[torch.device, torch.dtype]]) -> list[str]:
    """State that should have followed its parameter and did not (a fresh plan must be empty)."""
    return [f"{s.path}  {compact_of(s.tensor)}, its parameter is {s.dtype} on {s.device}"
            for s in plan(obj, opts, was)]



def holding(opts: list[Any], moving: set[int]) -> list[int]:
    """How many of the tensors the move changes (``moving``: their ids) each optimizer holds, read before the move
    (a move to or from meta replaces Parameters)."""
    return [len({id(p) for _, _, p in _params(o)} & moving) for o in opts]


def rows(opts: list[Any], given: int, held: list[int], done: list[Any]) -> tuple[Any, ...]:
    """One ``HeldBy`` per optimizer: how many of the moved tensors it holds (``held``, from ``holding``) and how many
    of its state tensors followed them; the first ``given`` were passed as ``optimizer=``."""
    from torchdoctor._move.plan import HeldBy

    out = []
    for oi, opt in enumerate(opts):
        head = "optimizer" if len(opts) == 1 else f"optimizer[{oi}]"
        moved = sum(1 for m in done if m.path.startswith(head + ".state["))
        out.append(HeldBy(type(opt).__name__, head, held[oi], moved, oi >= given))
    return tuple(out)

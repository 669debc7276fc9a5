"""A silent dtype promotion in a virtual run: an operand of another floating dtype that promotes the model's compute
dtype (``bf16 * fp32 -> fp32``) is a problem by path, even when every tensor sits on the right device.

One policy with strict guard: the decision is guard's own (``_guard.promotion.findings``), asked through a view of
the run that answers as guard's session does (the running module, its root, and the root's ``Maps``). So the same
cases are flagged (a model tensor the placement policy finds off in dtype, wider than its module's compute dtype)
and the same are quiet: CPU 0-dim scalars, tensors made in forward (per-call casts), fp32 modules kept so by design
(``_keep_in_fp32_modules``), integer, bool and float8 operands, casts. Autocast regions are quiet too (``enabled=False``
ones included): there the dtype of each op is the region's choice.

Asked only for an op whose first two arguments are tensors of different dtypes (guard's cheap test): the happy
path never gets here.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES


def mixed(args: tuple[Any, ...]) -> bool:
    """Two leading tensor arguments of different dtypes: the only ops a promotion check looks at."""
    return len(args) > 1 and isinstance(args[0], torch.Tensor) and isinstance(args[1], torch.Tensor) and \
        args[0].dtype is not args[1].dtype


def _two_floats(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Two floating dtypes among the operands guard's finding weighs (not 0-dim, not float8): else it has none."""
    seen: set[torch.dtype] = set()
    for a in (*args, *kwargs.values()):
        for t in a if type(a) is list or type(a) is tuple else (a,):
            if isinstance(t, torch.Tensor) and t.dim() > 0 and t.is_floating_point() \
                    and t.dtype not in FLOAT8_DTYPES:
                seen.add(t.dtype)
    return len(seen) > 1


class Promotions:
    """Guard's promotion check over a virtual run's module stack; ``Maps`` of each root walked once, again after
    the program moves or casts the model's tensors (``moved``)."""

    def __init__(self, stack: Any) -> None:
        self.stack = stack  # the run's ``ModuleStack``
        self._maps: dict[int, Any] = {}

    def moved(self, t: Any) -> None:
        """The program moved or cast ``t`` outside any forward: when it is a model tensor, the model is walked again
        at the next check (a batch moved each step costs nothing)."""
        if self._maps and any(m is not None and id(_real(t)) in m.tensors for _, m in self._maps.values()):
            self._maps.clear()

    # -- what guard's ``findings`` asks of its session ------------------------------------------------------------
    def current(self) -> tuple[Any, Any]:
        stack = self.stack.stack
        return (stack[-1], stack[0]) if stack else (None, None)

    def maps_for(self, root: Any) -> Any:
        if root is None:
            return None
        hit = self._maps.get(id(root))
        if hit is None or hit[0] is not root:
            from torchdoctor._guard.maps import Maps

            try:
                hit = self._maps[id(root)] = (root, _Named(Maps(root)))
            except Exception:  # a strange model must not break the run it watches: no promotion check then
                hit = self._maps[id(root)] = (root, None)
        return hit[1]

    def findings(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """Guard's promotion finding of this op (wider operands as ``offenders``), or none."""
        if not mixed(args) or not _two_floats(args, kwargs) or self._autocast(args):
            return []  # (an index and a table, embedding's: no promotion, and no walk of the model to say so)
        from torchdoctor._guard.promotion import findings

        try:
            self._fresh(args)
            # an operand a dtype-less factory made in forward too: by the source line (guard's), or by the call's
            # own arguments where the line cannot tell (``torch.ones(n, dtype=self.dtype)`` with dtype None)
            return findings(self, func, args, kwargs, True) or self._default_made(func, args, kwargs)
        except Exception:  # the check is extra: the run goes on without it
            return []

    def _default_made(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        from torchdoctor._guard.promotion import wider
        from torchdoctor._placement import dtype_str
        from torchdoctor._report.model import Problem
        from torchdoctor._rules.registry import Finding, label

        fl = [(k, t) for k, t in _keyed(args, kwargs) if t.dim() > 0 and t.is_floating_point()
              and t.dtype not in FLOAT8_DTYPES]
        mod, root = self.current()
        maps = self.maps_for(root)
        if maps is None or mod is None or len({t.dtype for _, t in fl}) < 2:
            return []
        want, wide = maps.dtype_for(maps.modules.get(id(mod))), wider(t.dtype for _, t in fl)
        bad = [k for k, t in fl if t.dtype == wide and getattr(getattr(t, "_td_origin", None), "default", False)]
        if want is None or wide == want or want not in {t.dtype for _, t in fl} or not bad:
            return []
        msg = (f"{label(func, bad[0])} is {dtype_str(wide)} and promotes the model's {dtype_str(want)} to "
               f"{dtype_str(wide)} silently (no error, and the result and everything after it compute in "
               f"{dtype_str(wide)})")
        return [Finding(Problem("dtype", label(func, bad[0]), "argument", dtype_str(wide), dtype_str(want), msg,
                                op=str(func)), "dtype", want, tuple(bad), tuple(k for k, _ in fl))]


    def _fresh(self, args: tuple[Any, ...]) -> None:
        """A tensor the running module holds that the walk does not know (``model.scale = torch.ones(...)`` put
        there after the walk): the model is walked again."""
        mod, root = self.current()
        maps = self.maps_for(root)
        if maps is None or mod is None:
            return
        d = mod.__dict__
        held = (*d.values(), *d.get("_parameters", {}).values(), *d.get("_buffers", {}).values())
        for a in args[:2]:
            if maps.tensor_path(a) is None and any(v is a or v is _real(a) for v in held):
                self._maps.pop(id(root), None)
                return

    def path(self, t: Any) -> tuple[str, str] | None:
        """(path, role) of a model tensor, as the root's walk names it."""
        maps = self.maps_for(self.current()[1])
        hit = maps.tensor_path(t) if maps is not None else None
        if hit is None:
            return None
        return hit[0], maps.roles.get(hit[0], "attribute")

    @staticmethod
    def _autocast(args: tuple[Any, ...]) -> bool:
        # inside dispatch ``is_autocast_enabled`` reads False (autocast's keys are passed by then); the nesting
        # count of ``with torch.autocast(...)`` blocks is still there (raised and lowered back: no side effect)
        try:
            n = torch.autocast_increment_nesting()
            torch.autocast_decrement_nesting()
        except RuntimeError:
            return False
        return n > 1


class _Named:
    """guard's ``Maps`` of a root, where a virtual operand is also found by the path the run named it with, or as
    the real tensor it was lifted from (a twin is not the object the model holds)."""

    def __init__(self, maps: Any) -> None:
        self.maps = maps
        self.roles = {e.path: e.role for e in maps.walk.entries}
        self.shapes = {e.path: tuple(e.tensor.shape) for e in maps.walk.entries}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.maps, name)

    def tensor_path(self, t: Any) -> tuple[str, str] | None:
        hit = self.maps.tensor_path(_real(t))
        if hit is not None and hit[1] == " (same memory)" and getattr(t, "_td_device", None) is not None:
            hit = None  # a virtual tensor's data pointer says nothing (meta data: every one is 0)
        path = getattr(t, "_td_path", None)
        # by name only when it is that tensor (an activation can carry the name of the table it was looked up in)
        if hit is None and isinstance(path, str) and path in self.roles and self.shapes.get(path) == tuple(t.shape):
            return path, ""
        return hit  # type: ignore[no-any-return]


def _real(v: Any) -> Any:
    """The real tensor a virtual operand was lifted from (``_td_real``), else the value itself."""
    real = getattr(v, "_td_real", None) if isinstance(v, torch.Tensor) else None
    return real if real is not None else v


def _keyed(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[Any, torch.Tensor]]:
    """The tensor operands with the rules' keys: ``(position or kwarg name, index in a list or -1)``."""
    out: list[tuple[Any, torch.Tensor]] = []
    for pos, a in (*enumerate(args), *kwargs.items()):
        if isinstance(a, torch.Tensor):
            out.append(((pos, -1), a))
        elif type(a) is list or type(a) is tuple:
            out.extend(((pos, j), t) for j, t in enumerate(a) if isinstance(t, torch.Tensor))
    return out

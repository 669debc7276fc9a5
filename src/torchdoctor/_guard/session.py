"""Machinery behind ``guard``: global module hooks, a per-thread module stack, backward tracking and the
dispatch mode of ``strict`` / ``fix`` / ``warn``.

Hooks are global and removed by handle; ``module.forward`` is never rewritten. Backward tracking
uses tensor grad hooks on module inputs and outputs, as ``torch.utils.module_tracker`` does with
``register_multi_grad_hook``: global full backward hooks would break in-place ops on module outputs
(``register_module_full_backward_hook``: "Output 0 of BackwardHookFunction is a view and is being modified
inplace"). Nothing here runs per op in ``explain`` mode.
"""

from __future__ import annotations

import logging
from sys import modules as _modules
import threading
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from torchdoctor._rules import registry as _rules
from torchdoctor._report.model import PlacementError, PlacementWarning, Problem
from torchdoctor._placement import device_str, dtype_str
from torchdoctor._report.text import format_error

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._guard.api import guard

log = logging.getLogger("torchdoctor.guard")
_Tensor = torch.Tensor
_get_ident = threading.get_ident  # module globals: the hooks run on every module call
_grad_enabled = torch.is_grad_enabled


def _simulating() -> bool:
    """A ``simulate`` / ``virtual_devices`` run is active in this thread (it checks its own ops)."""
    sim = _modules.get("torchdoctor._virtual.tensor")
    return sim is not None and sim.current_space() is not None


class Maps:
    """Paths of one root's modules and tensors (walked once, only after something went wrong or needs a name)."""

    def __init__(self, root: Any) -> None:
        from torchdoctor._walk import walk

        w = walk(root)
        self.walk = w
        self._policy_problems: list[Problem] | None = None
        self.modules = {id(m): p for p, m in w.modules}
        self.dicts = frozenset(p for p, m in w.modules if isinstance(m, nn.ModuleDict))
        self.tensors: dict[int, str] = {}
        self.starts: dict[tuple[str, int], str] = {}
        self.keep = [e.tensor for e in w.entries]  # ids stay unique while the map lives
        dtype_bytes: dict[torch.dtype, int] = {}
        device_bytes: dict[torch.device, int] = {}
        for e in w.entries:
            t = e.tensor
            self.tensors.setdefault(id(t), e.path)
            if e.alias_of is not None or e.role not in ("parameter", "buffer"):
                continue
            try:
                if t.device.type != "meta":
                    self.starts.setdefault((str(t.device), t.data_ptr()), e.path)
                if t.is_floating_point():
                    n = t.nelement() * t.element_size()
                    dtype_bytes[t.dtype] = dtype_bytes.get(t.dtype, 0) + n
                    d = _rules._norm(_rules.tensor_device(t))
                    device_bytes[d] = device_bytes.get(d, 0) + n
            except Exception:  # odd subclasses: skip, a diagnostic must not break
                continue
        self.dtype = max(dtype_bytes, key=dtype_bytes.__getitem__) if dtype_bytes else None
        self.device = max(device_bytes, key=device_bytes.__getitem__) if device_bytes else None
        from torchdoctor._scan.policy import Expectations

        self.expect = Expectations(w)

    def policy_problems(self) -> list[Problem]:
        """The model's off-policy tensors (what scan reports), computed at the first failure that asks."""
        if self._policy_problems is None:
            from torchdoctor._guard.provenance import policy_problems

            self._policy_problems = policy_problems(self.walk)
        return self._policy_problems

    def dtype_for(self, module_path: str | None) -> torch.dtype | None:
        """The dtype a module's ops should agree on, as scan sees it (its component, its peft adapter ...)."""
        return (self.expect.dtype(module_path) if module_path is not None else None) or self.dtype

    def tensor_path(self, t: torch.Tensor) -> tuple[str, str] | None:
        """(path, how) of a model tensor, its view, or a tensor starting at its memory."""
        p = self.tensors.get(id(t))
        if p is not None:
            return p, ""
        try:
            base = t._base
            if base is not None and id(base) in self.tensors:
                return self.tensors[id(base)], " (a view)"
            if t.device.type != "meta":
                p = self.starts.get((str(t.device), t.data_ptr()))
                if p is not None:
                    return p, " (same memory)"
        except Exception:
            pass
        return None


def module_label(path: str | None, mod: Any) -> str:
    return f"`{path or '<root>'}`" if path is not None else f"`<{type(mod).__name__} outside the guarded model>`"


def code_path(path: str, var: str = "model", dicts: Collection[str] = ()) -> str:
    """``layers.0.mlp.weight`` -> ``model.layers[0].mlp.weight`` (Python you can paste); under the ``nn.ModuleDict``
    paths in ``dicts`` a digit key stays a string (``model.heads['0']``)."""
    out, prefix = var, None
    for part in path.split(".") if path else []:
        if part.isdigit() and prefix not in dicts:
            out += f"[{part}]"
        else:
            out += f".{part}" if part.isidentifier() else f"[{part!r}]"
        prefix = part if prefix is None else f"{prefix}.{part}"
    return out


def value_code(v: Any) -> str:
    """``torch.bfloat16``, ``'cuda:0'``, or both for a (device, dtype) pair."""
    if isinstance(v, tuple):
        return ", ".join(value_code(x) for x in v)
    if isinstance(v, torch.dtype):
        return f"torch.{dtype_str(v)}"
    return repr(device_str(v))


def fix_code(culprits: Sequence[tuple[str | None, str, str, Any]], dicts: Collection[str] = ()) -> str | None:
    """Culprits as (model path or None, label, kind, target) -> code to paste (``dicts``: see ``code_path``)."""
    lines: list[str] = []
    params = [c for c in culprits if c[0] is not None]
    if len(params) > 4:
        targets = sorted(dict.fromkeys(t for c in params if c[3] is not None
                                       for t in (c[3] if isinstance(c[3], tuple) else (c[3],))),
                         key=lambda t: isinstance(t, torch.dtype))  # device=..., then dtype=...
        kw = ", ".join(f"{'dtype' if isinstance(t, torch.dtype) else 'device'}={value_code(t)}" for t in targets)
        lines.append(f"torchdoctor.move(model, {kw})")
    else:
        for path, _label, kind, target in params:
            expr = code_path(path or "", dicts=dicts)
            if kind == "meta":
                lines.append(f"# {expr} is on meta (no data): load its weights, e.g.")
                lines.append("model.load_state_dict(state_dict, strict=False, assign=True)")
            elif target is not None:
                lines.append(f"{expr}.data = {expr}.data.to({value_code(target)})")
    for path, label, kind, target in culprits:
        if path is None and target is not None and kind != "meta":
            lines.append(f"# pass {label} as tensor.to({value_code(target)})")
    return "\n".join(dict.fromkeys(lines)) or None


def _tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, _Tensor):
        return [value]
    if type(value) in (list, tuple):
        return [v for v in value if isinstance(v, _Tensor)]
    if isinstance(value, dict):  # ModelOutput and plain dicts, one level
        return [v for v in dict.values(value) if isinstance(v, _Tensor)]
    return []


def _alive(handle: Any) -> bool:
    """Does a tensor-hook handle still point at a live tensor or graph node? (it holds its dict weakly)"""
    try:
        return handle.hooks_dict_ref() is not None
    except Exception:
        return True


class Session:
    """One ``with guard(...)`` in one thread: the module stack, hooks, the dispatch mode and lazy path maps."""

    def __init__(self, g: guard) -> None:
        self.g = g
        self.mode = g.mode
        self.tid = threading.get_ident()
        self.stack: list[tuple[nn.Module, tuple[Any, ...]]] = []
        self.ran: list[nn.Module] = []  # modules started in this forward, in order (provenance at a failure)
        self.bw: list[nn.Module] = []  # modules whose backward is running (autograd may use other threads)
        self.handles: list[Any] = []
        self.grad_handles: list[Any] = []
        self.dispatch: CheckMode | None = None
        self.conv_modes: list[tuple[nn.Module, ConvCheck]] = []
        self.maps: dict[int, Maps] = {}

    # -- lifetime -------------------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            self.handles.append(register_module_forward_pre_hook(self._pre_explain if self.mode == "explain"
                                                                 else self._pre))
            self.handles.append(register_module_forward_hook(self._post))
            if self.mode != "explain":
                if torch.compiler.is_compiling():
                    self.g._warn_compiled()
                self.dispatch = CheckMode(self)
                self.dispatch.__enter__()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        mode, self.dispatch = self.dispatch, None
        try:
            while self.conv_modes:  # left by a conv forward that raised
                self.conv_modes.pop()[1].__exit__(None, None, None)
            if mode is not None:
                mode.__exit__(None, None, None)
        finally:
            for h in (*self.handles, *self.grad_handles):
                try:
                    h.remove()
                except Exception:  # pragma: no cover - removal never fails in practice
                    log.debug("hook removal failed", exc_info=True)
            self.handles.clear()
            self.grad_handles.clear()

    # -- module stack ---------------------------------------------------------------------------------------
    def _new_forward(self) -> None:
        """The outermost module starts: the last backward is over; forget hooks of freed graphs."""
        self.bw.clear()
        self.ran.clear()
        if len(self.grad_handles) > 1024:
            self.grad_handles = [h for h in self.grad_handles if _alive(h)]

    def _pre_explain(self, mod: nn.Module, args: tuple[Any, ...]) -> None:
        """``_pre`` without the strict / fix / warn work: the only per-call cost of ``explain``."""
        if _get_ident() != self.tid:
            return
        stack = self.stack
        if not stack:
            self._new_forward()
        stack.append((mod, args))
        self.ran.append(mod)
        if _grad_enabled():
            self._track([t for a in args for t in _tensors_of(a)], self._bw_leave, mod)

    def _pre(self, mod: nn.Module, args: tuple[Any, ...]) -> None:
        """``_pre_explain`` plus the strict / fix / warn work around it."""
        if _get_ident() != self.tid:
            return
        if self.mode != "explain" and type(mod).__name__ == "OptimizedModule":
            self.g._warn_compiled()
        self._pre_explain(mod, args)
        if self.mode != "explain" and isinstance(mod, _ConvNd) and args and not _simulating():
            self._conv_pre(mod, args[0])

    def _post(self, mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        if _get_ident() != self.tid:
            return
        stack = self.stack
        if self.conv_modes and self.conv_modes[-1][0] is mod:
            self.conv_modes.pop()[1].__exit__(None, None, None)
        if stack and stack[-1][0] is mod:
            stack.pop()
        else:  # an exception was caught inside a forward: drop the stale entries above this module
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] is mod:
                    del stack[i:]
                    break
        if _grad_enabled():
            self._track(_tensors_of(out), self._bw_enter, mod)

    def _track(self, tensors: list[torch.Tensor], fn: Any, mod: nn.Module) -> None:
        """Backward tracking: ``fn(mod)`` when the first grad of ``tensors`` arrives in a backward. Plain tensor
        hooks whose closure holds no tensor or graph node: ``register_multi_grad_hook`` keeps the graph nodes in
        its closure, which keeps every tracked graph (and its inputs) alive until the hooks are removed."""
        ts = [t for t in tensors if t.requires_grad]
        if not ts:
            return
        seen: list[int] = [-2]  # the last graph task that fired

        def hook(grad: torch.Tensor) -> None:
            task = torch._C._current_graph_task_id()
            if seen[0] != task:
                seen[0] = task
                fn(mod)

        for t in ts:
            try:
                self.grad_handles.append(t.register_hook(hook))
            except Exception:  # tracking must never break the forward it watches
                log.debug("backward tracking skipped for %s", type(mod).__name__, exc_info=True)

    def _conv_pre(self, mod: nn.Module, x: Any) -> None:
        """``conv2d`` checks the bias dtype before any aten op is dispatched, so the dispatch mode never sees
        it: look here, and for fix / warn align it one level up, in a function mode scoped to this forward."""
        bias = mod.bias
        if not isinstance(x, _Tensor) or not isinstance(bias, _Tensor) or bias.dtype == x.dtype:
            return
        if self.mode == "strict":
            found = _rules.find(_CONV, (x, mod.weight, bias), {}, self.g.profile)
            if found:
                self.on_problem(_CONV, (x, mod.weight, bias), {}, found)
            return
        check = ConvCheck(self)
        check.__enter__()
        self.conv_modes.append((mod, check))

    def _bw_enter(self, mod: nn.Module) -> None:
        self.bw.append(mod)

    def _bw_leave(self, mod: nn.Module) -> None:
        for i in range(len(self.bw) - 1, -1, -1):
            if self.bw[i] is mod:
                del self.bw[i]
                break

    def current(self) -> tuple[nn.Module | None, Any]:
        """(innermost module, root) right now; in backward the module whose backward is running."""
        root = self.g.model
        if root is None and self.stack:
            root = self.stack[0][0]
        if torch._C._current_graph_task_id() != -1 and self.bw:
            return self.bw[-1], root if root is not None else self.bw[0]
        if self.stack:
            return self.stack[-1][0], root
        return None, root

    def maps_for(self, root: Any) -> Maps | None:
        if root is None:
            return None
        m = self.maps.get(id(root))
        if m is None:
            try:
                m = self.maps[id(root)] = Maps(root)
            except Exception:  # a diagnostic that cannot walk still names what it can
                log.debug("walk failed", exc_info=True)
                return None
        return m

    def _blame(self, maps: Maps | None, kind: str, bad: set[str], mpath: str | None, own: set[Any]) -> list[Any]:
        """The model's off-policy tensors that may have caused a ``kind`` problem at the current op, best first."""
        if maps is None:
            return []
        try:
            from torchdoctor._guard.provenance import ran_paths, suspects

            found = suspects(maps.policy_problems(), kind, bad, ran_paths(maps.modules, self.ran), mpath)
            return [s for s in found if s.problem.path not in own][:4]
        except Exception:  # provenance is extra: the problem is still reported without it
            log.debug("provenance failed", exc_info=True)
            return []

    # -- strict / fix / warn --------------------------------------------------------------------------------
    def on_problem(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
                   findings: list[_rules.Finding], schema_op: Any = None) -> Any:
        """Strict: raise. Fix / warn: record, warn once, align the offending arguments and run ``func``."""
        op = schema_op or func
        mod, root = self.current()
        maps = self.maps_for(root)
        mpath = maps.modules.get(id(mod)) if maps is not None and mod is not None else None
        mtype = type(mod).__name__ if mod is not None else None
        tensors = dict(_rules._gather(args, kwargs))
        fixable = all(f.target is not None for f in findings)
        problems: list[Problem] = []
        culprits: list[tuple[str | None, str, str, Any]] = []
        lines: list[str] = []
        plan: list[tuple[_rules.Finding, Any, list[_rules.Key]]] = []
        for f in findings:
            target, offenders = f.target, list(f.offenders)
            if f.target is not None and maps is not None:  # strict too: blame the fp32 input, not the bf16 model
                target, offenders = _retarget(f, tensors, maps, mpath)
            plan.append((f, target, offenders))
            for k in offenders:
                t = tensors[k]
                label = _rules.label(op, k)
                hit = maps.tensor_path(t) if maps is not None else None
                path = hit[0] if hit else None
                shown = f"{path}{hit[1]} = {label}" if hit else label
                found = _value_str(t, f.attr) if f.attr else f.problem.found
                expected = _value_str_of(target) if target is not None else f.problem.expected
                problems.append(replace(f.problem, path=path or label, role="parameter" if path else "argument",
                                        found=found, expected=expected, module_path=mpath, module_type=mtype))
                culprits.append((path, label, f.problem.kind, target))
                lines.append(f"{shown}: {_rules._compact(t)}  (expected {expected})")
        self.g._record_problems(problems)
        first = problems[0] if problems else findings[0].problem
        if self.mode == "strict" or (self.mode == "fix" and not fixable):
            where = module_label(mpath, mod) + (f" ({mtype})" if mtype else "") if mod is not None else "no module"
            f0, t0, ks0 = plan[0]
            detail = findings[0].problem.message.split(": ", 1)[-1]
            if ks0 and (t0 != f0.target or ks0 != list(f0.offenders)):  # aligned on the model, not on an operand
                detail = (f"{', '.join(_rules.label(op, k) for k in ks0)} {'is' if len(ks0) == 1 else 'are'} "
                          f"{_value_str(tensors[ks0[0]], f0.attr)}, expected {_value_str_of(t0)} like the model")
            head = f"{first.kind} problem in {where} at {op}: {detail}"
            blamed = self._blame(maps, first.kind, {p.found for p in problems}, mpath, {c[0] for c in culprits})
            if blamed and blamed[0].matches:
                from torchdoctor._guard.provenance import headline, target_of

                head = headline(blamed[0], first.kind, where, f"at {op}: {detail}")
                lines = [f"culprit {b.line()}" for b in blamed] + lines
                culprits = [(b.problem.path, b.problem.path, b.problem.kind, target_of(b.problem))
                            for b in blamed] + [c for c in culprits if c[0] is not None]
                problems = [replace(b.problem, op=str(op)) for b in blamed] + problems
            others = [d for d in findings[0].problem.tensors if not any(d.startswith(_rules.label(op, k) + ":")
                                                                        for f, _, ks in plan for k in ks)]
            fix = fix_code(culprits, maps.dicts if maps is not None else ())
            raise PlacementError(format_error(head, lines + [f"other operand {d}" for d in others], fix),
                                 module_path=mpath, module_type=mtype, op=str(op),
                                 tensors=tuple(findings[0].problem.tensors), problems=problems, fix=fix)
        if self.mode == "warn":
            for p in problems:
                if self.g._first_time((p.module_path, p.op, p.kind)):
                    where = module_label(p.module_path, mod)
                    warnings.warn(f"torchdoctor.guard: {p.kind} problem in {where} at {p.op}: {p.path} is "
                                  f"{p.found}, expected {p.expected}" + ("; aligned for this call" if fixable else ""),
                                  PlacementWarning, stacklevel=2)
        if not fixable:
            return func(*args, **kwargs)
        new_args, new_kwargs = list(args), dict(kwargs)
        for f, target, offenders in plan:
            for k in offenders:
                t = tensors[k].to(target)
                tensors[k] = t
                _put(new_args, new_kwargs, k, t)
        self.g._record_fixes(problems)
        return func(*new_args, **new_kwargs)


def _retarget(f: _rules.Finding, tensors: Mapping[Any, torch.Tensor], maps: Maps, mpath: str | None
              ) -> tuple[Any, list[Any]]:
    """Align to the model's majority (its adapter's dtype inside a peft adapter) when it is among the values at
    hand (a wrong input is cast, not the model)."""
    keys = list(f.considered or f.offenders)
    want: Any
    if f.attr == "dtype":
        want, value = maps.dtype_for(mpath), (lambda t: t.dtype)
    else:
        want, value = maps.device, (lambda t: _rules._norm(_rules.tensor_device(t)))
    target = want if want is not None and any(value(tensors[k]) == want for k in keys) else f.target
    if target == f.target:
        return target, list(f.offenders)
    return target, [k for k in keys if value(tensors[k]) != target]


def _value_str(t: torch.Tensor, attr: str) -> str:
    return dtype_str(t.dtype) if attr == "dtype" else device_str(_rules.tensor_device(t))


def _value_str_of(v: Any) -> str:
    return dtype_str(v) if isinstance(v, torch.dtype) else device_str(v)


def _put(args: list[Any], kwargs: dict[str, Any], key: Any, t: torch.Tensor) -> None:
    pos, j = key
    holder: Any = kwargs if isinstance(pos, str) else args
    if j < 0:
        holder[pos] = t
    else:
        seq = list(holder[pos])
        seq[j] = t
        holder[pos] = type(holder[pos])(seq) if isinstance(holder[pos], tuple) else seq


_CONV = torch.ops.aten.convolution.default
_CONV_FUNCS = frozenset({torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_transpose1d, torch.conv_transpose2d,
                         torch.conv_transpose3d})


class ConvCheck(TorchFunctionMode):
    """Active only during the forward of a conv module whose bias disagrees with its input (see ``_conv_pre``)."""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _CONV_FUNCS and len(args) >= 2:
            args = (*args[:2], kwargs.get("bias") if len(args) < 3 else args[2], *args[3:])
            kwargs = {k: v for k, v in kwargs.items() if k != "bias"}
            found = _rules.find(_CONV, args[:3], {}, self.session.g.profile)
            if found:
                return self.session.on_problem(func, args, kwargs, found, schema_op=_CONV)
        return func(*args, **kwargs)


class CheckMode(TorchDispatchMode):
    """Checks every op against the strict rules before it runs; problems go to the session."""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.profile = session.g.profile

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if _simulating():  # a simulation checks its own ops with the same rules
            return func(*args, **kwargs)
        found = _rules.find(func, args, kwargs, self.profile)
        if found:
            return self.session.on_problem(func, args, kwargs, found)
        return func(*args, **kwargs)

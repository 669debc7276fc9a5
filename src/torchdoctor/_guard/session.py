"""Machinery behind ``guard``: global module hooks, a per-thread module stack, backward tracking and the
dispatch mode of ``strict`` / ``fix`` / ``warn``.

Hooks are global and removed by handle; ``module.forward`` is never rewritten. Backward tracking uses tensor grad
hooks on module inputs and outputs, as ``torch.utils.module_tracker`` does with ``register_multi_grad_hook``: global
full backward hooks break in-place ops on module outputs ("Output 0 of BackwardHookFunction is a view and is being
modified inplace"). Nothing here runs per op in ``explain`` mode (nor, under no_grad, on a module's return).
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.nn.modules.module import _global_forward_hooks_with_kwargs as _with_kwargs

from torchdoctor._guard import lean, savedhooks
from torchdoctor._guard.outcome import Outcome
from torchdoctor._guard.record import said
from torchdoctor._report.text import user_stacklevel
from torchdoctor._tracker import ModuleStack

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._guard.dispatch import CheckMode, CompositeCheck
    from torchdoctor._guard.maps import Maps
    from torchdoctor._rules.registry import Finding

# explain mode loads nothing more unless something fails: the dispatch modes and the rules with strict / fix / warn,
# the path maps, the culprit and the maker with the first problem (``_guard/notes.py``) (issue 43 point 4)

guard = Any  # the public guard (torchdoctor._guard.api) that starts a session; it imports this module

log = logging.getLogger("torchdoctor.guard")
_Tensor = torch.Tensor
_get_ident = threading.get_ident  # module globals: the hooks run on every module call
_grad_enabled = torch.is_grad_enabled


def _tensors_of(value: Any) -> list[torch.Tensor]:
    if isinstance(value, _Tensor):
        return [value]
    if type(value) in (list, tuple):
        return [v for v in value if isinstance(v, _Tensor)]
    if isinstance(value, dict):  # ModelOutput and plain dicts, one level
        return [v for v in dict.values(value) if isinstance(v, _Tensor)]
    return []


def _module_kind(tp: type, strict: bool) -> int:
    """What strict / fix / warn do when a module of this type starts: 1 warn (a compiled module: its ops are not
    checked), 2 check a convolution's bias (strict; fix and warn align it in ``CompositeCheck``), 0 nothing."""
    return 1 if tp.__name__ == "OptimizedModule" else 2 if strict and issubclass(tp, _ConvNd) else 0


def _gate(session: Any) -> bool:
    from torchdoctor._guard.fastpath import eligible

    return eligible(session)


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
        self.frames = ModuleStack()  # this thread's modules, their inputs, what ran, whose backward runs
        self.handles: list[Any] = []
        self.grad_handles: list[Any] = []
        self.dispatch: CheckMode | None = None
        self.composite: CompositeCheck | None = None
        self.maps: dict[int, Maps] = {}
        self.kwarg_hook: int | None = None  # the id of the post hook registered with kwargs
        self.replaying = False  # a whole-forward proof runs: module-entry checks stay quiet (_guard/component.py)
        # strict's module-boundary gate (_guard/fastpath.py) runs in these hooks, not in a global pair of its own
        # (each global hook costs torch's hook loop again per module call): its pre, its post, its suspects
        self.chain: list[Any] = [None, None, ()]
        self.lean: lean.Lean | None = None  # explain's no-grad forwards: no global post hook
        self.outcome: Outcome | None = None  # the output check when the outermost module (or the model) returns
        self.outcome_model: nn.Module | None = None  # (None: any outermost module)
        self.checks: Callable[[nn.Module, tuple[Any, ...]], None] | None = None  # strict's per-module checks
        self.gated = False  # strict at the module boundary (_guard/fastpath.py): decided once, at start

    # -- lifetime -------------------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            self.gated = self.mode == "strict" and _gate(self)
            pre, post = self._hooks()
            self.handles.append(register_module_forward_hook(post, with_kwargs=True))
            self.kwarg_hook = self.handles[-1].id  # its handle forgets the with-kwargs mark: removed in stop()
            if lean.eligible(self):  # no-grad forwards run with no global post hook (_guard/lean.py)
                self.lean = lean.Lean(self, pre, post, self.kwarg_hook)
                pre = self.lean.hook()
            self.handles.insert(0, register_module_forward_pre_hook(pre))
            if self.lean is not None:  # (it leaves torch's dict while a no-grad forward of agreeing tensors runs)
                self.lean.pre_id, self.lean.pre_fn = self.handles[0].id, pre
            savedhooks.install(self)  # what saved-tensor unpack hooks give back is checked (_guard/savedhooks.py)
            if self.mode != "explain":
                from torchdoctor._guard.dispatch import CheckMode, CompositeCheck

                if torch.compiler.is_compiling():
                    self.g._warn_compiled()
                self.dispatch = CheckMode(self)
                self.dispatch.__enter__()
                if self.mode != "strict":
                    self.composite = CompositeCheck(self)
                    self.composite.__enter__()
                else:  # attention's own C++ check comes before any op: looked at per attention call
                    from torchdoctor._guard.attncheck import install

                    install(self)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        mode, self.dispatch = self.dispatch, None
        composite, self.composite = self.composite, None
        savedhooks.uninstall(self)
        if self.mode == "strict" and (attn := sys.modules.get("torchdoctor._guard.attncheck")) is not None:
            attn.uninstall(self)
        if self.lean is not None:
            self.lean.stop()
        try:
            if composite is not None:
                composite.__exit__(None, None, None)
            if mode is not None:
                mode.__exit__(None, None, None)
        finally:
            for h in (*self.handles, *self.grad_handles):
                h.remove()
            self.handles.clear()
            self.grad_handles.clear()
            if self.kwarg_hook is not None:
                _with_kwargs.pop(self.kwarg_hook, None)
                self.kwarg_hook = None

    # -- module stack ---------------------------------------------------------------------------------------
    def _new_forward(self) -> None:
        """The outermost module started (the stack forgot the last backward): forget hooks of freed graphs."""
        if len(self.grad_handles) > 1024:
            self.grad_handles = [h for h in self.grad_handles if _alive(h)]

    def _hooks(self) -> tuple[Callable[..., None], Callable[..., None]]:
        """The global forward pre and post hooks. They run on every module call in every thread (in ``explain``
        mode the only per-call cost): closures over this session's lists, so a call does the thread check, the
        stack push or pop and the grad check, and looks nothing else up. ``strict`` / ``fix`` / ``warn`` add a
        per-module-type lookup: compiled modules warn, convolutions check their bias."""
        tid, frames, strict = self.tid, self.frames, self.mode == "strict"
        stack, inputs, ran, push, pop = frames.stack, frames.inputs, frames.ran, frames.push, frames.pop
        kinds: dict[type, int] | None = None if self.mode == "explain" else {}
        get_ident, grad_enabled, track = _get_ident, _grad_enabled, self._track
        bw_enter, bw_leave, chain = frames.enter_backward, frames.leave_backward, self.chain
        # explain, and strict at the module boundary, check no op where a forward's own tensors agree: the output
        outcome = Outcome(self) if self.mode == "explain" or self.gated else None
        simulating: Callable[[], bool] | None = None
        if strict:  # a simulation checks its own ops: a convolution's bias is not checked twice
            from torchdoctor._guard.dispatch import _simulating as simulating
        model = self.g.model if isinstance(self.g.model, nn.Module) else None  # (a pipeline's paths: not its parts')
        outcome = None if self.g.model is not None and model is None else outcome
        self.outcome, self.outcome_model = outcome, model

        def checks(mod: nn.Module, args: tuple[Any, ...]) -> None:  # strict / fix / warn, once a module is on
            kind = kinds.get(type(mod), -1)  # type: ignore[union-attr]
            if kind < 0:
                kind = kinds[type(mod)] = _module_kind(type(mod), strict)  # type: ignore[index]
            if kind == 1:
                self.g._warn_compiled()
            if kind == 2 and args and simulating is not None and not simulating():
                self._conv_pre(mod, args[0])
            if chain[0] is not None:
                chain[0](mod, args)

        self.checks = checks if kinds is not None else None

        def pre(mod: nn.Module, args: tuple[Any, ...]) -> None:
            if get_ident() != tid:
                return
            if stack:
                stack.append(mod)
                inputs.append(args)
                ran.append(mod)
            elif push(mod, args):
                self._new_forward()
            if grad_enabled():
                track([t for a in args for t in _tensors_of(a)], bw_leave, mod)
            if kinds is not None:
                checks(mod, args)

        def post(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            if get_ident() != tid:
                return
            if stack and stack[-1] is mod:
                stack.pop()
                inputs.pop()
            else:
                pop(mod)
            if grad_enabled():
                track(_tensors_of(out), bw_enter, mod)
            if outcome is not None and not stack and (model is None or mod is model):
                outcome.check(mod, args, kwargs, out)  # the model returned: did its dtype widen silently?
            if chain[1] is not None and (not stack or chain[2]):  # the gate's post: a suspect or the outermost
                chain[1](mod, args, out)

        return pre, post

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
        from torchdoctor._guard.convcheck import conv_pre

        conv_pre(self, mod, x)

    def current(self) -> tuple[nn.Module | None, Any]:
        """(innermost module, root) right now; in backward the module whose backward is running."""
        if self.lean is not None and self.lean.depth:  # a no-grad forward: the running modules from the live frames
            self.lean.fill_live()
        return self.frames.current(self.g.model)

    def maps_for(self, root: Any) -> Maps | None:
        if root is None:
            return None
        m = self.maps.get(id(root))
        if m is None:
            from torchdoctor._guard.maps import Maps

            try:
                m = self.maps[id(root)] = Maps(root)
            except Exception:  # a diagnostic that cannot walk still names what it can
                log.debug("walk failed", exc_info=True)
                return None
        return m

    def _blame(self, maps: Maps | None, kind: str, bad: set[str], mpath: str | None, own: set[Any],
               inputs: list[torch.Tensor], compiled: bool = False) -> list[Any]:
        """The model's off-policy tensors that may have caused a ``kind`` problem at the current op, best first;
        the data flow (the running forwards' code, the modules that ran, autograd's record behind ``inputs``) says
        which reached it."""
        if maps is None:
            return []
        try:
            from torchdoctor._guard import compiled as graph, provenance as pv

            fl = graph.reads_everything(maps) if compiled else pv.flow(maps.walk, self.frames.ran,
                                                                        pv.running_frames(), inputs, mpath)
            tensors = {e.path: e.tensor for e in maps.walk.entries} if fl.leaves else None
            found = pv.suspects(maps.policy_problems(), kind, bad, pv.ran_paths(maps.modules, self.frames.ran),
                                mpath, fl, tensors)
            found = [s for s in found if s.problem.path not in own]
            return [s for s in found if s.culprit][:4] + [s for s in found if not s.culprit][:3]
        except Exception:  # provenance is extra: the problem is still reported without it
            log.debug("provenance failed", exc_info=True)
            return []

    def _gated(self) -> bool:
        """strict checks ops only inside modules whose tensors disagree (``_guard/fastpath.py``)."""
        return self.dispatch is not None and self.dispatch.gate is not None

    def _forward_note(self, mpath: str | None, op: Any) -> Any:
        """fix / warn: the note told of the forward op whose backward this is (``huber_loss`` for
        ``huber_loss_backward``: autograd saved the operand as it was, the one problem met again), or None."""
        name = str(op)
        if "_backward" not in name:
            return None
        forward = name.replace("_backward", "").rsplit(".", 1)[0]
        with self.g._lock:
            for key, note in self.g._told.items():
                if key[0] == mpath and str(key[1]).rsplit(".", 1)[0] == forward and note.fix:
                    return note
        return None

    # -- strict / fix / warn --------------------------------------------------------------------------------
    def on_float8(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], exc: BaseException) -> Any:
        """fix / warn: an op failed on its float8 operands (any of torch's texts for it): cast them to the op's
        compute dtype and run it again, recorded like any other alignment; the original error when that fails."""
        from torchdoctor._guard.float8 import findings as float8_findings

        mod, root = self.current()
        maps = self.maps_for(root)
        mpath = maps.modules.get(id(mod)) if maps is not None and mod is not None else None
        fallback = maps.dtype_for(mpath) if maps is not None else None
        found = float8_findings(func, args, kwargs, fallback, exc)
        if not found:
            raise exc
        try:
            return self.on_problem(func, args, kwargs, found)
        except (RuntimeError, TypeError) as again:
            raise exc from again

    def on_problem(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
                   findings: list[Finding], schema_op: Any = None) -> Any:
        """Strict: raise. Fix / warn: record, warn once, align the offending arguments and run ``func``."""
        if self.replaying:  # a proof's re-run on a copy: it must meet what torch does, unaligned and unrecorded
            return func(*args, **kwargs)
        if self.lean is not None and self.lean.depth:
            self.lean.fill_live()
        from torchdoctor._guard.maps import module_label
        from torchdoctor._guard.notes import as_component, gather, tell_once, told
        from torchdoctor._report.model import PlacementWarning
        from torchdoctor._rules import registry as _rules

        case = gather(self, func, args, kwargs, findings, schema_op)
        op, mod, root, mpath, problems, fixable = case.op, case.mod, case.root, case.mpath, case.problems, case.fixable
        plan, tensors = case.plan, case.tensors
        if self.mode == "strict" and case.made and self._gated() and findings[0].problem.kind == "dtype":
            earlier = Outcome(self).earlier(root)  # the op that promoted it silently, unchecked at the boundary
            if earlier is not None:
                self.g._record_problems(list(earlier[0].problems))
                self.g._note(earlier[0].problems, earlier[1])
                raise earlier[0]
        if self.mode == "strict" or (self.mode == "fix" and not fixable):
            err, note = told(self, case)
            self.g._note(err.problems, note)
            raise err
        # fix / warn: the same report, kept (the first time this problem is met) beside what is aligned; a later op
        # of a component already told as the odd one out (every tensor of `vae` float32) is that one finding
        params = [p.path for p in problems if p.role == "parameter"]
        fed = mpath if not params and all(p.kind == "dtype" for p in problems) else None
        note = self.g._group_note(params, fed) or self._forward_note(mpath, op)
        folded, shown = note is not None, problems
        if note is None:
            note, shown = tell_once(self, case)
            problems = shown if params and any(p.role == "component" for p in shown) else problems  # one, aligned
        else:
            self.g._note(problems, note)
            if fed is not None and note.groups:  # fed to the component told as the odd one out: no problem of its own
                self.g._record_problems([], instead=problems)
        if self.mode == "warn" and not folded:
            for p in shown:
                if self.g._first_time((p.module_path, p.op, p.kind)):
                    where = module_label(p.module_path, mod)
                    what = p.message if p.role == "component" else f"{p.path} is {p.found}, expected {p.expected}" \
                        if "promotes the model's" not in p.message else \
                        f"{p.path} is {p.found} and promotes the model's {p.expected} silently"
                    warnings.warn(f"torchdoctor.guard: {p.kind} problem in {where} at {p.op}: {what}"
                                  + ("; aligned for this call" if fixable else "")
                                  + said(note), PlacementWarning, stacklevel=user_stacklevel())
        if not fixable:
            return func(*args, **kwargs)
        if fed is not None and note.aligns[0]:  # the odd component's operands aligned, not the data fed to it
            plan, problems = as_component(plan, tensors, note.aligns), shown if not folded else []
        new_args, new_kwargs = list(args), dict(kwargs)
        for f, target, offenders in plan:
            for k in offenders:
                t = tensors[k].to(target)
                tensors[k] = t
                _rules.OpArgs(new_args, new_kwargs).put(k, t)
        self.g._record_fixes(problems, note)
        return func(*new_args, **new_kwargs)

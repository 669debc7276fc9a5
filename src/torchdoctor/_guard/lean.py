"""explain in a no-grad forward with no global post hook: the module stack rebuilt from the traceback (issue 43).

Any global module hook sends every module call down torch's hooked ``_call_impl`` path; a global post hook costs
that path's second hook loop plus guard's own body on every return. In explain mode nothing runs per op, and under
``no_grad`` no backward follows, so what a module's return had to tell (pop the stack, track outputs for backward)
is needed only when an error escapes. So when an outermost forward starts under ``no_grad`` (``generate()``'s
steps, an inference call), guard's global post hook leaves torch's hook dict for that forward: the pre hook only
records the order modules start in (what provenance calls "ran"), one hook on the outermost module alone (removed
when it returns) checks the output for a silent promotion, and the running modules and their positional inputs are
read back from the failing traceback's ``Module._call_impl`` frames (their ``self`` and ``args``) when an error is
explained. A forward that starts with grad on, or that turns grad on inside (the modules then running are read from
the live frames), runs with both hooks as before. ``LEAN = False`` keeps both hooks on every forward.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import _global_forward_hooks as _posts
from torch.nn.modules.module import _global_forward_pre_hooks as _pres
from torch.nn.modules.module import _global_forward_hooks_with_kwargs as _with_kwargs

LEAN = True  # False: both global hooks on every forward, as before (bench/guard.py times both in one process)
BARE = True  # False: explain's no-grad forwards keep the global pre hook even where the model's tensors agree

_CALL = nn.Module._call_impl.__code__  # the frame that holds a running module's ``self`` and ``args``
_grad_enabled = torch.is_grad_enabled
_T, _P = torch.Tensor, nn.Parameter
_FLOATING = frozenset(d for d in vars(torch).values()
                      if isinstance(d, torch.dtype) and (d.is_floating_point or d.is_complex))
_get_ident = threading.get_ident


def eligible(session: Any) -> bool:
    """explain, and strict at the module boundary with the gate in the session's hooks (fix and warn, and strict on
    every op, read the running module on every op)."""
    if not LEAN:
        return False
    if session.mode == "explain":
        return True
    if not session.gated:  # (fastpath.eligible, read once by the session)
        return False
    from torchdoctor._guard.fastpath import CHAINED

    return CHAINED


def calls(frames: Iterator[Any]) -> list[tuple[nn.Module, Any]]:
    """(module, positional inputs) of the ``Module._call_impl`` frames among ``frames``, in their order."""
    out = []
    for f in frames:
        if f.f_code is _CALL:
            loc = f.f_locals
            s = loc.get("self")
            if isinstance(s, nn.Module):
                args = loc.get("args")
                out.append((s, args if type(args) is tuple else ()))
    return out


def _tensor_attributes(mod: nn.Module) -> tuple[str, ...]:
    """The names of a module's plain tensor attributes (and lists or tuples holding tensors)."""
    return tuple(k for k, v in vars(mod).items() if isinstance(v, _T) or (
        type(v) in (list, tuple) and any(isinstance(x, _T) for x in v)))


def _traceback_frames(tb: Any) -> Iterator[Any]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _live_frames(frame: Any) -> list[Any]:
    out = []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out[::-1]


def _gone(*_: Any) -> None:
    """What a copy of a module made while guard's hook sat on it holds in that hook's place: nothing to do."""


class _RootHook:
    """The hook on the outermost module. A deep copy or a pickle of the module taken inside its forward gets
    ``_gone`` in its place, not the session."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> None:
        self.fn(*args)

    def __deepcopy__(self, memo: Any) -> Any:
        return _gone

    def __reduce__(self) -> tuple[Callable[[], Any], tuple[()]]:
        return _gone_hook, ()


def _gone_hook() -> Callable[..., None]:
    return _gone


class Lean:
    """One session's hooks: the global pre hook (always) and the global post hook (in forwards that start with grad
    on; in strict, also while a module whose tensors disagree runs, for the gate to see it return). ``post_id`` is
    the post hook's id in torch's dict of global forward hooks. During a no-grad forward the stack holds the
    outermost module alone (``fill_live`` puts the running ones on it where a problem is told)."""

    def __init__(self, session: Any, pre: Callable[..., None], post: Callable[..., None], post_id: int) -> None:
        self.session = session
        self.full_pre, self.post, self.post_id = pre, post, post_id
        self.post_on: Any = post  # the function in torch's dict under ``post_id`` now (None: not there)
        self.root: nn.Module | None = None  # the outermost module of the no-grad forward running now
        self.depth = 0  # its calls running now (a forward that calls its own module again)
        self.local: Any = None  # the hook on ``root`` alone
        self.stale: Any = None  # a root hook to remove once torch no longer walks that module's hook dict
        self.ran_lean = False  # the last outermost forward ran without the post hook: rebuild its stack on failure
        self.compiled: dict[int, tuple[nn.Module, bool]] = {}  # an outermost module: does it hold compiled code?
        self.pre_id: int | None = None  # the global pre hook's id in torch's dict, and the hook
        self.pre_fn: Any = None
        self.bare = False  # the no-grad forward running now runs with no global hook at all
        self.local_pre: Any = None  # the root's own pre hook while ``bare`` (a forward calling its module again)
        self.names: dict[int, tuple[nn.Module, tuple[str, ...]]] = {}  # a module's plain tensor attributes

    def hook(self) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        """The global pre hook."""
        s = self.session
        tid, frames, full_pre, checks, chain = s.tid, s.frames, self.full_pre, s.checks, s.chain
        stack, ran = frames.stack, frames.ran
        suspect_post = self._suspect_post()

        def pre(mod: nn.Module, args: tuple[Any, ...]) -> None:
            if self.depth:
                if _get_ident() != tid:
                    return
                if _grad_enabled():  # grad turned on inside a no-grad forward: a backward may follow
                    self._to_full(mod)
                    full_pre(mod, args)
                    return
                if mod is self.root:
                    self.depth += 1
                ran.append(mod)
                if checks is not None:
                    checks(mod, args)
                    if chain[2] and self.post_on is None:  # a suspect runs: the gate must see it return
                        self._set_post(suspect_post)
                return
            if _get_ident() != tid:
                return
            if not stack and not _grad_enabled() and self._start(mod, args):
                if checks is not None:
                    checks(mod, args)
                    if chain[2] and self.post_on is None:
                        self._set_post(suspect_post)
                return
            if self.post_on is not self.post:
                self._set_post(self.post)
            self.ran_lean = False
            full_pre(mod, args)

        return pre

    def _suspect_post(self) -> Callable[..., None]:
        """The post hook while a suspect module runs in a no-grad forward: the gate's post, until none runs."""
        tid, chain = self.session.tid, self.session.chain

        def post(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            if _get_ident() != tid:
                return
            if chain[2] and chain[1] is not None:
                chain[1](mod, args, out)
            if not chain[2] and self.depth:
                self._set_post(None)

        return post

    def _set_post(self, fn: Any) -> None:
        if fn is not None:
            _posts[self.post_id] = fn
            _with_kwargs[self.post_id] = True
        else:
            _posts.pop(self.post_id, None)
        self.post_on = fn

    def _start(self, mod: nn.Module, args: tuple[Any, ...]) -> bool:
        """An outermost forward starts under no_grad: run it with no global post hook (False: it cannot)."""
        if self.stale is not None:
            self.stale.remove()
            self.stale = None
        s = self.session
        if s.replaying or torch.compiler.is_compiling() or self._compiled(mod):
            return False
        try:
            self.local = mod.register_forward_hook(_RootHook(self._root_post), with_kwargs=True, always_call=True)
        except Exception:  # a module that takes no hooks (a scripted one): both global hooks, as before
            return False
        if self.post_on is not None:
            self._set_post(None)
        self.root, self.depth, self.ran_lean = mod, 1, True
        frames = s.frames
        frames.ran.clear()
        frames.bw.clear()
        s._new_forward()
        frames.ran.append(mod)
        frames.stack.append(mod)
        frames.inputs.append(args)
        frames.outer_call(mod, sys._getframe(2))  # (from the pre hook's caller: Module's call)
        if BARE and s.checks is None and s.g.profile is None and self.pre_id is not None and self._agree(mod):
            try:
                self.local_pre = mod.register_forward_pre_hook(_RootHook(self._root_pre))
            except Exception:  # (the post hook took; a pre hook should too: else keep the global one)
                return True
            _pres.pop(self.pre_id, None)  # (torch walks a copy of the dict for this call)
            self.bare = True
        return True

    def _agree(self, root: nn.Module) -> bool:
        """Do all of the model's tensors agree (one device, one floating dtype, no subclass, not meta)? Then the
        policy finds no tensor of it off-policy, and which of its modules ran before a failure names no culprit:
        its no-grad forward runs with no global hook (what it ran is the outermost module alone)."""
        dev = fdt = None
        names = self.names
        todo: list[Any] = [root]
        while todo:
            m = todo.pop()
            if m is None:  # (a submodule slot set to None)
                continue
            todo.extend(m._modules.values())
            hit = names.get(id(m))
            if hit is None or hit[0] is not m:
                hit = names[id(m)] = (m, _tensor_attributes(m))
            own = chain(m._parameters.values(), m._buffers.values(), map(m.__dict__.get, hit[1])) if hit[1] else \
                chain(m._parameters.values(), m._buffers.values())
            t: Any
            for t in own:
                tp = type(t)
                if tp is not _T and tp is not _P:
                    if t is None:
                        continue
                    if isinstance(t, _T) or type(t) in (list, tuple):  # a subclass, or tensors in a container
                        return False
                    continue
                if dev is None:
                    dev = t.device
                elif t.device != dev:
                    return False
                dt = t.dtype
                if dt in _FLOATING:
                    if fdt is None:
                        fdt = dt
                    elif dt is not fdt:
                        return False
        return dev is None or dev.type != "meta"

    def _root_pre(self, mod: nn.Module, args: tuple[Any, ...]) -> None:
        """The outermost module's own pre hook while no global hook runs: it is called again inside its forward."""
        if mod is self.root and self.bare and _get_ident() == self.session.tid:
            self.depth += 1

    def _compiled(self, mod: nn.Module) -> bool:
        """Does the module hold compiled code? dynamo traces the hooks inside it: both hooks, as before."""
        hit = self.compiled.get(id(mod))
        if hit is None or hit[0] is not mod:
            hit = self.compiled[id(mod)] = (mod, any(type(m).__name__ == "OptimizedModule" or getattr(
                m, "_compiled_call_impl", None) is not None for m in mod.modules()))
        return hit[1]

    def _root_post(self, mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """The hook on the outermost module: it returned (or raised)."""
        if mod is not self.root or not self.depth or _get_ident() != self.session.tid:
            return  # (a deep copy of the module carries this hook along)
        self.depth -= 1
        if self.depth:
            return
        raised = sys.exc_info()[0] is not None
        self._end(raised)
        s = self.session
        del s.frames.stack[:], s.frames.inputs[:]
        if raised:  # (the post hooks never ran on an error before: the gate and the output check stay as they are)
            return
        if s.outcome is not None and (s.outcome_model is None or mod is s.outcome_model):
            s.outcome.check(mod, args, kwargs, out)  # the model returned: did its dtype widen silently?
        if s.chain[1] is not None:  # the gate's post: the outermost module returned
            s.chain[1](mod, args, out)

    def _end(self, raised: bool) -> None:
        self.root, self.depth = None, 0
        if self.bare:  # the global pre hook back, for the next forward
            self.bare = False
            _pres[self.pre_id] = self.pre_fn  # type: ignore[index]
            if self.local_pre is not None:
                self.local_pre.remove()
                self.local_pre = None
        if self.post_on is not None:  # a suspect's post still on (an error skipped its return)
            self._set_post(None)
        if self.local is not None:
            if not raised:
                self.local.remove()
            else:  # torch walks the module's hook dict itself while an error unwinds
                self.stale = self.local
            self.local = None

    def _to_full(self, mod: nn.Module) -> None:
        """Grad turned on inside a no-grad forward: the running modules (all but ``mod``, starting now) go on the
        stack from the live frames, and the post hook pops them as they return."""
        self.fill_live(sys._getframe(2), mod)
        self._end(sys.exc_info()[0] is not None)
        self.ran_lean = False
        self._set_post(self.post)

    def fill_live(self, frame: Any = None, starting: nn.Module | None = None) -> None:
        """The running modules of this no-grad forward and their inputs on the stack, from the live frames (the
        outermost first); ``starting``: a module whose pre hook runs now, left for its own push."""
        running = calls(iter(_live_frames(frame if frame is not None else sys._getframe(1))))
        if running and starting is not None and running[-1][0] is starting:
            running.pop()
        start = next((i for i, (m, _) in enumerate(running) if m is self.root), None)
        if start is None:
            return
        frames = self.session.frames
        del frames.stack[:], frames.inputs[:]
        for m, a in running[start:]:
            frames.stack.append(m)
            frames.inputs.append(a)

    def stop(self) -> None:
        for h in (self.local, self.stale, self.local_pre):
            if h is not None:
                h.remove()
        self.local = self.stale = self.root = self.local_pre = None
        self.bare = False
        _pres.pop(self.pre_id, None)  # type: ignore[arg-type]
        self.depth = 0
        _posts.pop(self.post_id, None)
        self.post_on = None

    def rebuild(self, tb: Any) -> bool:
        """Before an escaping error is explained: the running modules and their inputs from the traceback (when the
        forward ran without the post hook). True when the stack was filled (``clear`` empties it again)."""
        frames = self.session.frames
        if not self.ran_lean or frames.stack or tb is None:
            return False
        running = calls(_traceback_frames(tb))
        ran = frames.ran
        first = ran[0] if ran else None
        start = next((i for i, (m, _) in enumerate(running) if m is first), None)
        if start is None:
            return False
        for m, a in running[start:]:
            frames.stack.append(m)
            frames.inputs.append(a)
        return True

    def clear(self) -> None:
        del self.session.frames.stack[:], self.session.frames.inputs[:]

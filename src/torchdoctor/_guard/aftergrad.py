"""strict around the model, call by call: a generate loop's sampling, and after a backward the optimizer step, a
GradScaler's unscale, an EMA update, an optimizer state's ``lerp_``.

strict's module-boundary gate (``_guard/fastpath.py``) leaves the dispatch mode off after a forward whose output
autograd will differentiate, so that the backward of modules that agreed costs nothing. The code that follows the
backward, before the next forward, ran unchecked: ``opt.step()``, ``scaler.unscale_(opt)``, ``ema_p.lerp_(p, 0.01)``,
a hand-written optimizer's ``state.lerp_(update.float(), ...)``.

It is checked here by a cheap first stage. When the training forward returns, a torch-function mode is pushed: it
sees each Python-level torch call (a tensor method, ``torch.<fn>``, a ``_foreach_`` call over lists), never the
backward's own C++ ops. It passes every call through until the backward through that output has finished (autograd
runs a callback at its end: a flag, since a mode pushed from inside autograd would be undone with its thread state).
From then on, a call whose tensors disagree (two devices, two floating dtypes, a tensor subclass, lists looked into)
runs under strict's dispatch mode, so the rules check each aten op it makes exactly as inside a suspect module: the
problem is raised before the op, with the culprit, its maker, the fix aimed there and its proof. The optimizer's
global step pre-hook counts as the end of the backward too (a backward that did not run through the model's output,
or whose callback ran on another thread). The mode is popped when the next outermost forward starts. The code around
a model that feeds no autograd (before the first forward, between the forwards of ``generate()``) is checked the same
way at once: per torch call it costs a Python hop of a few microseconds where the dispatch mode cost one of tens per
aten op (bench/guard.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode


log = logging.getLogger("torchdoctor.guard")
_NO_KWARGS: Mapping[str, Any] = {}
_LISTS = (list, tuple)
_is_compiling = torch.compiler.is_compiling
# what ``is_compiling()`` returns, read without its two calls (dynamo holds the flag while it compiles)
_FLAGS = torch.compiler if isinstance(getattr(torch.compiler, "_is_compiling_flag", None), bool) else None
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback  # type: ignore[attr-defined]


class AfterBackward(TorchFunctionMode):
    """The first stage between a backward and the next forward: calls whose tensors disagree are checked per op.

    ``enter`` / ``leave`` push and pop strict's dispatch mode (``leave``: False when it is not the innermost);
    ``checking`` says whether it is on already (a suspect module's backward keeps it on); ``disagree(values, True)``
    is the gate's comparison of tensors (lists and tuples looked into)."""

    def __init__(self, enter: Callable[[], Any], leave: Callable[[], bool], checking: Callable[[], bool],
                 disagree: Callable[[Any, bool], bool]) -> None:
        super().__init__()
        self.enter, self.leave, self.checking, self.disagree = enter, leave, checking, disagree
        self.ready = False  # the backward through the last training forward has finished
        self.pushed = False  # this mode is on the torch-function stack
        self.task = -2  # the autograd graph task whose end was asked for
        self.grad_handles: list[Any] = []
        self.step_handle: Any = None
        self.checked = 0  # calls that ran under the dispatch mode (bench/guard.py reports it)

    # -- lifetime: armed when a training forward returns, disarmed when the next outermost forward starts --------
    def arm(self, out: Any, ready: bool = False) -> None:
        """The outermost module returned ``out``, which autograd will differentiate (checks start when its backward
        has run), or code outside any module runs now (``ready``: the code around a model that feeds no autograd)."""
        self._drop_grad_hooks()
        self.ready = ready
        for t in _grad_tensors(out) if not ready else ():
            try:
                self.grad_handles.append(t.register_hook(self._grad_arrived))
            except Exception:  # a tensor that takes no hook: the optimizer's step hook still starts the checks
                log.debug("guard: no backward hook on the model's output", exc_info=True)
        if self.step_handle is None and not ready:
            self.step_handle = register_optimizer_step_pre_hook(self._step_pre)
        if not self.pushed:
            self.__enter__()
            self.pushed = True

    def disarm(self) -> None:
        """The next outermost forward starts (or the session stops): no check until its backward has run."""
        self.ready = False
        self._drop_grad_hooks()
        if self.pushed and _top_function_mode() is self:
            self.__exit__(None, None, None)
            self.pushed = False

    def stop(self) -> None:
        self.disarm()
        if self.step_handle is not None:
            self.step_handle.remove()
            self.step_handle = None

    def _drop_grad_hooks(self) -> None:
        for h in self.grad_handles:
            try:
                h.remove()
            except Exception:  # pragma: no cover - removal never fails in practice
                log.debug("hook removal failed", exc_info=True)
        self.grad_handles.clear()

    # -- the end of the backward ----------------------------------------------------------------------------
    def _grad_arrived(self, grad: torch.Tensor) -> None:
        task = torch._C._current_graph_task_id()
        if task != self.task:
            self.task = task
            _queue_callback(self._backward_done)

    def _backward_done(self) -> None:
        self.ready = True

    def _step_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self.pushed:
            self.ready = True

    # -- the first stage --------------------------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        # most calls pass: one tensor (``x.view(1, -1)``), or tensors that agree; the test is ordered so that
        # they pay the least Python beyond the mode's own hop (no chain, no empty dict, the flag read inline)
        if _FLAGS._is_compiling_flag if _FLAGS is not None else _is_compiling():
            torch._dynamo.graph_break()  # dynamo tracing the program's compiled code: no check baked into its graph
        if not kwargs:  # one argument can disagree only as a list of tensors (``torch.cat([a, b])``)
            if not self.ready or (len(args) < 2 and (not args or type(args[0]) not in _LISTS)) \
                    or not self.disagree(args, True) or self.checking():
                return func(*args)
            kwargs = _NO_KWARGS
        elif not self.ready or len(args) + len(kwargs) < 2 or not self.disagree(chain(args, kwargs.values()), True) \
                or self.checking():
            return func(*args, **kwargs)
        self.checked += 1
        self.enter()  # the rules decide, per aten op, as inside a suspect module
        try:
            return func(*args, **kwargs)
        finally:
            self.leave()


def _grad_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors among a forward's output (one level of a tuple, list or dict) that autograd will differentiate:
    a backward through any of them (the loss, or the logits a loss is built from outside) ends with the callback."""
    values = (out,) if isinstance(out, torch.Tensor) else dict.values(out) if isinstance(out, dict) else \
        out if type(out) in (list, tuple) else ()
    return [v for v in values if isinstance(v, torch.Tensor) and v.requires_grad]


def _top_function_mode() -> Any:
    n = torch._C._len_torch_function_stack()
    return torch._C._get_function_stack_at(n - 1) if n else None



def _run_uncompiled(code: Any) -> None:
    """dynamo traces into an active function mode's ``__torch_function__`` and would bake the first stage's checks
    into the graphs it compiles (checked once, at trace time): its frames run uncompiled (as the dispatch mode's
    do) and a trace that reaches it breaks there, so the program's compiled code runs eagerly under strict and each
    call is checked as it runs. Nothing where this torch has no such switch. (``dispatch.never_compiled`` says the
    same to torch; it is not imported here because ``dispatch`` imports this module through ``fastpath``.)"""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    except Exception:
        pass


_run_uncompiled(AfterBackward.__torch_function__.__code__)

"""strict / fix / warn per op: a dispatch mode that checks every aten op against the rules, and a function mode
for the composites whose C++ code compares dtypes before any aten op is dispatched (convolution: input and bias;
scaled_dot_product_attention: query, key and value), so the dispatch mode never sees the call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from sys import modules as _modules
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from torchdoctor._guard import fastpath as _fastpath, float8 as _float8, promotion as _promotion, scaler as _scaler
from torchdoctor._rules import registry as _rules

_find = _rules.find
_quiet = _rules.quiet
_NO_KWARGS: Mapping[str, Any] = {}  # never written: on_problem copies before it aligns

Session = Any  # the guard session that owns these modes (torchdoctor._guard.session; it imports this module)


def _simulating() -> bool:
    """A ``simulate`` / ``virtual_devices`` run is active in this thread (it checks its own ops)."""
    sim = _modules.get("torchdoctor._virtual.tensor")
    return sim is not None and sim.current_space() is not None


_CONV = torch.ops.aten.convolution.default
_UNSCALE = _scaler.UNSCALE


_CONV_FUNCS = frozenset({torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_transpose1d, torch.conv_transpose2d,
                         torch.conv_transpose3d})
_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_SDPA_FUNC = torch._C._nn.scaled_dot_product_attention
_SDPA_NAMES = ("query", "key", "value", "attn_mask")


class CompositeCheck(TorchFunctionMode):
    """fix / warn: the whole guarded run, so that a dtype mix a composite would refuse is aligned first. strict
    needs none: the composite's own error is explained like any other (conv biases are checked at module entry)."""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if (func in _CONV_FUNCS or func is _SDPA_FUNC) and args and isinstance(args[0], torch.Tensor) and \
                torch.is_autocast_enabled(args[0].device.type):
            return func(*args, **kwargs)  # autocast casts a convolution's and attention's operands alike (V15)
        if func in _CONV_FUNCS and len(args) >= 2:
            args = (*args[:2], kwargs.get("bias") if len(args) < 3 else args[2], *args[3:])
            kwargs = {k: v for k, v in kwargs.items() if k != "bias"}
            if isinstance(args[2], torch.Tensor) and not _simulating():
                found = _rules.find(_CONV, args[:3], {}, self.session.g.profile)
                if found:
                    return self.session.on_problem(func, args, kwargs, found, schema_op=_CONV)
        elif func is _SDPA_FUNC and not _simulating():
            # query, key, value and the mask positional (the schema's order), the rest as given
            n = len(args)
            head = [args[i] if i < n else kwargs.get(name) for i, name in enumerate(_SDPA_NAMES)]
            args, kwargs = (*head, *args[4:]), {k: v for k, v in kwargs.items() if k not in _SDPA_NAMES}
            found = _rules.find(_SDPA, args[:4], {}, self.session.g.profile)
            if found:
                return self.session.on_problem(func, args, kwargs, found, schema_op=_SDPA)
        return func(*args, **kwargs)


_T, _P = torch.Tensor, torch.nn.Parameter


# ops that join a list of tensors into one, promoting the list's dtypes as a binary op does (a ``_foreach_`` op works
# element by element: a list of mixed dtypes is no promotion there)
_JOINS = frozenset(getattr(torch.ops.aten, n).default for n in ("cat", "stack", "concat", "concatenate")
                   if hasattr(torch.ops.aten, n))


def _mixed_in(values: Any) -> bool:
    """Plain tensors of two dtypes in one list (``torch.cat([bf16, fp32])``)."""
    first = None
    for v in values if type(values) is list or type(values) is tuple else ():
        tv = type(v)
        if tv is _T or tv is _P:
            if first is None:
                first = v.dtype
            elif v.dtype is not first:
                return True
    return False


_OpOverload = torch._ops.OpOverload
# by id, held alive by _JOINS: an OpOverload hashes in Python, a look-up paid on every op that is no binary mix
_JOIN_IDS = frozenset(map(id, _JOINS))


def _check(self: CheckMode, func: Any, types: Any, args: Sequence[Any] = (),
           kwargs: Mapping[str, Any] | None = None) -> Any:
    if kwargs is None:
        kwargs = _NO_KWARGS
    # an aten op runs through its C++ handle: OpOverload.__call__ is one more Python frame on every op
    run = func._op if type(func) is _OpOverload else func
    try:  # no cost until something raises (zero-cost exception handling)
        if func is _UNSCALE and not _simulating():  # bfloat16 gradients: no CUDA kernel, told on any machine
            _scaler.check_unscale(self.session, args)
        if len(args) > 1:  # two plain tensors of different dtypes: the cheap test run per binary op, inline
            a, b = args[0], args[1]
            ta, tb = type(a), type(b)
            mixed = (ta is _T or ta is _P) and (tb is _T or tb is _P) and a.dtype is not b.dtype
        else:
            mixed = False
        if (mixed or id(func) in _JOIN_IDS and _mixed_in(args[0])) and not _simulating():
            # a binary op that may promote silently (_guard/promotion.py): strict raises it here; fix / warn align
            # the wider operand for this op (the result keeps the model's dtype) and record it
            found = _promotion.findings(self.session, func, args, kwargs, True)
            if found:  # (an op that would fail, an fp32 bias in addmm, is reported as the failure the rules find)
                return self.session.on_problem(func, args, kwargs, _find(func, args, kwargs, self.profile) or found)
        if self.quick and _quiet(func, args, kwargs):  # most ops: one device, nothing to judge
            return run(*args, **kwargs)
        if _simulating():  # a simulation checks its own ops with these rules
            return run(*args, **kwargs)
        found = _find(func, args, kwargs, self.profile)
        if found:
            return self.session.on_problem(func, args, kwargs, found)
        return run(*args, **kwargs)
    except (RuntimeError, TypeError) as exc:
        # fix / warn: a float8 operand the rules let through (one float8 dtype, or two) still fails in the kernel,
        # with a text that depends on the CPU and device (_guard/float8.py): cast it and run the op again
        if not self.aligns or _simulating() or not _float8.float8_failure(exc, args, kwargs):
            raise
        return self.session.on_float8(func, args, kwargs, exc)


def _never_compiled(code: Any) -> bool:
    """Tell dynamo to run ``code``'s frames, and every frame they call, uncompiled: what torch's own
    ``_disable_dynamo`` wrapper around a ``__torch_dispatch__`` does, said once to the code object instead of on
    every op (the wrapper's Python costs a quarter of an empty dispatch mode's time per op; docs/guard-speed.md).
    False where this torch has no such switch: then the class keeps torch's wrapper."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    except Exception:  # another torch: keep the wrapper
        return False
    return True


_UNWRAPPED = _never_compiled(_check.__code__)
never_compiled = _never_compiled  # the plain name other subpackages' dispatch modes use (no private name crosses)


class CheckMode(TorchDispatchMode):
    """Checks every op against the strict rules before it runs; problems go to the session. strict with a model
    enters it only inside modules whose tensors disagree (``_guard/fastpath.py``): entering this object then
    starts that gate, and leaving it stops the gate."""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.profile = session.g.profile
        self.quick = self.profile is None  # the schema-based fast path knows no profile limits
        self.aligns = session.mode in ("fix", "warn")
        self.gate = _fastpath.Gate(self._push, self._pop, session.frames.stack, session.chain) \
            if session.gated and not _simulating() else None  # (fastpath.eligible, read once by the session)

    def __enter__(self) -> CheckMode:
        if self.gate is None:
            return super().__enter__()  # type: ignore[no-any-return]
        self.gate.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.gate is None:
            return super().__exit__(*exc)  # type: ignore[no-any-return]
        self.gate.stop()
        if self.gate.on:  # another mode was left above ours: pop as a plain strict session would
            self.gate.on = False
            super().__exit__(None, None, None)
        return None

    def _push(self) -> None:
        TorchDispatchMode.__enter__(self)

    def _pop(self) -> bool:
        """Leave the mode, only when it is the innermost one (a mode the user entered inside stays intact)."""
        if _get_current_dispatch_mode() is not self:
            return False
        TorchDispatchMode.__exit__(self, None, None, None)
        return True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # read by TorchDispatchMode.__init_subclass__: wrap or not
        return not _UNWRAPPED

    __torch_dispatch__ = _check

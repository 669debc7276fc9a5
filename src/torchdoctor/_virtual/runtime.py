"""Above dispatch: what real code does before any aten op runs, answered for a virtual ``DeviceProfile``.

``VirtualMode`` (a ``TorchFunctionMode``) routes ``.to`` / ``.cuda()`` / ``.xpu()`` and ``device=`` arguments to
virtual devices (factories land on the inner device and are relabelled; a bare ``"cuda"`` is the current virtual
device), turns plain tensors of Python code into virtual ones on their real device, and guards data access.
Legacy type strings answer as the device would (``Tensor.type()`` is ``torch.cuda.FloatTensor``, and
``.type('torch.cuda.HalfTensor')`` moves and casts). ``virtual_world`` makes a ``Space`` this thread's simulation,
installs the runtime APIs of ``devices_api`` for it (and for the threads it starts), and on exit restores
everything, process-wide settings such as the default dtype included.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._device as _device_mod
from torch.overrides import TorchFunctionMode

from torchdoctor._placement import tensor_device
from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._virtual import collective, cpuautocast, defaultdtype, devices_api as api, devrng, dispatch as D
from torchdoctor._virtual import exportaside, hardware, host as H, hostmade, lengths, makers, moveby, outside, ownclass
from torchdoctor._virtual import parallel, replaced, saved, storage, takenback, tracecheck, training, whole, tensor as V
from torchdoctor._virtual.backward import handlers
from torchdoctor._virtual.construct import make_subclass, param_new, restore_default_device
from torchdoctor._virtual.ctors import constructors
from torchdoctor._virtual.deferred import deferred_imports
from torchdoctor._virtual.legacy import legacy_type
from torchdoctor._virtual.dispatch import autocast_args, lift_all, plain
from torchdoctor._virtual.origin import Made
from torchdoctor._virtual.tensor import SMALL, Space, VirtualTensor, host_values, is_virtual, make, with_class_of

_CPU = torch.device("cpu")

# -- moves, factories and data access (a TorchFunctionMode) --------------------------------------------------------

_device_of = tensor_device  # the one device reading (a virtual tensor's label, else its device)


def move(space: Space, t: torch.Tensor, device: torch.device | None, dtype: torch.dtype | None,
         memory_format: Any = None, copy: bool = False, verb: str = ".to()") -> Any:
    """``t.to(device, dtype)``, virtually: the same object when nothing changes, else a new one (autograd's step).
    ``verb``: the call as the program wrote it (``.cpu()``), said where a copy taken back is met."""
    if t.requires_grad and torch.is_grad_enabled():
        with torch.no_grad():
            made = _move(space, t, device, dtype, memory_format, copy, verb)
        return H.through_autograd(t, made)
    return _move(space, t, device, dtype, memory_format, copy, verb)


def _move(space: Space, t: torch.Tensor, device: torch.device | None, dtype: torch.dtype | None,
          memory_format: Any = None, copy: bool = False, verb: str = ".to()") -> Any:
    if not isinstance(t, VirtualTensor) and id(t) in space.foreign:
        D.foreign(space, t)
    src = _device_of(t)
    target = src if device is None else device
    H.absent(space, target)  # a device type this machine lacks raises as its build does
    want = t.dtype if dtype is None else storage.cast_to(t.dtype, dtype)  # a verb's own cast keeps float8 storage
    if src != target or want != t.dtype:
        want = space.hooks.moving(t, target, want)
    if isinstance(t, VirtualTensor) and target.type == "cpu" and is_virtual(src):
        # taken back from a virtual device: a real CPU tensor, which torch.save, safetensors, numpy and PIL take
        origin, running = t._td_origin, space.hooks.running()
        back = takenback.made(t._td_path, verb) if running is None else None  # at the program's line: its record
        if back is not None:
            origin = back
            if back.by_load:  # a state load: the module moves made by then tell where its parameter was (swapload)
                from torchdoctor._virtual.modcast import counts
                back.before = counts()
        elif t._td_path is None:  # an activation taken back: this line put it on the cpu (``.to(cache_device)``)
            origin = Made("Tensor.to", running)
        elif origin is None and running is not None:
            origin = Made.moved(t._td_path, running)
        return space.keep_real(host_values(t, want, memory_format), t._td_path, origin)
    if isinstance(t, VirtualTensor):
        if target == src and want == t.dtype and not copy and memory_format in (None, torch.preserve_format):
            return t
        elem, path = t._td_elem, t._td_path
        copy = copy or (src != target and elem.device.type != "meta")  # a new device is new storage
    else:
        kept = space.real_record(t) if space.real else None  # a real tensor the run made (a factory, a copy back)
        elem, path = space.inner_of(t), kept[0] if kept is not None else None
    with torch._C.DisableTorchFunction():
        elem = elem.to(dtype=want, memory_format=memory_format or torch.preserve_format, copy=copy)
    out = with_class_of(t, elem, target, path)  # a GGUF-style tensor subclass stays one, its attributes kept
    # a cast keeps where the tensor came from (a factory call, the caller)
    origin = t._td_origin if isinstance(t, VirtualTensor) else kept[1] if kept is not None else None
    if origin is not None:
        out._td_origin = origin if src == target else \
            moveby.carried(origin, space.hooks.running(), want if want != t.dtype else None)
    elif path is None:
        _moved_in_block(space, out, want if want != t.dtype else None)
    elif src != target and space.hooks.running() is not None:
        # a model tensor copied to another device inside a forward (``self.inv_freq.to("cpu")``): the copy keeps
        # its name, and the line that moved it, so a problem it causes is fixed there and not on the model's own
        out._td_origin = Made.moved(path, space.hooks.running())
    return _placed(space, out)


def _moved_in_block(space: Space, out: Any, cast: torch.dtype | None = None) -> Any:
    """A tensor made before the run, moved or cast outside any module: named by that line (``Tensor.to at app.py:7``);
    ``cast``: the line cast it too, so its dtype is that line's (``moveby.moved_in``)."""
    if isinstance(out, VirtualTensor) and out._td_origin is None and out._td_path is None and space.hooks.running() is None:
        out._td_origin = moveby.moved_in(cast)
    return out


def _placed(space: Space, out: Any) -> Any:
    """A tensor now held by a virtual device counts against its memory (``torch.cuda.memory_allocated``)."""
    led = hardware.ledger(space)
    if led is not None:
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, VirtualTensor):
                led.add(t)
    return out


def _to(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    self, rest, kw = args[0], args[1:], dict(kwargs)
    copy = bool(kw.pop("copy", False))
    if rest and isinstance(rest[0], torch.Tensor):  # .to(other): other's device and dtype
        device, dtype, memory_format = _device_of(rest[0]), rest[0].dtype, kw.get("memory_format")
    else:
        if rest and isinstance(rest[0], int) and not isinstance(rest[0], bool):
            rest = (space.norm(rest[0]), *rest[1:])
        if isinstance(kw.get("device"), int):
            kw["device"] = space.norm(kw["device"])
        device, dtype, _, memory_format = torch._C._nn._parse_to(*rest, **kw)
        device = space.norm(device) if device is not None else None
    if not isinstance(self, VirtualTensor) and (device is None or not is_virtual(device)):
        return hostmade.cast(H.real(space, func(*args, **kwargs), "Tensor.to", args[0], device is not None), self)
    return move(space, self, device, dtype, memory_format, copy)


def _to_kind(kind: str) -> Callable[..., Any]:
    def handler(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        dev = args[1] if len(args) > 1 else kwargs.get("device")
        target = _CPU if kind == "cpu" else torch.device(kind, dev) if isinstance(dev, int) \
            else space.norm(kind if dev is None else dev)
        if not isinstance(args[0], VirtualTensor) and not is_virtual(target):
            return H.real(space, func(*args, **kwargs), "Tensor.to", args[0], True)
        return move(space, args[0], target, None, kwargs.get("memory_format"), verb=f".{kind}()")

    return handler


def _cast_to(dtype: torch.dtype) -> Callable[..., Any]:
    """``t.half()`` / ``.float()`` / ``.bfloat16()`` (what ``Module.half()`` calls): as ``t.to(dtype)``."""

    def handler(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if len(args) > 1 or set(kwargs) - {"memory_format"} or not isinstance(args[0], VirtualTensor):
            return hostmade.cast(H.real(space, func(*args, **kwargs), "Tensor.to", args[0]), args[0]) \
                if not H.any_virtual(args, kwargs) else _own(func(*args, **kwargs), space, None)
        return move(space, args[0], None, dtype, kwargs.get("memory_format"))

    return handler


def _parse_to(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``Module.to(1)`` / ``Module.to(device=...)``: parsed, not a factory; an int is the accelerator's device."""
    if args and type(args[0]) is int:
        args = (space.norm(args[0]), *args[1:])
    if type(kwargs.get("device")) is int:
        kwargs = dict(kwargs, device=space.norm(kwargs["device"]))
    return func(*args, **kwargs)


def _device_ctor(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if len(args) == 1 and not kwargs and type(args[0]) is int:  # torch.device(0): the accelerator's device 0
        return torch.device(space.vtype, args[0])
    return func(*args, **kwargs)


T = torch.Tensor
_HANDLERS: dict[Any, Callable[..., Any]] = {
    T.to: _to, T.cuda: _to_kind("cuda"), T.cpu: _to_kind("cpu"), torch.device: _device_ctor,
    torch._C._nn._parse_to: _parse_to,
    T.numpy: H.values, T.tolist: H.values, T.__array__: H.values,
    T.half: _cast_to(torch.float16), T.float: _cast_to(torch.float32), T.double: _cast_to(torch.float64),
    T.bfloat16: _cast_to(torch.bfloat16),
    T.type: legacy_type, T.data_ptr: H.host, T.pin_memory: H.host, T.is_pinned: H.host, T.record_stream: H.host,
    T.share_memory_: H.host,
}
if hasattr(T, "xpu"):
    _HANDLERS[T.xpu] = _to_kind("xpu")
for _f in (T.to, T.cuda, T.cpu, getattr(T, "xpu", None), T.half, T.float, T.double, T.bfloat16):
    if _f is not None:  # a subclass's own __torch_function__ (GGUFParameter's quant_type) around the move
        _HANDLERS[_f] = ownclass.keeping(_HANDLERS[_f])


F = torch.nn.functional
# autocast's lower-precision functions whose C++ composites compare dtypes before dispatch is reached
_AUTOCAST_ENTRY = frozenset({torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_transpose1d, torch.conv_transpose2d,
                             torch.conv_transpose3d, F.linear, torch.matmul, T.matmul, T.__matmul__, torch.prelu,
                             F.scaled_dot_product_attention, torch.einsum})


def _own(out: Any, space: Space, target: torch.device | None) -> Any:
    """Outputs of Python-level calls: plain tensors become virtual (a view of someone else's tensor is copied)."""
    if isinstance(out, VirtualTensor):
        return out if target is None else make(VirtualTensor, out._td_elem, target, out._td_path)
    if isinstance(out, torch.Tensor):
        if out._base is not None or (space.data == "meta" and out.numel() > SMALL and out.device.type != "meta"):
            return make(VirtualTensor, space.inner_of(out), target or out.device)
        return make(VirtualTensor, out, target or out.device)
    if isinstance(out, (tuple, list)) and out and any(isinstance(o, torch.Tensor) for o in out):
        try:
            return type(out)(_own(o, space, target) for o in out)
        except TypeError:  # a structseq / namedtuple constructor
            return type(out)([_own(o, space, target) for o in out])
    return out


# Calls answered by torch at once (most calls reach the mode from Module.to and the walker): attributes but the device
# labels and .data (outside.attribute passes them on), and queries of metadata a twin's C++ side holds as is.
_METHOD_WRAPPER = type(torch.Tensor.dtype.__get__)  # type: ignore[attr-defined]
_PLAIN_ATTRS = frozenset(v for n, v in vars(torch._C.TensorBase).items() if type(v).__name__ == "getset_descriptor"
                         and n not in outside._LABELLED and n != "data")
_QUERIES = frozenset(f for f in (T.is_floating_point, T.is_complex, T.size, T.stride, T.storage_offset, T.dim,
                                 T.ndimension, T.numel, T.nelement, T.element_size, T.is_contiguous, T.__len__,
                                 torch._C._set_grad_enabled, torch.is_grad_enabled, outside._ORIG_COMPATIBLE))



class VirtualMode(TorchFunctionMode):
    """The run's one function mode. ``casts`` (``makers.CastMakers``) names the casts of a forward from inside this
    mode: a second mode stacked on it made every torch call two Python hops (14-25 % of a simulate)."""

    def __init__(self, space: Space, casts: Any = None) -> None:
        super().__init__()
        self.space, self.casts = space, casts

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if types and replaced.Moved in types:  # a Parameter the model's move replaced: its successor's call
            return replaced.through(self.space, func, args, kwargs or {}, sys._getframe(1), self.__torch_function__)
        if (func.__self__ in _PLAIN_ATTRS if type(func) is _METHOD_WRAPPER else func in _QUERIES) and not kwargs \
                and (self.casts is None or makers.PARAM not in map(type, args)):
            return func(*args)
        if self.casts is None:
            return self.handle(func, args, kwargs or {})
        # CastMakers' own steps, as its mode took them around this one (``_made`` two frames under the user's line)
        name = getattr(func, "__name__", None)
        if name in makers._REAL_MAKERS:
            return makers._real_made(name, (), self.handle(func, args, kwargs or {}))
        if makers.PARAM in map(type, args):  # a real Parameter a forward built (``makers._lazy_params``, inlined)
            makers._real_made(None, args, None)
        out = self.handle(func, args, kwargs or {})
        if name not in makers._CAST_METHODS or not args or not isinstance(out, VirtualTensor):
            if self.casts.widen and isinstance(out, VirtualTensor):  # a proof's re-run of a line cast back
                out = self.casts._widened(args, kwargs or {}, out)
            return makers.loose_call(name, args, out) if makers.LOOSE[0] else out
        t = args[0]
        if not isinstance(t, VirtualTensor) or out is t or out.dtype == t.dtype or out._td_device != t._td_device:
            return out
        casts, self.casts = self.casts, None  # its own casts (a proof's recast) see this mode alone, as before
        try:
            with self:
                return casts._made(t, out)
        finally:
            self.casts = casts

    def handle(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        space = self.space
        name = getattr(func, "__name__", "")
        if name == "__get__" or name == "__set__":  # attributes of the object itself, never of a copy
            # (half of all calls: .shape, .dtype ...; none of the properties that dispatch is an autocast op, so
            # the autocast state read below for the next op may wait)
            return outside.attribute(space, func, name, args, kwargs)
        if space.relabelled:  # a real tensor with a device label: virtual where it is used
            args, kwargs = H.labelled(args, kwargs, lambda xs: H.graphed(xs, lift_all(xs, space, None)))
        space.read_autocast()  # read here: inside __torch_dispatch__ the autocast keys are excluded (say "disabled")
        if space.vtype != "cpu" and torch.is_autocast_enabled("cpu") and cpuautocast.touches(args):
            with cpuautocast.off():  # the CPU's autocast never casts the device's ops (cpuautocast.py)
                return self.handle(func, args, kwargs)
        handler = _HANDLERS.get(func)
        if handler is not None:
            return handler(space, func, args, kwargs)
        H.drawn(space, func, args, kwargs) if kwargs and kwargs.get("generator") is not None else None
        if space.autocast is not None and func in _AUTOCAST_ENTRY:  # before the composite's own dtype checks
            cast = autocast_args(args, space.vtype, space.autocast)  # above autograd here: casts join the graph
            args = tuple(H.through_autograd(a, c) if isinstance(a, VirtualTensor) and a.requires_grad
                         and torch.is_grad_enabled() else c for a, c in zip(args, cast))
        elif func in whole.ENTRIES:  # one op when nothing inside it can go wrong (whole.py)
            one = whole.single(func, args, kwargs)
            if one is not None:
                return whole.named(D.dispatch(*one), one)
        if func in D.CONV_ENTRY:
            args, kwargs = D.conv_precheck(space, func, args, kwargs)
        elif func is D.SDPA_ENTRY:
            args, kwargs = D.sdpa_precheck(space, args, kwargs)
        dev = kwargs.get("device")
        if dev is None and _device_mod.CURRENT_DEVICE is not None and func in _device_mod._device_constructors():
            dev = kwargs["device"] = training.default_device(space)  # set_default_device's: its mode is below ours
        target = space.norm(dev) if dev is not None else None
        real = args if H.mutates(name) else None  # an in-place call changes the program's real tensors
        if (target is None or not is_virtual(target)) and \
                not H.any_virtual(args, kwargs, space.named if real is None else None):
            # the program's own CPU work (no virtual tensor or device): real tensors, as the program would have them
            factory = func in constructors()
            out = H.cpu_work(space, func, args, kwargs, factory)
            return defaultdtype.note(out, func, kwargs) if factory else out
        if any(plain(a) or isinstance(a, (list, tuple)) and any(plain(x) for x in a) for a in args):
            args = tuple(H.graphed(args, lift_all(args, space, None)))  # in the program's graph still
        if kwargs and any(plain(v) for v in kwargs.values()):
            kwargs = dict(zip(kwargs, H.graphed(list(kwargs.values()), lift_all(kwargs.values(), space, None))))
        if target is None or not is_virtual(target):
            return _made(_own(H.written(real, args, func(*args, **kwargs)), space, target), func, space, kwargs)
        H.absent(space, target)
        space.hooks.creating(name, target, kwargs, args)
        grad = bool(kwargs.pop("requires_grad", False))  # a leaf that asks for grad is one on the device too
        out = func(*args, **dict(kwargs, device=space.inner))
        if space.data == "meta" and all(not isinstance(o, torch.Tensor) or plain(o) and o.numel() <= SMALL
                                        for o in (out if isinstance(out, (tuple, list)) else (out,))):
            out = func(*args, **dict(kwargs, device=_CPU))  # small: worth real values, make it again on cpu
        made = defaultdtype.note(_placed(space, _made(_own(out, space, target), func, space, kwargs)), func, kwargs)
        if grad and isinstance(made, VirtualTensor) and made.is_leaf and made.is_floating_point():
            made.requires_grad_(True)
        return made


def _made(out: Any, func: Any, space: Space, kwargs: Any = None) -> Any:
    """A factory's result records which factory made it in which module (a mask on the wrong device: where made),
    and whether it was told a dtype (none: the default dtype, nobody's choice)."""
    if isinstance(out, VirtualTensor) and out._td_origin is None and out._td_path is None \
            and func in constructors():
        out._td_origin = Made(f"torch.{getattr(func, '__name__', 'tensor')}", space.hooks.running())
        out._td_origin.default = (kwargs or {}).get("dtype") is None and out.is_floating_point()
    return out


@contextlib.contextmanager
def virtual_world(space: Space, profile: DeviceProfile, casts: Any = None) -> Iterator[None]:
    """Make ``space`` this thread's simulation on ``profile``'s hardware (and of the threads it starts); other
    threads keep the real machine; everything is restored on exit. ``casts``: a ``makers.CastMakers`` run inside
    the run's mode, not as a mode of its own."""
    if V.current_space() is not None:
        raise RuntimeError("a simulation is already running in this thread; run another one in its own thread")
    installs = api.Installs(space)
    restore_settings = api.snapshot()
    autocast = (torch.is_autocast_enabled(profile.type), torch.get_autocast_dtype(profile.type)) \
        if profile.type not in ("cpu", "meta") else None
    space.grad = torch.is_grad_enabled()
    V.swap_space(space)
    V._SPACE = space
    had_dynamo = "torch._dynamo" in sys.modules
    try:
        if profile.type not in ("cpu", "meta"):
            api.device_api(installs, profile, space)
            devrng.install(installs, profile, space)  # default generators, seeds, NVTX
            parallel.install(installs)  # DataParallel's copies (Trainer wraps the model when it sees two GPUs)
            collective.install(installs)  # a process group's collectives refuse the devices its backend cannot move
        installs.set(torch, "Generator", api.VirtualGenerator, shared=True)
        makers.install(installs)  # torch.from_numpy / frombuffer: named by their maker and line
        training.install(installs)  # foreach grouping keyed by the devices the program sees
        tracecheck.install(installs)  # torch.jit.trace's check, as far as the run's values let it
        exportaside.install(installs)  # the legacy ONNX exporter of a CPU model runs outside the run
        saved.install(installs, VirtualMode)  # saved-tensor hooks (activation offloading) run under this mode
        # pass-through for anything that is not virtual: one wrapper serves every run
        installs.set(torch.Tensor, "_make_subclass", staticmethod(make_subclass), shared=True)
        installs.set(torch.nn.Parameter, "__new__", staticmethod(param_new), shared=True)
        installs.set(torch, "_has_compatible_shallow_copy_type", outside.compatible, shared=True)
        installs.set(torch.__future__, "get_swap_module_params_on_conversion", replaced.no_swap_in_apply,
                     shared=True)
        # compiled code places tensors as eager code does; inductor needs the GPU
        installs.set(torch, "compile", outside.eager)
        api.follow_threads(installs)
        before = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
        # bitsandbytes and its kind, if the program imports them, import as on the real machine (deferred.py)
        with outside.compiled_run_eagerly(had_dynamo), deferred_imports(), warnings.catch_warnings(), \
                VirtualMode(space, casts):
            H.run_warnings()  # the run's own warnings kept quiet; torch's shown at the program's line
            try:
                yield
            finally:  # a set_default_device("cuda:1") of the run must not outlive it (and its mode sits above ours)
                restore_default_device(before)
    finally:
        space.closed = True
        replaced.end(space)
        installs.release()
        V.swap_space(None)
        if api.active_runs() == 0:
            V._SPACE = None
        restore_settings()
        if autocast is not None:
            with contextlib.suppress(Exception):
                torch.set_autocast_enabled(profile.type, autocast[0])
                torch.set_autocast_dtype(profile.type, autocast[1])
        if not had_dynamo and "torch._dynamo.trace_rules" in sys.modules:  # it cached our answers: forget them
            with contextlib.suppress(Exception):
                sys.modules["torch._dynamo.trace_rules"].get_torch_obj_rule_map.cache_clear()


_HANDLERS.update({**handlers(VirtualMode), **lengths.handlers(VirtualMode)})  # backward.py; CPU lengths (lengths.py)
api.ENTER[:] = [VirtualMode]  # a thread the run starts enters its mode
H.MOVE = move

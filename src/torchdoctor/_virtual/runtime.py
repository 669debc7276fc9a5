"""Above dispatch: what real code does before any aten op runs, answered for a virtual ``DeviceProfile``.

``VirtualMode`` (a ``TorchFunctionMode``) routes ``.to`` / ``.cuda()`` / ``.xpu()`` and ``device=`` arguments to
virtual devices (factories land on the inner device and are relabelled; a bare ``"cuda"`` is the current virtual
device), turns plain tensors of Python code into virtual ones on their real device, and guards data access.
``torch.cuda`` / ``torch.xpu`` / ``torch.mps`` / ``torch.accelerator`` answer availability, count, current device,
capability, properties, ``mem_get_info``, streams, events, synchronize and seeding; ``torch.Generator(device)``
works; ``autocast`` for the virtual type is enabled (a CPU build switches ``autocast("cuda")`` off because
``torch.cuda.is_available()`` is False). ``virtual_world`` installs all of it and restores it all.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._device as _device_mod
from torch.overrides import TorchFunctionMode

from torchdoctor._virtual import tensor as V
from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._virtual.tensor import (
    SMALL,
    Space,
    VirtualTensor,
    autocast_args,
    is_virtual,
    lift_all,
    make,
    plain,
    virtual_class,
)

_MISSING = object()
_CPU = torch.device("cpu")


# -- moves, factories and data access (a TorchFunctionMode) --------------------------------------------------------


def _device_of(t: torch.Tensor) -> torch.device:
    return t._td_device if isinstance(t, VirtualTensor) else t.device


def move(space: Space, t: torch.Tensor, device: torch.device | None, dtype: torch.dtype | None,
         memory_format: Any = None, copy: bool = False) -> Any:
    """``t.to(device, dtype)`` with virtual semantics: the same object when nothing changes, else a new one."""
    src = _device_of(t)
    target = src if device is None else device
    want = t.dtype if dtype is None else dtype
    if src != target or want != t.dtype:
        want = space.hooks.moving(t, target, want)
    if isinstance(t, VirtualTensor):
        if target == src and want == t.dtype and not copy and memory_format in (None, torch.preserve_format):
            return t
        elem, path = t._td_elem, t._td_path
        copy = copy or (src != target and elem.device.type != "meta")  # a new device is new storage
    else:
        elem, path = space.inner_of(t), None
    with torch._C.DisableTorchFunction():
        elem = elem.to(dtype=want, memory_format=memory_format or torch.preserve_format, copy=copy)
    return make(VirtualTensor, elem, target, path)


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
        return _own(func(*args, **kwargs), space, None)
    return move(space, self, device, dtype, memory_format, copy)


def _to_kind(kind: str) -> Callable[..., Any]:
    def handler(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        dev = args[1] if len(args) > 1 else kwargs.get("device")
        target = _CPU if kind == "cpu" else torch.device(kind, dev) if isinstance(dev, int) \
            else space.norm(kind if dev is None else dev)
        if not isinstance(args[0], VirtualTensor) and not is_virtual(target):
            return _own(func(*args, **kwargs), space, None)
        return move(space, args[0], target, None, kwargs.get("memory_format"))

    return handler


def _values(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    self, name = args[0], getattr(func, "__name__", "")
    if not isinstance(self, VirtualTensor):
        return func(*args, **kwargs)
    if name in ("numpy", "__array__") and self._td_device.type != "cpu":
        space.hooks.reading(self, f"Tensor.{name}")  # real PyTorch raises: "can't convert cuda:1 ... to numpy"
    if self._td_elem.device.type == "meta":
        space.hooks.failed(f"Tensor.{name}", None, "it reads tensor values; simulate with data='cpu'")
        raise NotImplementedError(f"Tensor.{name} needs tensor values; simulate with data='cpu'")
    return func(self._td_elem, *args[1:], **kwargs)


def _host(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    self, name = args[0], getattr(func, "__name__", "")
    if not isinstance(self, VirtualTensor):
        return func(*args, **kwargs)
    if name == "data_ptr":  # distinct tensors, distinct pointers (meta says 0 for all)
        return id(self._td_elem) if self._td_elem.device.type == "meta" else self._td_elem.data_ptr()
    return {"is_pinned": False, "record_stream": None}.get(name, self)


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
    T.numpy: _values, T.tolist: _values, T.__array__: _values,
    T.data_ptr: _host, T.pin_memory: _host, T.is_pinned: _host, T.record_stream: _host, T.share_memory_: _host,
}
if hasattr(T, "xpu"):
    _HANDLERS[T.xpu] = _to_kind("xpu")


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


class VirtualMode(TorchFunctionMode):
    def __init__(self, space: Space) -> None:
        super().__init__()
        self.space = space

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        space = self.space
        # read here: inside __torch_dispatch__ the autocast keys are excluded and report "disabled"
        space.autocast = torch.get_autocast_dtype(space.vtype) if torch.is_autocast_enabled(space.vtype) else None
        handler = _HANDLERS.get(func)
        if handler is not None:
            return handler(space, func, args, kwargs)
        if space.autocast is not None and func in _AUTOCAST_ENTRY:  # before the composite's own dtype checks
            args = tuple(autocast_args(args, space.vtype, space.autocast))
        if func in V.CONV_ENTRY:
            args, kwargs = V.conv_precheck(space, func, args, kwargs)
        name = getattr(func, "__name__", "")
        if name == "__get__" or name == "__set__":  # attributes of the object itself, never of a copy
            return func(*args, **kwargs)
        if any(plain(a) or isinstance(a, (list, tuple)) and any(plain(x) for x in a) for a in args):
            args = tuple(lift_all(args, space, None))
        if kwargs and any(plain(v) for v in kwargs.values()):
            kwargs = dict(zip(kwargs, lift_all(kwargs.values(), space, None)))
        dev = kwargs.get("device")
        if dev is None and _device_mod.CURRENT_DEVICE is not None and func in _device_mod._device_constructors():
            dev = kwargs["device"] = _device_mod.CURRENT_DEVICE  # torch.set_default_device: its mode is below ours
        target = space.norm(dev) if dev is not None else None
        if target is None or not is_virtual(target):
            return _own(func(*args, **kwargs), space, target)
        space.hooks.creating(name, target, kwargs)
        out = func(*args, **dict(kwargs, device=space.inner))
        if space.data == "meta" and all(not isinstance(o, torch.Tensor) or plain(o) and o.numel() <= SMALL
                                        for o in (out if isinstance(out, (tuple, list)) else (out,))):
            out = func(*args, **dict(kwargs, device=_CPU))  # small: worth real values, make it again on cpu
        return _own(out, space, target)


_ORIG_MAKE_SUBCLASS = torch.Tensor._make_subclass


def _make_subclass(cls: type[Any], data: torch.Tensor, requires_grad: bool = False, **kwargs: Any) -> Any:
    """``Parameter`` / ``Params4bit`` built around a virtual tensor stay virtual (the library's ``__new__`` runs)."""
    if isinstance(data, VirtualTensor) or issubclass(cls, VirtualTensor):
        v: VirtualTensor = data if isinstance(data, VirtualTensor) else lift_all([data], V._SPACE, None)[0]
        return make(virtual_class(cls), v._td_elem, v._td_device, v._td_path, requires_grad)
    return _ORIG_MAKE_SUBCLASS(cls, data, requires_grad, **kwargs)  # type: ignore[type-var]


_ORIG_PARAM_NEW = torch.nn.Parameter.__new__


def _param_new(cls: type[Any], data: Any = None, requires_grad: bool = True) -> Any:
    """``Parameter(virtual)`` is a (virtual) ``Parameter``, as ``Parameter(tensor)`` is: accelerate's offload hooks
    rebuild weights with ``type(param)(value)``, which a plain tensor with ``_is_param`` cannot do."""
    if isinstance(data, VirtualTensor) and type(data) in (VirtualTensor, virtual_class(torch.nn.Parameter)):
        return _make_subclass(cls, data, requires_grad)
    return _ORIG_PARAM_NEW(cls, data, requires_grad)


# -- the device runtime APIs ---------------------------------------------------------------------------------------


class _Patcher:
    def __init__(self) -> None:
        self.saved: list[tuple[Any, str, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        self.saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, value)

    def many(self, owner: Any, values: dict[str, Any]) -> None:
        for name, value in values.items():
            if hasattr(owner, name):
                self.set(owner, name, _fresh(value))

    def restore(self) -> None:
        for owner, name, old in reversed(self.saved):
            if old is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
            else:
                setattr(owner, name, old)
        self.saved.clear()


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _eager(model: Any = None, **kwargs: Any) -> Any:
    """``torch.compile`` while simulating: the model itself (also as ``@torch.compile(...)``)."""
    return model if model is not None else (lambda fn: fn)


def _fresh(value: Any) -> Any:
    """A distinct function per patched name: torch._dynamo, if first imported meanwhile, maps torch's functions by
    identity and refuses one object under two names."""
    return value if isinstance(value, type) else lambda *args, **kwargs: value(*args, **kwargs)


class VirtualStream:
    """A stream or event on a virtual device: work is ordered already, so waiting and syncing do nothing."""

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        space = V._SPACE
        kind = space.vtype if space is not None else "cuda"
        self.device = space.norm(kind if device is None else device) if space is not None else torch.device(kind, 0)
        self.priority, self.cuda_stream, self.sycl_queue = priority, 0, 0

    wait_stream = wait_event = synchronize = record = wait = _nothing

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else VirtualStream()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: Any) -> float:
        return 0.0

    def __enter__(self) -> VirtualStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _check_index(profile: DeviceProfile, space: Space, device: Any) -> int:
    d = space.norm(profile.type if device is None else device)
    if (d.index or 0) >= profile.count:
        raise RuntimeError(f"invalid device ordinal: {d} (the simulated profile has {profile.count} {profile.type} "
                           "device(s); pass DeviceProfile(count=...))")
    return d.index or 0


def _device_api(p: _Patcher, profile: DeviceProfile, space: Space) -> None:
    """``torch.cuda`` / ``torch.xpu`` (and the matching parts of ``torch.accelerator``) answered from the profile."""
    kind = profile.type
    major, minor = profile.capability
    props = types.SimpleNamespace(
        name=profile.name or f"virtual {kind}", total_memory=profile.memory, major=major, minor=minor,
        multi_processor_count=132, is_integrated=False, type=kind, max_compute_units=64, gpu_eu_count=512,
        driver_version="virtual", has_fp16=True, has_fp64=profile.supports(torch.float64, "compute"))

    def current() -> int:
        return space.current.get(kind, 0)

    def set_device(device: Any) -> None:
        if not (isinstance(device, int) and device < 0):
            space.current[kind] = _check_index(profile, space, device)

    def exchange(device: int) -> int:
        prev = current()
        set_device(device)
        return prev

    @contextlib.contextmanager
    def device_index(device: Any) -> Iterator[None]:
        prev = current()
        if device is not None:
            set_device(device)
        try:
            yield
        finally:
            space.current[kind] = prev

    rng = lambda device=None: torch.zeros(16, dtype=torch.uint8)  # noqa: E731
    stream_cls = type("Stream", (VirtualStream,), {})
    stream = lambda device=None: stream_cls(device)  # noqa: E731
    common = {
        "is_available": lambda *a, **k: True, "device_count": lambda: profile.count, "synchronize": _nothing,
        "empty_cache": _nothing, "memory_allocated": lambda device=None: 0,
        "max_memory_allocated": lambda device=None: 0,
        "memory_reserved": lambda device=None: 0, "max_memory_reserved": lambda device=None: 0,
        "memory_stats": lambda device=None: {}, "reset_peak_memory_stats": _nothing, "manual_seed": _nothing,
        "seed": _nothing, "get_rng_state": rng, "set_rng_state": _nothing, "current_stream": stream,
        "set_stream": _nothing, "Event": type("Event", (VirtualStream,), {}),
        "set_per_process_memory_fraction": _nothing,
    }
    if kind in ("cuda", "xpu"):
        p.many(getattr(torch, kind), dict(
            common, is_initialized=lambda: True, init=_nothing, _lazy_init=_nothing, current_device=current,
            set_device=set_device, _exchange_device=exchange, _maybe_exchange_device=exchange,
            get_device_name=lambda device=None: props.name, get_device_capability=lambda device=None: (major, minor),
            get_device_properties=lambda device=None: (_check_index(profile, space, device), props)[1],
            mem_get_info=lambda device=None: (profile.memory, profile.memory), reset_max_memory_allocated=_nothing,
            reset_accumulated_memory_stats=_nothing, is_current_stream_capturing=lambda: False, get_arch_list=list,
            is_bf16_supported=lambda including_emulation=True: profile.supports(torch.bfloat16, "matmul"),
            is_tf32_supported=lambda: kind == "cuda" and (major, minor) >= (8, 0), manual_seed_all=_nothing,
            seed_all=_nothing, initial_seed=lambda: 0, get_rng_state_all=lambda: [rng() for _ in range(profile.count)],
            set_rng_state_all=_nothing, default_stream=stream, stream=lambda s=None: contextlib.nullcontext(s),
            ipc_collect=_nothing, memory_summary=lambda device=None, abbreviated=False: "",
            Stream=stream_cls))
    if kind == "cuda":
        p.set(torch.backends.cuda, "is_built", lambda: True)
    if kind == "mps":
        p.many(torch.backends.mps, {"is_available": lambda: True, "is_built": lambda: True})
        p.many(torch.mps, dict(common, current_allocated_memory=lambda: 0, driver_allocated_memory=lambda: 0,
                               recommended_max_memory=lambda: profile.memory))
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        p.many(acc, dict(
            common, current_accelerator=lambda check_available=False: torch.device(kind), current_device_index=current,
            current_device_idx=current, set_device_index=set_device, set_device_idx=set_device,
            device_index=device_index, get_memory_info=lambda device=None: (profile.memory, profile.memory),
            get_device_capability=lambda device=None: {"capability": (major, minor)}))


class _GeneratorMeta(type(torch._C.Generator)):  # type: ignore[misc]
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, torch._C.Generator)


class VirtualGenerator(torch._C.Generator, metaclass=_GeneratorMeta):
    """``torch.Generator("cuda:1")``: a CPU generator underneath, labelled with the virtual device."""

    def __new__(cls, device: Any = "cpu") -> VirtualGenerator:
        g = super().__new__(cls, "cpu")  # type: ignore[call-arg]
        space = V._SPACE
        g.__dict__["_td_device"] = space.norm(device) if space is not None else torch.device(device)
        return g

    def __init__(self, device: Any = "cpu") -> None:
        pass

    device = property(lambda self: self.__dict__["_td_device"])  # type: ignore[assignment]


def _restore_default_device(before: Any) -> None:
    glob = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    if glob is None or getattr(glob, "device_context", None) is before:
        return
    with contextlib.suppress(Exception):
        torch.set_default_device(None)
        if before is not None:
            torch.set_default_device(before.device)


@contextlib.contextmanager
def virtual_world(space: Space, profile: DeviceProfile) -> Iterator[None]:
    """Make ``space`` the active simulation on ``profile``'s hardware; everything is restored on exit."""
    if V._SPACE is not None:
        raise RuntimeError("a simulation is already running in this process")
    p = _Patcher()
    V._SPACE = space
    had_dynamo = "torch._dynamo" in sys.modules
    try:
        if profile.type not in ("cpu", "meta"):
            _device_api(p, profile, space)
            # device-generic torch.Event / torch.Stream (transformers' generate on mps records one per step)
            p.set(torch, "Event", type("Event", (VirtualStream,), {}))
            p.set(torch, "Stream", type("Stream", (VirtualStream,), {}))
        p.set(torch, "Generator", VirtualGenerator)
        p.set(torch.Tensor, "_make_subclass", staticmethod(_make_subclass))
        p.set(torch.nn.Parameter, "__new__", staticmethod(_param_new))
        p.set(torch, "compile", _eager)  # compiled code places tensors as eager code does; inductor needs the GPU
        before = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
        with VirtualMode(space):
            try:
                yield
            finally:  # a set_default_device("cuda:1") of the run must not outlive it (and its mode sits above ours)
                _restore_default_device(before)
    finally:
        p.restore()
        V._SPACE = None
        if not had_dynamo and "torch._dynamo.trace_rules" in sys.modules:  # it cached our answers: forget them
            with contextlib.suppress(Exception):
                sys.modules["torch._dynamo.trace_rules"].get_torch_obj_rule_map.cache_clear()

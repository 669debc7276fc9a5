"""Virtual tensors: a shape, a dtype and a device label (``cuda:1``, ``xpu:0``, ``mps:0``) with no such device behind.

The C++ side of a ``VirtualTensor`` is an ordinary wrapper on ``meta`` (on ``cpu`` with ``data="cpu"``), so the
device guards that hand-written bindings open (``__getitem__``, ``copy_``, ``contiguous``, ``nonzero``) and autograd
never meet a device this build lacks (a CPU build opens no CUDA/XPU device guard). Only Python sees the label: ``.device``, ``.is_cuda``,
``get_device()``. Every aten op with a virtual argument goes through ``_dispatch``, which lets the active ``Space``
check it (the strict rules), runs it on the inner tensors and labels the outputs. Small tensors keep real values
even with ``data="meta"`` (token ids, masks, scheduler tables), so code that branches on them still runs; one meta
input makes an op run on meta. What happens above dispatch (``.to``, factories, the runtime APIs) lives in
``_virtual_runtime``.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

aten = torch.ops.aten
SMALL = 1 << 16  # elements: at most this many and a tensor keeps real values even with data="meta"
_REAL_TYPES = frozenset({"cpu", "meta"})
_CPU = torch.device("cpu")
_META = torch.device("meta")


def is_virtual(device: torch.device) -> bool:
    """Devices this build cannot hold data on are labels (``cuda``, ``xpu``, ``mps`` ...)."""
    return device.type not in _REAL_TYPES


class Hooks:
    """What a simulation plugs into the machinery; the defaults check nothing."""

    def check(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return args, kwargs

    def moving(self, tensor: torch.Tensor, target: torch.device, dtype: torch.dtype) -> torch.dtype:
        """A tensor is moved or cast; returns the dtype to continue with."""
        return dtype

    def creating(self, name: str, device: torch.device, kwargs: dict[str, Any]) -> None:
        """A factory is about to create a tensor on a virtual device."""

    def failed(self, what: str, exc: BaseException | None, hint: str = "") -> None:
        """An op could not run on the inner tensors; may raise to end the simulation."""

    def reading(self, tensor: torch.Tensor, what: str) -> None:
        """Host code reads a tensor that is not on the CPU (``numpy()``)."""


class Space:
    """The active simulation: where values live (``meta`` or ``cpu``), the virtual device type, current indices."""

    def __init__(self, data: str = "meta", vtype: str = "cuda", hooks: Hooks | None = None) -> None:
        if data not in ("meta", "cpu"):
            raise ValueError(f"data must be 'meta' or 'cpu', not {data!r}")
        self.data, self.vtype, self.hooks = data, vtype, hooks or Hooks()
        self.inner = _META if data == "meta" else _CPU  # the C++ device of every wrapper of the run
        self.current: dict[str, int] = {}
        self.ops = 0
        self.autocast: torch.dtype | None = None  # the virtual type's autocast dtype while enabled

    def norm(self, device: Any) -> torch.device:
        """``'cuda'`` means the current virtual device, as in real PyTorch; an int means ``vtype:int``."""
        if isinstance(device, int):
            return torch.device(self.vtype, device)
        d = device if isinstance(device, torch.device) else torch.device(device)
        if d.index is None and d.type not in _REAL_TYPES:
            return torch.device(d.type, self.current.get(d.type, 0))
        return d

    def inner_of(self, t: torch.Tensor) -> torch.Tensor:
        """A real tensor's stand-in: a private copy of its values (``data="cpu"``, or small), else an empty meta
        twin, so no weight bytes are copied and nothing is shared with the user's tensor."""
        with torch._C.DisableTorchFunction():  # machinery: neither VirtualMode nor subclasses may see these calls
            if t.device.type == "meta" or (self.data == "meta" and t.numel() > SMALL):
                if self.data == "meta":
                    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=_META)
                return torch.zeros(t.size(), dtype=t.dtype)
            return t.detach().clone()


_SPACE: Space | None = None  # set by _virtual_runtime.virtual_world


def _is_type(kind: str) -> property:
    return property(lambda self: self._td_device.type == kind)


class VirtualTensor(torch.Tensor):
    """A tensor whose device is a label; its values, if any, live in ``_td_elem`` (meta or cpu)."""

    # slots, not __dict__: the walker reads tensors' __dict__ (bnb keeps quant_state there), never these
    __slots__ = ("_td_elem", "_td_device", "_td_path")
    _td_elem: torch.Tensor
    _td_device: torch.device
    _td_path: str | None

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        return _dispatch(func, args, kwargs or {})

    device = property(lambda self: self._td_device)  # type: ignore[assignment]
    is_cuda, is_xpu, is_mps = _is_type("cuda"), _is_type("xpu"), _is_type("mps")  # type: ignore[assignment]
    is_cpu, is_meta = _is_type("cpu"), _is_type("meta")  # type: ignore[assignment]

    def get_device(self) -> int:  # type: ignore[override]
        return -1 if self._td_device.type == "cpu" else (self._td_device.index or 0)

    def _get_data(self) -> torch.Tensor:
        return make(VirtualTensor, self._td_elem, self._td_device, self._td_path)  # type: ignore[no-any-return]

    def _set_data(self, new: torch.Tensor) -> None:
        v: VirtualTensor = new if isinstance(new, VirtualTensor) else \
            make(VirtualTensor, _SPACE.inner_of(new) if _SPACE else new.detach(), new.device)
        torch._C.TensorBase.data.__set__(self, v)  # type: ignore[attr-defined]  # shape/dtype on the C++ side
        self._td_elem, self._td_device = v._td_elem, v._td_device

    data = property(_get_data, _set_data)  # type: ignore[assignment]

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        from torchdoctor._placement import compact

        where = f", path={self._td_path!r}" if self._td_path else ""
        return f"VirtualTensor({compact(self.dtype, tuple(self.shape), self._td_device)}{where})"

    def __deepcopy__(self, memo: dict[int, Any]) -> VirtualTensor:
        with torch._C.DisableTorchFunction():
            elem = self._td_elem if self._td_elem.device.type == "meta" else self._td_elem.clone()
        new: VirtualTensor = make(type(self), elem, self._td_device, self._td_path, self.requires_grad)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            new.__dict__[k] = copy.deepcopy(v, memo)
        return new

    def __reduce_ex__(self, proto: Any) -> Any:
        raise TypeError(f"{self!r} is a simulated tensor and cannot be pickled")


_VCLASSES: dict[type, type] = {torch.Tensor: VirtualTensor}


def virtual_class(cls: type) -> type:
    """``Params4bit`` -> a ``VirtualTensor`` subclass that is also a ``Params4bit``: its Python methods (``.to``,
    ``.cuda``) keep the installed library's semantics while its ops see a virtual tensor."""
    if issubclass(cls, VirtualTensor):
        return cls
    hit = _VCLASSES.get(cls)
    if hit is None:
        ns: dict[str, Any] = {"__module__": __name__, "__slots__": ()}
        for klass in cls.__mro__:  # keep a library's own __torch_function__ (bnb Params4bit: chunk/split)
            tf = klass.__dict__.get("__torch_function__")
            if tf is not None:
                if klass not in (torch.Tensor, torch.nn.Parameter, torch._C.TensorBase):
                    ns["__torch_function__"] = tf
                break
        hit = _VCLASSES[cls] = type(f"Virtual{cls.__name__}", (VirtualTensor, cls), ns)
    return hit


def make(cls: type, elem: torch.Tensor, device: torch.device, path: str | None = None,
         requires_grad: bool = False) -> Any:
    """A ``cls`` wrapper (a ``VirtualTensor`` subclass) around ``elem``, labelled ``device``."""
    t: Any = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
        cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
        device=_SPACE.inner if _SPACE is not None else _META, requires_grad=requires_grad,
    )
    t._td_elem, t._td_device, t._td_path = elem, device, path
    return t


# process state held by user objects: the copy shares it rather than failing to copy it
_SHARED = (type(threading.Lock()), type(threading.RLock()), threading.Thread, threading.Event, threading.Condition)


def virtual_copy(obj: Any, tensors: list[tuple[torch.Tensor, torch.device, str]],
                 space: Space) -> tuple[Any, dict[int, Any]]:
    """A deep copy of ``obj`` in which each listed tensor is a virtual twin of a matching class (``Parameter``,
    ``Params4bit``): no weight bytes are copied and the copy shares nothing mutable with the user's objects."""
    memo: dict[int, Any] = {}
    made: list[tuple[torch.Tensor, Any]] = []
    for t, device, path in tensors:
        if id(t) not in memo:
            memo[id(t)] = v = make(virtual_class(type(t)), space.inner_of(t), device, path, t.requires_grad)
            made.append((t, v))
    memo[id(memo)] = [t for t, _ in made]  # keep-alive, as copy.deepcopy does
    dispatch = copy._deepcopy_dispatch  # type: ignore[attr-defined]
    saved = {tp: dispatch.get(tp) for tp in _SHARED}
    dispatch.update({tp: copy._deepcopy_atomic for tp in _SHARED})  # type: ignore[attr-defined]
    try:
        clone = copy.deepcopy(obj, memo)
    except Exception as exc:
        raise TypeError(f"simulate works on a deep copy, and {type(obj).__name__} could not be copied: "
                        f"{type(exc).__name__}: {exc}") from exc
    finally:
        for tp, old in saved.items():
            if old is None:
                dispatch.pop(tp, None)
            else:
                dispatch[tp] = old
    for t, v in made:  # library attributes of tensors (bnb: quant_state, module, blocksize, CB, SCB)
        for k, val in (getattr(t, "__dict__", None) or {}).items():
            v.__dict__[k] = copy.deepcopy(val, memo)
    return clone, memo


# -- dispatch ------------------------------------------------------------------------------------------------------


def plain(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and not isinstance(x, VirtualTensor)


def lift_all(items: Any, space: Space | None, follow: torch.device | None) -> list[Any]:
    """Plain tensors in one level of ``items`` (and lists) become virtual. With ``follow``, tensors a C++ composite
    made from a wrapper's options (on the inner device) belong to the op and take that label; others keep their
    real device and are copied (they belong to someone else)."""

    def one(x: Any) -> Any:
        if not plain(x):
            return x
        if follow is not None and (x.device.type == "meta" or space is None or x.device == space.inner):
            return make(VirtualTensor, x, follow)
        return make(VirtualTensor, space.inner_of(x) if space is not None else x, x.device)

    return [one(a) if not isinstance(a, (list, tuple)) else type(a)(one(x) for x in a)
            if any(plain(x) for x in a) else a for a in items]


def tensors_of(args: Any, kwargs: dict[str, Any]) -> Iterator[VirtualTensor]:
    for a in (*args, *kwargs.values()):
        if isinstance(a, VirtualTensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, VirtualTensor))


def out_device(args: Any, kwargs: dict[str, Any]) -> torch.device:
    """Where an op's outputs live: an explicit ``device=``, else the first tensor that is not a CPU scalar."""
    dev = kwargs.get("device")
    # C++ composites pass the wrapper's own C++ device (meta / cpu), which means "like the inputs"
    if dev is not None and torch.device(dev) != (_SPACE.inner if _SPACE is not None else _META):
        return torch.device(dev)
    first = None
    for t in tensors_of(args, kwargs):
        if first is None:
            first = t._td_device
        if t._td_device.type != "cpu" or t.dim() > 0:
            return t._td_device
    return first if first is not None else _CPU


def _ops(*names: str) -> frozenset[Any]:
    return frozenset(getattr(aten, n) for n in names if hasattr(aten, n))


# Autocast for a virtual type, emulated: real autocast keys follow the C++ device, which is meta. CUDA's lists, as
# seen below CompositeImplicit decomposition: these run in the autocast dtype, those in float32.
_AUTOCAST_LOW = _ops("mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "addr", "convolution", "_convolution",
                     "prelu", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu", "linear",
                     "matmul", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_AUTOCAST_FP32 = _ops("native_layer_norm", "native_group_norm", "exp", "log", "log1p", "pow", "rsqrt", "softplus",
                      "mse_loss", "l1_loss", "smooth_l1_loss", "nll_loss", "binary_cross_entropy_with_logits", "cdist")
_CASTABLE = (torch.float32, torch.float16, torch.bfloat16)
# a view or copy of a named tensor keeps its name, so a problem in a later op still points at the weight
_KEEP_PATH = _ops("clone", "_to_copy", "contiguous", "detach", "alias", "lift_fresh", "_unsafe_view", "view",
                  "reshape", "t", "transpose", "permute")


def autocast_args(args: Any, kind: str, want: torch.dtype) -> list[Any]:
    """Floating virtual tensors on the autocast device type, cast to ``want`` (one level, lists included)."""

    def cast(x: Any) -> Any:
        if isinstance(x, VirtualTensor) and x.dtype != want and x.dtype in _CASTABLE and x._td_device.type == kind:
            return make(VirtualTensor, x._td_elem.to(want), x._td_device, x._td_path)
        return x

    return [cast(a) if not isinstance(a, (list, tuple)) else type(a)(cast(x) for x in a) for a in args]


def _autocast(func: Any, args: list[Any], kind: str, low_dtype: torch.dtype) -> list[Any]:
    packet = func.overloadpacket
    if packet in _AUTOCAST_LOW:
        return autocast_args(args, kind, low_dtype)
    return autocast_args(args, kind, torch.float32) if packet in _AUTOCAST_FP32 else args


# C++ conv composites compare input and bias dtypes before dispatch ("Input type (float) and bias type
# (c10::BFloat16) should be the same"): the rules must see these calls first, or the error escapes unrecorded
_CONV_NAMES = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
CONV_ENTRY = {getattr(torch, n): getattr(getattr(aten, n), getattr(aten, n).overloads()[0]) for n in _CONV_NAMES}


def conv_precheck(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """Input, weight and bias of a conv call checked (and fixed) by the space's hooks when input and bias differ."""
    names = ("input", "weight", "bias")
    vals = [args[i] if i < len(args) else kwargs.get(n) for i, n in enumerate(names)]
    x, _, b = vals
    if not (isinstance(x, VirtualTensor) and isinstance(b, VirtualTensor) and isinstance(vals[1], VirtualTensor)) \
            or x.dtype == b.dtype:
        return args, kwargs
    fixed, _ = space.hooks.check(CONV_ENTRY[func], tuple(vals), {})
    out, kw = list(args), dict(kwargs)
    for i, (n, v) in enumerate(zip(names, fixed)):
        if i < len(out):
            out[i] = v
        else:
            kw[n] = v
    return tuple(out), kw


def _pairs(before: Any, after: Any, back: dict[int, VirtualTensor]) -> None:
    """Which original argument each replaced one stands for (an in-place op returns the original)."""
    for b, a in zip(before, after):
        if a is not b and isinstance(a, VirtualTensor) and isinstance(b, VirtualTensor):
            back[id(a)] = back.get(id(b), b)
        elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and a is not b:
            _pairs(b, a, back)


def _grouped_mm(func: Any, a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    # the meta kernel mirrors the CUDA bf16 fast path only; eager CUDA falls back to a loop for other dtypes
    if a.dtype == torch.bfloat16 or a.dtype != b.dtype or kwargs.get("out_dtype") not in (None, a.dtype):
        return func(a, b, *args, **kwargs)  # type: ignore[no-any-return]
    bf = torch.bfloat16
    rest = [x.to(bf) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in args]
    return func(a.to(bf), b.to(bf), *rest, **kwargs).to(a.dtype)  # type: ignore[no-any-return]


# ops whose meta kernel is stricter than the device kernels it stands for
_META_OVERRIDES: dict[Any, Callable[..., Any]] = {p: _grouped_mm for p in _ops("_grouped_mm")}


_FAKE_OK: dict[Any, bool] = {}


def has_fake(func: Any) -> bool:
    """Can ``func`` run without its device: an aten op, a composite, or a custom op with a fake/meta kernel?"""
    hit = _FAKE_OK.get(func)
    if hit is None:
        name = getattr(getattr(func, "_schema", None), "name", "aten::?")
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        opdef = torch._library.custom_ops.OPDEFS.get(name)
        hit = _FAKE_OK[func] = name.split("::")[0] in ("aten", "prims") or any(
            has(name, k) for k in ("CompositeImplicitAutograd", "CompositeExplicitAutograd")) or (
            opdef._abstract_fn is not None if opdef is not None else has(name, "Meta")
            or torch._library.simple_registry.singleton.find(name).fake_impl.kernel is not None)
    return hit


def _dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with torch._C.DisableTorchFunction():  # VirtualMode is for the user's Python, not for this machinery
        return _dispatch_op(func, args, kwargs)


def _dispatch_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    space = _SPACE
    if space is not None and not has_fake(func):  # even with CPU values: its device kernel is unknown here
        space.hooks.failed(str(func), None, "it is a custom op with no fake/meta kernel (register_fake), so "
                                            "it cannot run without the hardware")
    follow = out_device(args, kwargs)
    largs = lift_all(args, space, follow)
    if kwargs and any(plain(v) for v in kwargs.values()):
        kwargs = dict(zip(kwargs, lift_all(kwargs.values(), space, follow)))
    back: dict[int, VirtualTensor] = {}
    if space is not None:
        space.ops += 1
        if space.autocast is not None:  # autocast casts before the kernel checks anything
            cast = _autocast(func, largs, space.vtype, space.autocast)
            _pairs(largs, cast, back)
            largs = cast
        checked, kwargs = space.hooks.check(func, tuple(largs), kwargs)
        _pairs(largs, checked, back)
        largs = list(checked)
    dev = out_device(largs, kwargs)
    first = largs[0] if largs else None
    path = first._td_path if isinstance(first, VirtualTensor) and first._td_path is not None and (
        getattr(func, "is_view", False) or func.overloadpacket in _KEEP_PATH) else None
    on_meta = any(t._td_elem.device.type == "meta" for t in tensors_of(largs, kwargs))
    owner: dict[int, VirtualTensor] = {}

    def unwrap(x: Any) -> Any:
        if isinstance(x, VirtualTensor):
            e = x._td_elem
            if on_meta and e.device.type != "meta":
                e = torch.empty_strided(e.size(), e.stride(), dtype=e.dtype, device=_META)
            owner[id(e)] = back.get(id(x), x)
            return e
        if isinstance(x, (list, tuple)) and any(isinstance(y, VirtualTensor) for y in x):
            return type(x)(unwrap(y) for y in x)
        return x

    uargs = [unwrap(a) for a in largs]
    ukwargs = {k: unwrap(v) for k, v in kwargs.items()} if kwargs else {}
    try:
        override = _META_OVERRIDES.get(func.overloadpacket) if on_meta else None
        out = override(func, *uargs, **ukwargs) if override is not None else func(*uargs, **ukwargs)
    except (NotImplementedError, RuntimeError) as exc:
        if space is not None:
            space.hooks.failed(str(func), exc)
        raise
    return _wrap(out, dev, owner, path)


def _wrap(out: Any, dev: torch.device, owner: dict[int, VirtualTensor], path: str | None) -> Any:
    if isinstance(out, torch.Tensor):
        same = owner.get(id(out))
        if same is None:
            return make(VirtualTensor, out, dev, path)
        if same._td_elem is not out:  # an in-place op ran on the meta twin of a small real tensor
            same._td_elem = out
        return same
    if isinstance(out, (tuple, list)):
        return type(out)(_wrap(o, dev, owner, path) for o in out)
    return out

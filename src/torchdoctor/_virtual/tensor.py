"""Virtual tensors: a shape, a dtype and a device label (``cuda:1``, ``xpu:0``, ``mps:0``) with no such device behind.

The C++ side of a ``VirtualTensor`` is an ordinary wrapper on ``meta`` (on ``cpu`` with ``data="cpu"``), so the
device guards that hand-written bindings open (``__getitem__``, ``copy_``, ``contiguous``, ``nonzero``) and autograd
never meet a device this build lacks (a CPU build opens no CUDA/XPU device guard). Only Python sees the label: ``.device``, ``.is_cuda``,
``get_device()``. Every aten op with a virtual argument goes through ``_dispatch``, which lets the active ``Space``
check it (the strict rules), runs it on the inner tensors and labels the outputs. Small tensors keep real values
even with ``data="meta"`` (token ids, masks, scheduler tables), so code that branches on them still runs; one meta
input makes an op run on meta. The op path itself is ``dispatch``; what happens above dispatch (``.to``,
factories) is ``runtime``; the runtime APIs are ``devices_api``. A simulation belongs to the thread that runs it
(and the threads it starts): ``current_space()`` is per thread.
"""

from __future__ import annotations

import copy
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from torchdoctor._virtual.perthread import ThreadCurrent

aten = torch.ops.aten
SMALL = 1 << 16  # elements: at most this many and a tensor keeps real values even with data="meta"
_REAL_TYPES = frozenset({"cpu", "meta"})
_CPU, _META = torch.device("cpu"), torch.device("meta")


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

    def creating(self, name: str, device: torch.device, kwargs: dict[str, Any], args: tuple[Any, ...] = ()) -> None:
        """A factory is about to create a tensor on a virtual device (``args``: its data, if it takes any)."""

    def drawing(self, func: Any, device: torch.device, generator: Any) -> None:
        """An op on tensors on ``device`` draws from ``generator``: real PyTorch refuses one of another type."""

    def failed(self, what: str, exc: BaseException | None, hint: str = "") -> None:
        """An op could not run on the inner tensors; may raise to end the simulation."""

    def refused(self, op: str, culprits: list[torch.Tensor], expected: torch.dtype, exc: BaseException) -> bool:
        """The kernel of ``op`` refused its arguments' dtypes (``Promotion for Float8 Types is not supported``, no
        kernel for a dtype), as the real device would. ``culprits`` are the tensors of the odd dtype (their
        ``_td_path`` names the model tensor they are or came from), ``expected`` the dtype the others compute in.
        Return True to record it and go on as if they had been cast to ``expected``; False lets the error
        propagate (this default)."""
        return False

    def unsupported(self, path: str | None, what: str, why: str) -> None:
        """A tensor the virtual machinery cannot stand in for (nested, sparse, torch.ao quantized, DTensor ...);
        may raise to end the simulation. This default reports it as an op that cannot be simulated."""
        self.failed(what, None, why)

    def reading(self, tensor: torch.Tensor, what: str) -> None:
        """Host code reads a tensor that is not on the CPU (``numpy()``)."""

    def running(self) -> Any:
        """The innermost running module (provenance of the tensors made now), or None."""
        return None

    def path_of(self, module: Any) -> str | None:
        """The path of a module of the run (``a``, ``blocks.0``), or None."""
        return None

    def library_made(self, origin: Any) -> bool:
        """A record whose maker's line is a library's own, not the program's."""
        return False

    def attribute_of(self, tensor: torch.Tensor, kept: Any = None) -> str | None:
        """``blocks.0.scale``: the path of ``tensor`` as a plain attribute of the running module, or None."""
        return None


class Space:
    """The active simulation: where values live (``meta`` or ``cpu``), the virtual device type, current indices."""

    def __init__(self, data: str = "meta", vtype: str = "cuda", hooks: Hooks | None = None) -> None:
        if data not in ("meta", "cpu"):
            raise ValueError(f"data must be 'meta' or 'cpu', not {data!r}")
        self.data, self.vtype, self.hooks = data, vtype, hooks or Hooks()
        self.inner = _META if data == "meta" else _CPU  # the C++ device of every wrapper of the run
        self.current, self.ops = ThreadCurrent(), 0  # the current indices: per thread, as the CUDA runtime keeps them
        self.computed: dict[torch.dtype | None, int] = {}  # the dtypes matmul-like ops computed in (casts applied)
        self.autocast: torch.dtype | None = None  # the virtual type's autocast dtype while enabled
        self.amp = False  # autocast was on at some op: a backward's dtype mismatches are the emulation's (recorder)
        self.api: dict[tuple[int, str], Any] = {}  # this run's answers of the patched runtime APIs
        self.closed = False  # the run ended: threads it started see the real machine from now on
        self.grad = False  # the grad mode the run started in (threads it starts take it too)
        # copies of tensors no virtual twin can stand in for (nested, sparse, quantized ...) -> (path, why)
        self.foreign: dict[int, tuple[str, str]] = {}
        self.named: dict[int, tuple[torch.Tensor, str]] = {}  # real tensors a module-entry check named, by id
        self.relabelled: list[Any] = []  # weak references to real tensors given a device label by ``.data =``
        self.replaced: dict[int, tuple[Any, Any]] = {}  # Parameters Module.to replaced: id -> (weak old, new)
        from torchdoctor._virtual.kernels import TABLE

        self.kernels: dict[Any, Any] = TABLE  # meta-kernel outputs by op and argument metadata, for the process
        # real CPU tensors the run made (factories, what came back from a virtual device): id -> (weak reference,
        # path, provenance), so a tensor that later meets virtual ones is still named by where it came from
        self.real: dict[int, tuple[Any, str | None, Any]] = {}

    def norm(self, device: Any) -> torch.device:
        """``'cuda'`` means the current virtual device, as in real PyTorch; an int means ``vtype:int``."""
        if isinstance(device, int):
            return torch.device(self.vtype, device)
        d = device if isinstance(device, torch.device) else torch.device(device)
        if d.index is None and d.type not in _REAL_TYPES:
            return torch.device(d.type, self.current.get(d.type, 0))
        return d

    def read_autocast(self) -> None:
        """The virtual type's autocast dtype now (read above dispatch, where autocast reports its state)."""
        self.autocast = torch.get_autocast_dtype(self.vtype) if torch.is_autocast_enabled(self.vtype) else None
        self.amp = self.amp or self.autocast is not None

    def keep_real(self, t: Any, path: str | None, origin: Any) -> Any:
        """``t`` stays a real tensor (so ``torch.save``, safetensors and numpy take it); its name and provenance are
        kept aside for the moment it meets virtual tensors. Returns ``t``."""
        if isinstance(t, torch.Tensor) and (path is not None or origin is not None):
            try:
                ref = weakref.ref(t, functools.partial(_forget, self.real, id(t)))
            except TypeError:
                return t
            self.real[id(t)] = (ref, path, origin)
        return t

    def real_record(self, t: torch.Tensor) -> tuple[str | None, Any] | None:
        """The (path, provenance) kept for the real tensor ``t`` by ``keep_real``, or None."""
        hit = self.real.get(id(t))
        return (hit[1], hit[2]) if hit is not None and hit[0]() is t else None

    def inner_of(self, t: torch.Tensor) -> torch.Tensor:
        """A real tensor's stand-in: a private copy of its values (``data="cpu"``, or small), else an empty meta
        twin, so no weight bytes are copied and nothing is shared with the user's tensor."""
        with torch._C.DisableTorchFunction():  # machinery: neither VirtualMode nor subclasses may see these calls
            if t.device.type == "meta" or (self.data == "meta" and t.numel() > SMALL):
                if self.data == "meta":
                    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=_META)
                return torch.zeros(t.size(), dtype=t.dtype)
            return t.detach().clone()


def _forget(table: dict[int, Any], key: int, _ref: Any) -> None:
    table.pop(key, None)


class _State(threading.local):
    space: Space | None = None


_STATE = _State()
# some simulation is running in this process (any thread): for code that only needs to know that much
_SPACE: Space | None = None


def current_space() -> Space | None:
    """The simulation this thread belongs to (its own, or the one that started it), or None."""
    return _STATE.space


def swap_space(space: Space | None) -> Space | None:
    """Make ``space`` this thread's simulation; returns the previous one."""
    prev, _STATE.space = _STATE.space, space
    return prev


_DISPATCH: list[Callable[[Any, Any, dict[str, Any]], Any]] = []  # filled by ``dispatch`` when it is imported


def unsupported_form(t: torch.Tensor) -> str | None:
    """Why no virtual twin can stand in for ``t`` (a nested, sparse, torch.ao quantized or distributed tensor),
    or None."""
    from torchdoctor._walk import form_of

    form = form_of(t)
    if form == "dense" or (form == "subclass" and not _slot_conflict(type(t))):
        return None
    return {"nested": "nested tensors have no fixed sizes or strides, which a virtual tensor needs",
            "sparse": "sparse tensors have no strides, which a virtual tensor needs",
            "quantized": "torch.ao quantized tensors have no meta kernels",
            "dtensor": "a DTensor's placement is its device mesh; check its local shard per rank instead",
            }.get(form, f"its class {type(t).__name__} keeps its own slots, which a virtual twin cannot add")


def _slot_conflict(cls: type) -> bool:
    return any(k.__dict__.get("__slots__") for k in cls.__mro__ if k not in (torch.Tensor, torch.nn.Parameter,
                                                                              torch._C.TensorBase, object))


def _is_type(kind: str) -> property:
    return property(lambda self: self._td_device.type == kind)


class VirtualTensor(torch.Tensor):
    """A tensor whose device is a label; its values, if any, live in ``_td_elem`` (meta or cpu)."""

    # slots, not __dict__: the walker reads tensors' __dict__ (bnb keeps quant_state there), never these
    __slots__ = ("_td_elem", "_td_device", "_td_path", "_td_origin")
    _td_elem: torch.Tensor
    _td_device: torch.device
    _td_path: str | None
    _td_origin: Any  # a tensor made in the run: its ``origin.Made`` record (op, module, source paths), or None

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        return _DISPATCH[0](func, args, kwargs or {})

    device = property(lambda self: self._td_device)  # type: ignore[assignment]
    is_cuda, is_xpu, is_mps = _is_type("cuda"), _is_type("xpu"), _is_type("mps")  # type: ignore[assignment]
    is_cpu, is_meta = _is_type("cpu"), _is_type("meta")  # type: ignore[assignment]

    def get_device(self) -> int:  # type: ignore[override]
        return -1 if self._td_device.type == "cpu" else (self._td_device.index or 0)

    def _get_data(self) -> torch.Tensor:
        return make(VirtualTensor, self._td_elem, self._td_device, self._td_path)  # type: ignore[no-any-return]

    def _set_data(self, new: torch.Tensor) -> None:
        space = _STATE.space
        v: VirtualTensor = new if isinstance(new, VirtualTensor) else \
            make(VirtualTensor, space.inner_of(new) if space else new.detach(), new.device)
        with torch._C.DisableTorchFunction():  # (machinery: the run's mode passed it on as it is, a hop per weight)
            torch._C.TensorBase.data.__set__(self, v)  # type: ignore[attr-defined]  # shape/dtype on the C++ side
        self._td_elem, self._td_device = v._td_elem, v._td_device

    data = property(_get_data, _set_data)  # type: ignore[assignment]

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        from torchdoctor._virtual.shown import shown  # as torch prints it on that device, when it holds values

        return shown(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> VirtualTensor:
        with torch._C.DisableTorchFunction():
            elem = self._td_elem if self._td_elem.device.type == "meta" else self._td_elem.clone()
        new: VirtualTensor = make(type(self), elem, self._td_device, self._td_path, self.requires_grad)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            new.__dict__[k] = copy.deepcopy(v, memo)
        return new

    def __reduce_ex__(self, proto: Any) -> Any:
        # ``torch.save`` of a virtual tensor writes its values as a real CPU tensor (the file loads anywhere, as
        # the program's next step expects); values are as ``host_values`` gives them
        with torch._C.DisableTorchFunction():
            return host_values(self).__reduce_ex__(proto)

    def untyped_storage(self) -> Any:  # type: ignore[override]
        # safetensors looks for shared storage through it (a wrapper's own storage has no data): the values' one
        if self._td_elem.device.type == "cpu":
            with torch._C.DisableTorchFunction():
                return self._td_elem.untyped_storage()
        return super().untyped_storage()


def host_values(t: VirtualTensor, dtype: torch.dtype | None = None, memory_format: Any = None) -> torch.Tensor:
    """What a program takes back to the CPU from a virtual tensor: a real CPU tensor of its shape and dtype (or
    ``dtype``) holding the values the run computed (always, with ``data="cpu"``), or zeros where the run keeps no
    values (meta): the documented fill of docs/virtual.md."""
    elem, want = t._td_elem, dtype or t.dtype
    with torch._C.DisableTorchFunction():
        if elem.device.type == "meta":
            return torch.zeros(elem.shape, dtype=want)
        return elem.to(device=_CPU, dtype=want, memory_format=memory_format or torch.preserve_format, copy=True)


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
                    ns["__torch_function__"] = classmethod(_converting(tf))
                break
        become = cls.__dict__.get("cls_to_become")  # a lazy module's parameter becomes a virtual Parameter
        if isinstance(become, type):  # when materialized (``__class__`` assigned: the same layout)
            ns["cls_to_become"] = VirtualTensor if become is torch.Tensor else virtual_class(become)
        hit = _VCLASSES[cls] = type(f"Virtual{cls.__name__}", (VirtualTensor, cls), ns)
    return hit


def _converting(tf: Any) -> Any:
    """A subclass's ``__torch_function__`` that ends in torch's default one converts every result to its own
    class (``as_subclass``), which a virtual result already bound to ``VirtualTensor`` refuses ("Creating a new
    Tensor subclass ..."): then the op runs as a plain virtual op (values are not what a simulation checks)."""

    def __torch_function__(cls: type, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        try:
            return tf.__get__(None, cls)(func, types, args, kwargs)
        except RuntimeError as e:
            if "Creating a new Tensor subclass" not in str(e):
                raise
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    return __torch_function__


def held_by(t: Any) -> str | None:
    """The program's name (``ema.weight``) for a real operand no module of the run holds (``heldby``); asked only
    when a problem is recorded."""
    real = getattr(t, "_td_real", None)
    from torchdoctor._virtual.heldby import held_by as find
    if real is None:  # a virtual leaf no forward named (an EMA copy moved to another GPU): by the program's frames
        return find(t) if getattr(t, "_td_origin", None) is None else None
    from torchdoctor._virtual.deepheld import held_deep, library_move
    from torchdoctor._virtual.stackview import held_locally

    # a module's tensor (``ema.weight``), else an object's (``ema.shadow_params[0]``), else, moved by a library's
    # own line, one an object holds inside a list (an offloaded cache layer's ``cache.layers[1].keys``)
    origin = getattr(t, "_td_origin", None)
    return find(t) or held_locally(real, origin) or (held_deep(real, origin) if library_move(origin) else None)


def make(cls: type, elem: torch.Tensor, device: torch.device, path: str | None = None,
         requires_grad: bool = False) -> Any:
    """A ``cls`` wrapper (a ``VirtualTensor`` subclass) around ``elem``, labelled ``device``."""
    space = _STATE.space
    t: Any = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
        cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
        device=space.inner if space is not None else _META, requires_grad=requires_grad,
    )
    t._td_elem, t._td_device, t._td_path, t._td_origin = elem, device, path, None
    return t


def with_class_of(t: torch.Tensor, elem: torch.Tensor, device: torch.device, path: str | None) -> Any:
    """The virtual result of moving ``t``: a plain ``torch.Tensor`` subclass of the program's (a GGUF loader's
    tensor made with ``_make_subclass``, with its ``logical_shape`` and ``scale``) stays one, attributes kept, as
    torch's ``.to`` keeps it; parameters, wrapper subclasses (DTensor) and plain tensors become ``VirtualTensor``."""
    base = _KEPT_CLASS.get(type(t), _KEPT_CLASS)
    if base is _KEPT_CLASS:  # (a move of every weight asks: the answer is the class's, looked up once)
        base = _KEPT_CLASS[type(t)] = _kept_class(type(t))
    if base is None:
        return make(VirtualTensor, elem, device, path)
    out = make(virtual_class(base), elem, device, path)
    out.__dict__.update({k: v for k, v in getattr(t, "__dict__", {}).items() if not k.startswith("_td_")})
    return out


_KEPT_CLASS: dict[type, Any] = {}
_LAZY: Any = getattr(torch.nn.parameter, "UninitializedTensorMixin", ())  # a lazy module's parameters and buffers


def _kept_class(cls: type) -> type | None:
    """The program's own plain subclass a moved ``cls`` stays (``with_class_of``), or None for ``VirtualTensor``."""
    base = next((c for c in cls.__mro__ if not issubclass(c, VirtualTensor)), torch.Tensor) \
        if issubclass(cls, VirtualTensor) else cls
    if issubclass(base, _LAZY):  # a lazy module moved before its first call:
        return base  # still lazy on the device, as torch's move keeps it; its first call materializes it there
    if base is torch.Tensor or issubclass(base, torch.nn.Parameter) or not issubclass(base, torch.Tensor) or any(
            "__torch_dispatch__" in c.__dict__ for c in base.__mro__[:-3]):
        return None
    return base


def standin(t: VirtualTensor, anchor: Any) -> Any:
    """``t`` as if it had been moved (``anchor`` a device) or cast (a dtype): the twin a recorder lets an op go on
    with; it keeps the name and the provenance."""
    if isinstance(anchor, torch.device):
        new = make(VirtualTensor, t._td_elem, anchor, t._td_path)
    else:
        new = make(VirtualTensor, t._td_elem.to(anchor), t._td_device, t._td_path)
    new._td_origin = t._td_origin
    return new


def is_entry(t: Any) -> bool:
    """A tensor of the user's object (a weight, buffer, quant_state ...), not an input or an activation."""
    path = getattr(t, "_td_path", None)
    return isinstance(path, str) and bool(path) and not path.startswith(("input ", "kwarg "))

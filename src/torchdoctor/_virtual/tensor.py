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

import collections
import copy
import threading
import types
from collections.abc import Callable
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
        self.api: dict[tuple[int, str], Any] = {}  # this run's answers of the patched runtime APIs
        self.closed = False  # the run ended: threads it started see the real machine from now on
        self.grad = False  # the grad mode the run started in (threads it starts take it too)
        # copies of tensors no virtual twin can stand in for (nested, sparse, quantized ...) -> (path, why)
        self.foreign: dict[int, tuple[str, str]] = {}
        self.named: dict[int, tuple[torch.Tensor, str]] = {}  # real tensors a module-entry check named, by id
        self.relabelled: list[Any] = []  # weak references to real tensors given a device label by ``.data =``
        self.kernels: dict[Any, Any] = {}  # meta-kernel outputs by op and argument metadata (``kernels``)

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
                    ns["__torch_function__"] = classmethod(_converting(tf))
                break
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


# process state held by user objects: the copy shares it rather than failing to copy it
_SHARED = (type(threading.Lock()), type(threading.RLock()), threading.Thread, threading.Event, threading.Condition,
           types.ModuleType)
_COPYING: set[int] = set()  # threads inside virtual_copy (the deepcopy dispatch table is process-wide)
_SAVED: dict[type, Any] = {}  # the table's entries before the first of them started
_COPY_LOCK = threading.Lock()


def _copy_function(f: types.FunctionType, memo: dict[int, Any]) -> Any:
    """A closure copied with its cells: hook chains that replace ``module.forward`` with a closure over the module
    and the next forward (diffusers' ``HookRegistry``: layerwise casting, group offloading) would otherwise run the
    user's modules and hooks from inside the copy, and cast or move the user's weights. What cannot be copied is
    shared, as deepcopy's own ``functools.partial`` support would fail on it."""
    cells = f.__closure__
    if not cells or threading.get_ident() not in _COPYING:
        return f
    new_cells = tuple(types.CellType() for _ in cells)
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, new_cells)
    g.__kwdefaults__, g.__qualname__ = f.__kwdefaults__, f.__qualname__
    g.__dict__.update(f.__dict__)
    memo[id(f)] = g  # before the cells: a closure may reach itself
    for old, new in zip(cells, new_cells):
        try:
            value = old.cell_contents
        except ValueError:  # an empty cell (a name assigned later in the enclosing function)
            continue
        try:
            new.cell_contents = copy.deepcopy(value, memo)
        except Exception:
            new.cell_contents = value
    return g


def _copy_ordered_dict(x: Any, memo: dict[int, Any]) -> Any:
    """A plain ``OrderedDict`` copied as ``deepcopy`` would, without its reduce round trip: a module holds eleven
    (its hook tables), most of them empty, and these were a third of copying a large model."""
    if vars(x):  # attributes set on the instance: the general path keeps them
        return copy._reconstruct(x, memo, *x.__reduce_ex__(4))  # type: ignore[attr-defined]
    y: collections.OrderedDict[Any, Any] = collections.OrderedDict()
    memo[id(x)] = y
    for k, v in x.items():
        y[copy.deepcopy(k, memo)] = copy.deepcopy(v, memo)
    return y


def _copy_set(x: Any, memo: dict[int, Any]) -> Any:
    return set() if not x else {copy.deepcopy(v, memo) for v in x}  # as set's reduce does (a set holds no cycle)


_FAST_COPY = {collections.OrderedDict: _copy_ordered_dict, set: _copy_set}  # by exact type, as deepcopy looks up


def virtual_copy(obj: Any, tensors: list[tuple[torch.Tensor, torch.device, str]],
                 space: Space) -> tuple[Any, dict[int, Any]]:
    """A deep copy of ``obj`` in which each listed tensor is a virtual twin of a matching class (``Parameter``,
    ``Params4bit``): no weight bytes are copied and the copy shares nothing mutable with the user's objects."""
    memo: dict[int, Any] = {}
    made: list[tuple[torch.Tensor, Any]] = []
    foreign: list[tuple[torch.Tensor, str, str]] = []
    for t, device, path in tensors:
        if id(t) not in memo:
            why = unsupported_form(t)
            if why is not None:  # copied as it is (outside any mode); the run reports it where used or moved
                memo[id(t)] = _copy_foreign(t, memo, path, why)
                foreign.append((t, path, why))
                continue
            memo[id(t)] = v = make(virtual_class(type(t)), space.inner_of(t), device, path, t.requires_grad)
            made.append((t, v))
    memo[id(memo)] = [t for t, _ in made]  # keep-alive, as copy.deepcopy does
    dispatch = copy._deepcopy_dispatch  # type: ignore[attr-defined]
    with _COPY_LOCK:
        if not _COPYING:
            _SAVED.clear()
            _SAVED.update({tp: dispatch.get(tp) for tp in (*_SHARED, types.FunctionType, *_FAST_COPY)})
            dispatch.update({tp: copy._deepcopy_atomic for tp in _SHARED})  # type: ignore[attr-defined]
            dispatch.update(_FAST_COPY)
            dispatch[types.FunctionType] = _copy_function
        _COPYING.add(threading.get_ident())
    try:
        clone = copy.deepcopy(obj, memo)
    except Exception as exc:
        raise TypeError(f"simulate works on a deep copy, and {type(obj).__name__} could not be copied: "
                        f"{type(exc).__name__}: {exc}") from exc
    finally:
        with _COPY_LOCK:
            _COPYING.discard(threading.get_ident())
            if not _COPYING:  # the last copy running restores the table
                for tp, old in _SAVED.items():
                    if old is None:
                        dispatch.pop(tp, None)
                    else:
                        dispatch[tp] = old
    for t, v in made:  # library attributes of tensors (bnb: quant_state, module, blocksize, CB, SCB)
        for k, val in (getattr(t, "__dict__", None) or {}).items():
            v.__dict__[k] = copy.deepcopy(val, memo)
    for t, path, why in foreign:
        twin = memo.get(id(t))
        if isinstance(twin, torch.Tensor):
            space.foreign[id(twin)] = (path, why)
    return clone, memo


def _copy_foreign(t: torch.Tensor, memo: dict[int, Any], path: str, why: str) -> torch.Tensor:
    """A private copy of a tensor no twin stands in for, made outside every mode (strided nested tensors cannot be
    deep-copied at all: ``new_empty`` has no nested kernel, so they are cloned)."""
    from torchdoctor._walk.kinds import is_jagged_type

    with torch._C.DisableTorchFunction():
        d = getattr(t, "__dict__", {})
        if is_jagged_type(type(t)) and isinstance(d.get("_values"), torch.Tensor):
            # from its parts: torch's own clone/deepcopy of a jagged tensor rewrites the original's size caches
            lengths = d.get("_lengths")
            return torch.nested.nested_tensor_from_jagged(  # type: ignore[no-any-return]
                d["_values"].detach().clone(), d["_offsets"].clone(),
                lengths.clone() if isinstance(lengths, torch.Tensor) else None)
        try:
            return copy.deepcopy(t, memo)  # type: ignore[no-any-return]
        except Exception:
            pass
        try:
            c = t.detach().clone()
            return torch.nn.Parameter(c, t.requires_grad) if isinstance(t, torch.nn.Parameter) else c
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise TypeError(f"{path}: a {type(t).__name__} ({why}) could not be copied for the simulation: "
                            f"{type(exc).__name__}: {first}") from exc

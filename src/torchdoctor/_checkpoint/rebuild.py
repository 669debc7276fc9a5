"""Stand-ins for the globals a ``torch.save`` pickle may name: each builds a record (:class:`TensorStub`, a
storage reference, a plain container) from its arguments and runs nothing else. Torch-free: the table is built
from names (:mod:`torchdoctor._checkpoint.dtypes`, :mod:`torchdoctor._checkpoint.names`).
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from torchdoctor._checkpoint.dtypes import DTYPES, STORAGE_DTYPES, UINT8, DType
from torchdoctor._checkpoint.known import DTENSOR, NJT_REBUILD
from torchdoctor._checkpoint.views import I64, check_view
from torchdoctor._checkpoint.stubs import (
    Marker,
    Placeholder,
    Safe,
    StorageRef,
    StorageType,
    TensorStub,
    placeholder_class,
    refuse,
)

__all__ = ["Size", "complex_from", "safe_table"]


def _stub(storage: Any, offset: Any, size: Any, stride: Any, dtype: DType | None = None) -> Any:
    if isinstance(storage, Placeholder):  # keep walking into it: it may hide the globals to report
        return placeholder_class("torch._utils._rebuild_tensor")(storage)
    if not isinstance(storage, StorageRef):
        raise pickle.UnpicklingError("tensor rebuilt from something that is not a storage")
    dtype = dtype or storage.dtype
    shape, strides, start = check_view(size, stride, offset, dtype.itemsize, storage.nbytes)
    return TensorStub(storage, start, shape, strides, dtype, storage.location)


def _rebuild_v2(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> TensorStub:
    if type(storage) is StorageRef:  # _stub inlined: one call less per tensor of a state dict
        dtype = storage.dtype
        shape, strides, start = check_view(size, stride, offset, dtype.itemsize, storage.numel * dtype.itemsize)
        return TensorStub(storage, start, shape, strides, dtype, storage.location)
    return _stub(storage, offset, size, stride)  # type: ignore[no-any-return]


def _rebuild_v3(storage: Any, offset: Any, size: Any, stride: Any, rg: Any, hooks: Any, dtype: Any, *rest: Any) -> Any:
    return _stub(storage, offset, size, stride, dtype if isinstance(dtype, DType) else None)


def _rebuild_parameter(data: Any, *rest: Any) -> Any:
    if isinstance(data, TensorStub):
        data.parameter = True
        if len(rest) >= 3 and isinstance(rest[2], dict):  # _rebuild_parameter_with_state
            data.attrs.update({str(k): v for k, v in rest[2].items()})
    return data


def _rebuild_from_type(func: Any, new_type: Any, args: Any, state: Any = None) -> Any:
    is_record = isinstance(func, type) and issubclass(func, Placeholder)  # e.g. torch's _rebuild_njt: recorded
    if not (isinstance(func, Safe) or is_record) or not isinstance(args, tuple):
        raise pickle.UnpicklingError("_rebuild_from_type_v2 with an unexpected rebuild function")
    if is_record and func._td_global == NJT_REBUILD and args and isinstance(args[0], dict):
        values = args[0].get("values")  # a nested jagged tensor is one tensor: its packed values, internals hidden
        if isinstance(values, TensorStub):
            values.subclass = "torch.nested._internal.nested_tensor.NestedTensor"
            return values
    obj = func(*args)
    if isinstance(obj, TensorStub):
        if isinstance(new_type, type) and issubclass(new_type, Placeholder):
            obj.subclass = new_type._td_global
        if isinstance(state, tuple) and len(state) == 2 and all(p is None or isinstance(p, dict) for p in state):
            state = {**(state[0] or {}), **(state[1] or {})}  # (dict, slots): DTensor keeps its fields in slots
        if isinstance(state, dict):
            obj.attrs.update({str(k): v for k, v in state.items()})
        local = obj.attrs.get("_local_tensor")
        if obj.subclass == DTENSOR and isinstance(local, TensorStub):  # a rank's shard: its bytes are the local
            del obj.attrs["_local_tensor"]  # tensor's; shape and dtype stay the global tensor's
            obj.storage, obj.offset, obj.stride, obj.location = local.storage, local.offset, local.stride, local.location
            obj.attrs["__local_shape__"] = local.shape
    return obj



def _rebuild_no_storage(dtype: Any, size: Any, stride: Any, *rest: Any) -> TensorStub:
    if not isinstance(dtype, DType):
        raise pickle.UnpicklingError("meta tensor without a dtype")
    shape, strides, _ = check_view(size, stride, 0, dtype.itemsize, None)
    return TensorStub(None, 0, shape, strides, dtype, "meta")


def _rebuild_wrapper_subclass(
    cls: Any, dtype: Any, size: Any, stride: Any, offset: Any, layout: Any, device: Any, *rest: Any
) -> TensorStub:
    stub = _rebuild_no_storage(dtype, size, stride)
    stub.location = str(device)
    if isinstance(cls, type) and issubclass(cls, Placeholder):
        stub.subclass = cls._td_global
    return stub


def _rebuild_on_device(data: Any, dtype: Any, device: Any, *rest: Any) -> Any:
    if isinstance(data, TensorStub):  # data was saved on cpu, rebuilt on ``device`` at load time
        data.location = str(device)
    return data


def _packed(name: str, layout: str, data: Any, *rest: Any) -> Any:
    """A sparse or strided-nested tensor is one tensor: its values buffer (the last tensor of its parts) with
    the dense size when the record has one; indices and offsets are internals, not listed."""
    parts = data if isinstance(data, tuple) else (data, *rest)
    stubs = [p for p in parts if isinstance(p, TensorStub)]
    if not stubs:  # keep walking into it: it may hide the globals to report
        return placeholder_class(name)(data, *rest)
    values = stubs[-1] if layout != "nested" else stubs[0]
    size = next((p for p in parts if isinstance(p, Size)), None)
    return TensorStub(values.storage, values.offset, tuple(size) if size is not None else values.shape,
                      values.stride, values.dtype, values.location, subclass=f"{layout} tensor")


class Size(tuple):  # type: ignore[type-arg]
    """``torch.Size`` as the pickle built it: the dense size of a sparse tensor record."""


class Named(str):
    """A torch constant used as a value (a memory format, a layout, a qscheme): its name."""


def _device(*args: Any) -> str:
    """``torch.device(...)`` as its text (``cuda:1``): what a saved location reads as."""
    if not all(type(a) in (str, int) for a in args) or not 1 <= len(args) <= 2:
        raise pickle.UnpicklingError("torch.device with unexpected arguments")
    if len(args) == 2:
        return f"{args[0]}:{args[1]}"
    return str(args[0])


def _size(dims: Any = ()) -> Size:
    if not isinstance(dims, (tuple, list)) or not all(type(d) is int and -I64 <= d < I64 for d in dims):
        raise pickle.UnpicklingError("torch.Size with unexpected arguments (not a list of 64-bit integers)")
    return Size(dims)


def _encode(text: Any, encoding: Any = "latin1") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode with unexpected arguments")
    return text.encode("latin1")


def _bytes_like(kind: type) -> Callable[..., Any]:
    def make(data: Any = b"", *rest: Any) -> Any:
        if isinstance(data, int):  # bytes(10**12) would be a memory bomb
            raise pickle.UnpicklingError(f"{kind.__name__} from an int")
        if isinstance(data, str):
            return kind(data.encode("latin1"))
        return kind(data)

    return make


def complex_from(hashes: Any, re: Any = 0.0, im: Any = 0.0) -> complex:
    value = complex(float(re), float(im))
    if hashes is not None and not hashes.add(value):  # complex(k * 1000003, -k) all share one hash
        raise pickle.UnpicklingError("too many complex numbers sharing one hash value")
    return value


def _collection(kind: Callable[..., Any]) -> Callable[..., Any]:
    def make(items: Any = (), *rest: Any) -> Any:
        if not isinstance(items, (list, tuple, set, frozenset, dict)):
            raise pickle.UnpicklingError("collection built from something that is not a collection")
        return kind(items)

    return make


def safe_table() -> dict[str, Any]:
    u = "torch._utils."
    table: dict[str, Any] = {
        u + "_rebuild_tensor": _rebuild_v2,
        u + "_rebuild_tensor_v2": _rebuild_v2,
        u + "_rebuild_tensor_v3": _rebuild_v3,
        u + "_rebuild_parameter": _rebuild_parameter,
        u + "_rebuild_parameter_with_state": _rebuild_parameter,
        u + "_rebuild_qtensor": _rebuild_v2,
        u + "_rebuild_meta_tensor_no_storage": _rebuild_no_storage,
        u + "_rebuild_wrapper_subclass": _rebuild_wrapper_subclass,
        u + "_rebuild_device_tensor_from_cpu_tensor": _rebuild_on_device,
        u + "_rebuild_sparse_tensor": lambda layout, data, *r: _packed(u + "_rebuild_sparse_tensor", str(layout), data),
        u + "_rebuild_nested_tensor": lambda *parts: _packed(u + "_rebuild_nested_tensor", "nested", parts),
        "torch._tensor._rebuild_from_type_v2": _rebuild_from_type,
        "torch._tensor._rebuild_from_type": _rebuild_from_type,
        "torch.serialization._get_layout": lambda name: str(name),
        "torch.device": _device,
        "torch.Size": _size,
        "collections.OrderedDict": _collection(OrderedDict),
        "collections.defaultdict": lambda *a: {},
        "collections.Counter": _collection(dict),
        "builtins.set": _collection(set),
        "builtins.frozenset": _collection(frozenset),
        "builtins.list": _collection(list),
        "builtins.tuple": _collection(tuple),
        "builtins.dict": _collection(dict),
        "builtins.slice": slice,
        "builtins.bytes": _bytes_like(bytes),
        "builtins.bytearray": _bytes_like(bytearray),
        "_codecs.encode": _encode,
    }
    safe: dict[str, Any] = {name: Safe(name, fn) for name, fn in table.items()}
    for name in ("torch.Tensor", "torch._tensor.Tensor", "torch.nn.parameter.Parameter", "torch.nn.parameter.Buffer"):
        safe[name] = Marker(name, refuse(name))
    for storage_name, dtype in STORAGE_DTYPES.items():
        for module in ("torch", "torch.cuda"):
            safe[f"{module}.{storage_name}"] = StorageType(f"{module}.{storage_name}", dtype)
    for name in ("torch.UntypedStorage", "torch.storage.UntypedStorage", "torch.storage.TypedStorage"):
        safe[name] = StorageType(name, UINT8)
    for dtype_name, dtype in DTYPES.items():  # dtypes, memory formats, layouts and qschemes are plain values
        safe[f"torch.{dtype_name}"] = dtype
    for const in _CONSTANTS:
        safe[f"torch.{const}"] = Named(f"torch.{const}")
    return safe


_CONSTANTS = (
    "contiguous_format", "channels_last", "channels_last_3d", "preserve_format", "strided", "sparse_coo",
    "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn", "jagged", "per_tensor_affine",
    "per_channel_affine", "per_tensor_symmetric", "per_channel_symmetric", "per_channel_affine_float_qparams",
)

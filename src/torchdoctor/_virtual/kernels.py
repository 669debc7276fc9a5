"""What torch's meta kernels answered, remembered for the whole process: the output sizes, strides and dtypes of an
aten op for given argument metadata.

Most meta kernels are Python (``torch._refs``, ``torch._meta_registrations``) and cost 0.5-6 ms an op, while a
model repeats the same ops on the same shapes in every layer. FakeTensorMode caches for the same reason; like it,
only ops whose outputs are new tensors with metadata fixed by the arguments' metadata are remembered: aten ops
with no alias or mutation in their schema (no views, no in-place, no ``out=``), no data-dependent output shape,
every tensor argument a plain meta tensor, every other argument a plain value. A kernel that raised is never
remembered, so a refusal is met again on the next call. The rules still see every op: only the kernel is skipped.

The table is process-wide (``TABLE``): a second ``simulate`` of the same model, or of another with the same layer
shapes, meets every kernel answered before, which is what makes a shallow model cheap (a run of 4 blocks paid the
Python kernels of every op once per call). Nothing in a key depends on the run (no device of the virtual machine,
no path, no hook): a meta kernel sees only metadata, and the key is all of it, so an answer holds in any run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES as _FLOAT8

ENABLED = True  # tests turn it off to compare runs with and without it
# entries kept; past it the oldest half goes (a long generate loop grows its shapes each step, and a process that
# simulates many models must not grow without end). 20k entries of a few tuples each: a few MB at most.
LIMIT = 20_000
TABLE: dict[Any, Any] = {}  # the process-wide answers: key -> output metadata
_META = torch.device("meta")
_VALUES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
                     torch.layout})
_REFUSE_TAGS = frozenset(getattr(torch.Tag, n) for n in ("dynamic_output_shape", "data_dependent_output",
                                                          "inplace_view") if hasattr(torch.Tag, n))
_RETURNS = frozenset({"Tensor", "Tensor?", "List[Tensor]"})
_OK: dict[Any, bool] = {}
_MISS = object()
_TENSOR, _STRIDED = torch.Tensor, torch.strided


def cacheable(func: Any) -> bool:
    hit = _OK.get(func)
    if hit is None:
        schema = getattr(func, "_schema", None)
        hit = _OK[func] = schema is not None and schema.name.startswith("aten::") and not schema.is_mutable \
            and bool(schema.returns) and all(a.alias_info is None for a in schema.arguments) \
            and all(r.alias_info is None and str(r.type) in _RETURNS for r in schema.returns) \
            and not _REFUSE_TAGS.intersection(getattr(func, "tags", ()))
    return hit


def _part(x: Any, parts: list[Any]) -> bool:
    tp = type(x)
    if tp is torch.Tensor:
        if not x.is_meta or x.layout != torch.strided:  # (``is_meta``: no device object made per argument)
            return False
        parts.append((x.shape, x.stride(), x.dtype, x.storage_offset()))
        return True
    if tp in _VALUES:
        parts.append((tp, x))
        return True
    if tp is list or tp is tuple:
        parts.append((tp, len(x)))
        return all(_part(y, parts) for y in x)
    return False


def key(func: Any, args: list[Any], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The kernel's inputs as it can see them, or None when something in them is not a plain value (``func`` is
    ``cacheable``)."""
    parts: list[Any] = [func, torch.get_default_dtype()]
    for a in args:
        if type(a) is _TENSOR:  # (``_part``'s first case, inline: most arguments are tensors)
            if not a.is_meta or a.layout != _STRIDED:
                return None
            parts.append((a.shape, a.stride(), a.dtype, a.storage_offset()))
        elif not _part(a, parts):
            return None
    for k, v in kwargs.items():
        parts.append(k)
        if not _part(v, parts):
            return None
    return tuple(parts)


def virtual_key(func: Any, args: Any, kwargs: dict[str, Any], wrapper: type) -> tuple[Any, ...] | None:
    """``key`` of the arguments the op path would hand the kernel, read from the virtual wrappers themselves
    (``args`` and ``kwargs`` as the op was called; ``wrapper``: their class, each holding its tensor in ``_td_elem``):
    what ``key`` gives once they are unwrapped, without unwrapping them. None when a wrapper holds anything but a
    meta tensor (the op path then unwraps and asks ``key``)."""
    parts: list[Any] = [func, torch.get_default_dtype()]
    for a in args:
        if not _virtual_part(a, parts, wrapper):
            return None
    for k, v in kwargs.items():
        parts.append(k)
        if not _virtual_part(v, parts, wrapper):
            return None
    return tuple(parts)


def _virtual_part(x: Any, parts: list[Any], wrapper: type) -> bool:
    if isinstance(x, wrapper):
        e = x._td_elem  # type: ignore[attr-defined]
        if type(e) is not _TENSOR or not e.is_meta or e.layout != _STRIDED:
            return False
        parts.append((e.shape, e.stride(), e.dtype, e.storage_offset()))
        return True
    if (type(x) is list or type(x) is tuple) and any(isinstance(y, wrapper) for y in x):
        parts.append((type(x), len(x)))  # (the op path unwraps a list that holds a wrapper itself, so does this)
        return all(_virtual_part(y, parts, wrapper) for y in x)
    return _part(x, parts)


def _shape_of(out: Any, seen: set[int]) -> Any:
    if out is None:
        return None
    if type(out) is torch.Tensor and out.is_meta and out.storage_offset() == 0 and id(out) not in seen:
        seen.add(id(out))
        return (out.shape, out.stride(), out.dtype)
    return _MISS


def clear() -> None:
    """Forget every answer (tests compare cold and warm runs)."""
    TABLE.clear()


def _bounded(table: dict[Any, Any]) -> None:
    if len(table) >= LIMIT:  # insertion order: the oldest answers go first
        for k in list(itertools.islice(table, LIMIT // 2)):
            table.pop(k, None)  # (two threads simulating may both trim the process table)


def remember(table: dict[Any, Any], k: tuple[Any, ...], out: Any) -> None:
    """Keep ``out``'s metadata under ``k`` when it is fresh meta tensors only (one tensor, or a tuple/list), in
    ``table`` and in the process-wide ``TABLE``. A run that still looks its answers up in a table of its own
    (``Space.kernels``) has it filled from ``TABLE`` at its first miss, so that it meets the answers of earlier
    runs from then on; a run that looks them up in ``TABLE`` itself needs no filling."""
    seen: set[int] = set()
    if isinstance(out, (tuple, list)):
        entry: Any = (type(out), tuple(_shape_of(o, seen) for o in out))
        if any(e is _MISS for e in entry[1]):
            return
    else:
        entry = _shape_of(out, seen)
        if entry is _MISS or entry is None:
            return
    if table is not TABLE:
        if not table and TABLE:
            table.update(TABLE)
        _bounded(table)
        table[k] = entry
    _bounded(TABLE)
    TABLE[k] = entry


def _new(meta: Any) -> Any:
    return None if meta is None else torch.empty_strided(meta[0], meta[1], dtype=meta[2], device=_META)


def recall(entry: Any) -> Any:
    """Fresh meta outputs like the remembered ones."""
    if type(entry[0]) is type:
        return entry[0](_new(m) for m in entry[1])
    return _new(entry)


def _grouped_mm(func: Any, a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    # the meta kernel mirrors the CUDA bf16 fast path only; eager CUDA falls back to a loop for other dtypes
    if a.dtype == torch.bfloat16 or a.dtype != b.dtype or kwargs.get("out_dtype") not in (None, a.dtype):
        return func(a, b, *args, **kwargs)  # type: ignore[no-any-return]
    bf = torch.bfloat16
    rest = [x.to(bf) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in args]
    return func(a.to(bf), b.to(bf), *rest, **kwargs).to(a.dtype)  # type: ignore[no-any-return]


# ops whose meta kernel is stricter than the device kernels it stands for, by overload packet
OVERRIDES: dict[Any, Callable[..., Any]] = {getattr(torch.ops.aten, n): _grouped_mm for n in ("_grouped_mm",)
                                            if hasattr(torch.ops.aten, n)}
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


def on_one_thread(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call`` with torch's intra-op threads set to one for its duration (this thread's setting, put back after):
    a kernel on the few values a meta run keeps (rotary tables, masks, ids; at most ``SMALL`` elements) gains
    nothing from a thread team, and a team's start and its workers' spin after it cost a CPU-bound host far more
    than the kernel (a float64 ``sin`` of 9k elements: 17 us on one thread, 22-28 ms on two of a busy 2-core
    machine, the whole of a shallow model's simulate above its meta forward)."""
    n = torch.get_num_threads()
    if n == 1:
        return call(*args, **kwargs)
    torch.set_num_threads(1)
    try:
        return call(*args, **kwargs)
    finally:
        torch.set_num_threads(n)


def _histc(func: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    if x.is_floating_point():
        return None
    return func(x.float(), *args, **kwargs).to(x.dtype)  # CUDA counts integers; the CPU kernel refuses them


# ops the device computes in dtypes the CPU kernel (or the meta one) refuses: computed another way, same result
_DEVICE_HAS: dict[str, tuple[tuple[str, ...], Any]] = {"histc": (("cuda",), _histc)}


def device_has(func: Any, args: Any, kwargs: dict[str, Any], vtype: str, exc: BaseException | None = None,
               virtual: Any = None) -> Any:
    """The result of ``func`` as the ``vtype`` device computes it where the CPU kernel refused it, or None; an aten
    op with no meta kernel (``exc`` says so) met on meta operands is run on the values the run holds (``on_zeros``:
    ``virtual``, the op's virtual arguments, hold them where they are small)."""
    if exc is not None and "not implemented for 'Float8" in str(exc):
        return float8_upcast(func, args, kwargs)
    hit = _DEVICE_HAS.get(getattr(getattr(func, "overloadpacket", None), "__name__", ""))
    if hit is None:
        return on_zeros(func, virtual or args, kwargs) if "no fake impl or Meta kernel" in str(exc) else None
    if hit is None or vtype not in hit[0] or not args or not isinstance(args[0], torch.Tensor):
        return None
    try:
        return hit[1](func, *args, **kwargs)
    except (NotImplementedError, RuntimeError, TypeError):
        return None


def float8_upcast(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """``func`` on float8 operands this CPU build has no kernel for (``"add_stub" not implemented for
    'Float8_e4m3fn'``), computed in float32 and its floating results stored back in the float8 dtype: what the op
    gives where a kernel exists, and what the run goes on with where the device has none either (the rules said so
    before the op ran, from the device's kernel table, never this CPU's). An in-place op writes its first argument.
    None when it still fails."""
    low = next((x.dtype for a in (*args, *kwargs.values()) for x in (a if isinstance(a, (list, tuple)) else (a,))
                if isinstance(x, torch.Tensor) and x.dtype in _FLOAT8), None)
    if kwargs.get("dtype") in _FLOAT8:  # a factory asked for float8 (``torch.randn(..., dtype=float8)``)
        low, kwargs = kwargs["dtype"], {**kwargs, "dtype": torch.float32}
    if low is None:
        return None

    def up(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.float() if x.dtype in _FLOAT8 else x
        return type(x)(up(y) for y in x) if isinstance(x, (list, tuple)) else x

    def down(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            return o.to(low) if o.dtype == torch.float32 else o
        return type(o)(down(y) for y in o) if isinstance(o, (list, tuple)) else o

    try:
        out = down(func(*(up(a) for a in args), **{k: up(v) for k, v in kwargs.items()}))
        schema = getattr(func, "_schema", None)
        first = schema.arguments[0] if schema is not None and schema.arguments else None
        if first is not None and first.alias_info is not None and first.alias_info.is_write and args \
                and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor):
            return args[0].copy_(out)  # in place: the program holds its first argument
        return out
    except (NotImplementedError, RuntimeError, TypeError, ValueError):
        return None


ZEROS_LIMIT = 1 << 24  # elements of meta operands an op without a meta kernel is run on as zeros, at most


def on_zeros(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """An aten op with no meta kernel (``aten._ctc_loss``: the device has its kernel, meta has none) run by the CPU
    kernel on zeros of its meta operands, its outputs as meta tensors: their metadata is the kernel's answer (the
    loss's shape; a length-sized buffer sized by the zeros is only ever read by the op's own backward). None for a
    custom op, operands past ``ZEROS_LIMIT``, or a kernel that refuses zeros."""
    if not getattr(getattr(func, "_schema", None), "name", "").startswith("aten::"):  # a custom op: kernel unknown
        return None
    flat = [getattr(x, "_td_elem", x) for a in (*args, *kwargs.values())
            for x in (a if isinstance(a, (list, tuple)) else (a,))]
    metas = [x.numel() for x in flat if isinstance(x, torch.Tensor) and x.is_meta]
    if not metas or sum(metas) > ZEROS_LIMIT:
        return None

    def real(x: Any) -> Any:  # the values the run holds (a small tensor's: lengths, targets), else zeros
        x = getattr(x, "_td_elem", x)
        if isinstance(x, torch.Tensor):
            return torch.zeros(x.shape, dtype=x.dtype) if x.is_meta else x
        return type(x)(real(y) for y in x) if isinstance(x, (list, tuple)) else x

    def meta(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            return torch.empty_strided(o.size(), o.stride(), dtype=o.dtype, device=_META)
        return type(o)(meta(y) for y in o) if isinstance(o, (list, tuple)) else o

    try:
        return meta(func(*(real(a) for a in args), **{k: real(v) for k, v in kwargs.items()}))
    except (NotImplementedError, RuntimeError, TypeError, ValueError, IndexError):
        return None

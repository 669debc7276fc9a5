"""The op path of virtual tensors: every aten op with a virtual argument is checked, run on the inner tensors and
its outputs labelled.

The active ``Space``'s hooks see each op first (the strict rules); plain tensors joining an op become virtual;
autocast for the virtual type is emulated (real autocast keys follow the C++ device, which is meta); a kernel that
refuses its arguments' dtypes, as the real device would, reaches the hooks as ``refused`` with the culprits.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from torchdoctor._placement import tensor_device
from torchdoctor._virtual import kernels
from torchdoctor._virtual import tensor as V
from torchdoctor._virtual.origin import made_from
from torchdoctor._virtual.prechecks import CONV_ENTRY, SDPA_ENTRY, conv_precheck, sdpa_precheck  # noqa: F401
from torchdoctor._virtual.tensor import _STATE, Space, VirtualTensor, make

aten = torch.ops.aten
_CPU = torch.device("cpu")
_WIDE = (torch.float64, torch.complex128)
_MOVES = (aten._to_copy, aten.copy_, aten.copy)  # a move or cast: the hooks' ``moving`` names it
_META = torch.device("meta")


def plain(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and not isinstance(x, VirtualTensor)


def lift_all(items: Any, space: Space | None, follow: torch.device | None) -> list[Any]:
    """Plain tensors in one level of ``items`` (and lists) become virtual. With ``follow``, tensors a C++ composite
    made from a wrapper's options (on the inner device) belong to the op and take that label; others keep their
    real device and are copied (they belong to someone else)."""

    def one(x: Any) -> Any:
        if not plain(x):
            return x
        if space is not None and id(x) in space.foreign:
            foreign(space, x)
        kept = space.real_record(x) if space is not None and space.real else None  # the run's (a saved CPU copy)
        if follow is not None and (x.device.type == "meta" or space is None or kept is None and x.device == space.inner):
            return make(VirtualTensor, x, follow)
        if space is None:
            return make(VirtualTensor, x, tensor_device(x))
        hit = space.named.get(id(x))
        # else a plain attribute of the running module (one a hook's onload never moves: ``self.scale``)
        v = make(VirtualTensor, space.inner_of(x), tensor_device(x), hit[1] if hit is not None and hit[0] is x
                 else kept[0] if kept is not None and kept[0] is not None else space.hooks.attribute_of(x, kept))
        if kept is not None:
            v._td_origin = kept[1]
        if hit is None and v._td_path is None and (kept is None or space.hooks.library_made(kept[1])):
            v._td_real = x  # no name yet: a recorded problem asks the program's frames for one (``heldby``)
        return v

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
    space = V.current_space()
    if dev is not None and torch.device(dev) != (space.inner if space is not None else _META):
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


def _pairs(before: Any, after: Any, back: dict[int, VirtualTensor]) -> None:
    """Which original argument each replaced one stands for (an in-place op returns the original)."""
    for b, a in zip(before, after):
        if a is not b and isinstance(a, VirtualTensor) and isinstance(b, VirtualTensor):
            back[id(a)] = back.get(id(b), b)
        elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and a is not b:
            _pairs(b, a, back)


def dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with torch._C.DisableTorchFunction():  # VirtualMode is for the user's Python, not for this machinery
        if _INFERENCE() and func.is_view:  # a view under inference_mode: its wrapper is made as a normal tensor, as
            with torch.inference_mode(False):  # torch makes a view of one (autograd then sets its version counter,
                return _dispatch_op(func, args, kwargs)  # which an inference tensor refuses)
        return _dispatch_op(func, args, kwargs)


_INFERENCE = torch.is_inference_mode_enabled


V._DISPATCH[:] = [dispatch]


def foreign(space: Space, t: torch.Tensor) -> None:
    """A copied tensor no virtual twin stands in for is used or moved: the hooks hear of it, by path."""
    path, why = space.foreign.get(id(t), (None, "it cannot be simulated"))
    from torchdoctor._placement import compact
    from torchdoctor._walk.kinds import describe

    shape = describe(t)[0]
    what = f"{path or 'a tensor'} {compact(t.dtype, shape, t.device)}"
    space.hooks.unsupported(path, what, why)
    raise TypeError(f"{what} cannot be simulated: {why}")


_INFO: dict[int, tuple[Any, ...]] = {}


def _info(func: Any) -> tuple[Any, ...]:
    """What the op path needs to know about ``func``, looked up once: (func, runs without its device, its meta
    kernel's outputs can be remembered, a result keeps its argument's path, meta override, autocast list)."""
    hit = _INFO.get(id(func))
    if hit is None:  # keyed by id (OpOverload hashes in Python); the tuple keeps ``func`` alive
        packet = func.overloadpacket
        hit = _INFO[id(func)] = (func, kernels.has_fake(func), kernels.cacheable(func),
                                 getattr(func, "is_view", False) or packet in _KEEP_PATH, kernels.OVERRIDES.get(packet),
                                 torch.float32 if packet in _AUTOCAST_FP32 else None, packet in _AUTOCAST_LOW)
    return hit


def _any_plain(args: Any, kwargs: dict[str, Any]) -> bool:
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, torch.Tensor):
            if not isinstance(a, VirtualTensor):
                return True
        elif isinstance(a, (list, tuple)) and any(plain(x) for x in a):
            return True
    return False


def _dispatch_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    space = _STATE.space  # (``V.current_space()``, without a call per op)
    _, fake, cacheable, keep_path, override, fp32, low = _info(func)
    if space is not None and not fake:  # even with CPU values: its device kernel is unknown here
        space.hooks.failed(str(func), None, "it is a custom op with no fake/meta kernel (register_fake), so "
                                            "it cannot run without the hardware")
    largs: Sequence[Any] = args  # (a tuple, or the list made when arguments change; never mutated)
    if _any_plain(args, kwargs):
        follow = out_device(args, kwargs)
        largs = lift_all(args, space, follow)
        if kwargs and any(plain(v) for v in kwargs.values()):
            kwargs = dict(zip(kwargs, lift_all(kwargs.values(), space, follow)))
    back: dict[int, VirtualTensor] = {}
    if space is not None:
        space.ops += 1
        if space.autocast is not None and (low or fp32 is not None):  # autocast casts before the kernel checks
            cast = autocast_args(largs, space.vtype, space.autocast if low else fp32)
            _pairs(largs, cast, back)
            largs = cast
        given = largs if type(largs) is tuple else tuple(largs)
        checked, kwargs = space.hooks.check(func, given, kwargs)
        if low:  # what the run computed in, autocast and per-call casts included (``origin.ran_as_asked``)
            d = next((a.dtype for a in checked if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
            # weighed by its largest model tensor: a low-rank branch kept float32 by design (peft's LoRA over an
            # fp16 base) never outvotes the layers it adapts; an op on activations alone counts once
            size = max((a.numel() for a in checked if getattr(a, "_td_path", None) is not None), default=1)
            space.computed[d] = space.computed.get(d, 0) + size
        if checked is not given:  # (the same tuple back: nothing was replaced)
            _pairs(given, checked, back)
        largs = checked
    ts, on_meta = _virtuals(largs, kwargs)  # the virtual arguments, once: device, meta-ness, provenance
    dev = _device_of_outputs(ts, kwargs, space)
    first = largs[0] if largs else None
    path = first._td_path if keep_path and isinstance(first, VirtualTensor) else None
    if on_meta and cacheable and override is None and space is not None and kernels.ENABLED:
        # an answer the table holds, found from the wrappers before any is unwrapped (most ops of a forward)
        hit = space.kernels.get(kernels.virtual_key(func, largs, kwargs, VirtualTensor))
        if hit is not None and type(hit[0]) is not type:
            return _answered(hit, dev, path, space, func, ts, kwargs)
    owner: dict[int, VirtualTensor] = {}
    uargs = [_unwrap(a, on_meta, owner, back) if isinstance(a, _UNWRAPPED) else a for a in largs]
    ukwargs = {k: _unwrap(v, on_meta, owner, back) for k, v in kwargs.items()} if kwargs else {}
    if not on_meta:
        override = None
    known = kernels.key(func, uargs, ukwargs) if on_meta and cacheable and space is not None and override is None \
        and kernels.ENABLED else None
    hit = space.kernels.get(known) if known is not None else None  # type: ignore[union-attr]
    if hit is not None and type(hit[0]) is not type and space is not None:  # one fresh tensor, as answered before
        return _answered(hit, dev, path, space, func, ts, ukwargs)  # (a wrapper holding a small real tensor)
    try:
        if hit is not None:
            out = kernels.recall(hit)
        elif not on_meta and space is not None and space.data == "meta":  # the few values a meta run keeps
            out = kernels.on_one_thread(func, *uargs, **ukwargs)
        else:
            out = override(func, *uargs, **ukwargs) if override is not None else func(*uargs, **ukwargs)
            if known is not None:
                kernels.remember(space.kernels, known, out)  # type: ignore[union-attr]
    except (NotImplementedError, RuntimeError, TypeError) as exc:
        if space is None:
            raise
        out = kernels.device_has(func, uargs, ukwargs, space.vtype, exc, largs)  # the device has it, not the CPU
        retry = _refused(space, func, largs, uargs, ukwargs, owner, exc) if out is None else None
        if out is None and retry is None:
            space.hooks.failed(str(func), exc)
            raise
        try:
            if retry is not None:
                uargs, ukwargs = retry
                out = override(func, *uargs, **ukwargs) if override is not None else func(*uargs, **ukwargs)
        except (NotImplementedError, RuntimeError, TypeError) as again:
            space.hooks.failed(str(func), again)
            raise again from exc
    return _labelled(_wrap(out, dev, owner, path), space, func, ts, path, ukwargs)


def _answered(hit: tuple[Any, ...], dev: torch.device, path: str | None, space: Space, func: Any,
              ts: list[VirtualTensor], ukwargs: dict[str, Any]) -> Any:
    """The op's one output from the kernel table's answer: a fresh meta tensor and its wrapper made from the
    remembered size, stride and dtype (as ``kernels.recall`` then ``_wrap`` make them, without reading them back)."""
    size, stride, dtype = hit
    t: Any = _WRAPPER(VirtualTensor, size, strides=stride, storage_offset=0, dtype=dtype, device=space.inner,
                      requires_grad=False)
    t._td_elem, t._td_device, t._td_path, t._td_origin = \
        _EMPTY(size, stride, dtype=dtype, device=_META), dev, path, None
    return _labelled(t, space, func, ts, path, ukwargs)


_WRAPPER = torch.Tensor._make_wrapper_subclass  # type: ignore[attr-defined]
_EMPTY = torch.empty_strided


def _labelled(wrapped: Any, space: Space | None, func: Any, ts: list[VirtualTensor], path: str | None,
              ukwargs: dict[str, Any]) -> Any:
    """The op's wrapped outputs, told to the hooks when they are float64 / complex128 made from narrower operands,
    and each given its provenance record."""
    if space is not None and isinstance(wrapped, VirtualTensor) and wrapped.dtype in _WIDE \
            and func.overloadpacket not in _MOVES and all(t.dtype != wrapped.dtype for t in ts):
        # an op that makes a float64 / complex128 result (sum(dtype=), new_zeros(dtype=), zeros_like(dtype=))
        space.hooks.creating(func.overloadpacket.__name__, wrapped._td_device, {"dtype": wrapped.dtype})
    if space is not None and path is None:
        # (integer results too: position_ids built by torch.arange(n).expand(...) name the factory call)
        # provenance: a result records the op, its module and the named tensors it took its dtype and device from
        # (or the made tensor it came from), so a problem far downstream names where its float32 or its cpu entered;
        # each tensor of a tuple result too (layer_norm's ``(out, mean, rstd)``: a text encoder's last hidden state)
        for w in (wrapped,) if isinstance(wrapped, VirtualTensor) else wrapped if isinstance(wrapped, (tuple, list)) \
                else ():
            if isinstance(w, VirtualTensor) and w._td_origin is None:
                w._td_origin = made_from(func.overloadpacket, space.hooks.running(), ts, w.dtype, w._td_device)
                if not ts and w._td_origin is not None and ukwargs.get("dtype") is None:
                    w._td_origin.default = w.is_floating_point()  # told no dtype: a default-dtype factory
    return wrapped


_UNWRAPPED = (VirtualTensor, list, tuple)  # what ``_unwrap`` may change


def _virtuals(largs: Sequence[Any], kwargs: dict[str, Any]) -> tuple[list[VirtualTensor], bool]:
    """``tensors_of`` as a list, in one loop (it runs per op), and whether any of them holds a meta tensor (then
    the op runs on meta)."""
    out: list[VirtualTensor] = []
    for a in (*largs, *kwargs.values()) if kwargs else largs:
        if isinstance(a, VirtualTensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, VirtualTensor))
    for t in out:
        if t._td_elem.is_meta:
            return out, True
    return out, False


def _unwrap(x: Any, on_meta: bool, owner: dict[int, VirtualTensor], back: dict[int, VirtualTensor]) -> Any:
    """The inner tensor of a virtual argument (a meta twin when the op runs on meta), its owner remembered; lists
    and tuples of them likewise; anything else as it is. Module-level, not a closure: a closure calling itself
    through its cell is a cycle that kept every op's tensors alive until the cyclic GC ran."""
    if isinstance(x, VirtualTensor):
        e = x._td_elem
        if on_meta and not e.is_meta:
            e = torch.empty_strided(e.size(), e.stride(), dtype=e.dtype, device=_META)
        owner[id(e)] = back.get(id(x), x) if back else x
        return e
    if isinstance(x, (list, tuple)) and any(isinstance(y, VirtualTensor) for y in x):
        return type(x)(_unwrap(y, on_meta, owner, back) for y in x)
    return x


def _device_of_outputs(ts: list[VirtualTensor], kwargs: dict[str, Any], space: Space | None) -> torch.device:
    """``out_device`` over the virtual arguments already collected."""
    dev = kwargs.get("device") if kwargs else None
    if dev is not None and torch.device(dev) != (space.inner if space is not None else _META):
        return torch.device(dev)
    for t in ts:
        d = t._td_device
        if d.type != "cpu" or t.dim() > 0:
            return d
    return ts[0]._td_device if ts else _CPU


# what kernels say when they refuse a dtype (on every device: the simulation reports what the hardware would)
_REFUSALS = ("Promotion for Float8 Types is not supported", "not implemented for '", "expected scalar type",
             "must have the same dtype", "expected both inputs to have same dtype", "should be the same",
             "is not supported for", "does not support", "Expected all tensors to have the same dtype",
             "Expected scalar types of")  # (group_norm's backward: ``Expected scalar types of X and dY are same.``)
_LOW = (torch.float16, torch.bfloat16, torch.float32)


def _refused(space: Space, func: Any, largs: Sequence[Any], uargs: list[Any], ukwargs: dict[str, Any],
             owner: dict[int, VirtualTensor], exc: BaseException) -> tuple[list[Any], dict[str, Any]] | None:
    """A dtype refusal of the kernel: the odd-dtype tensors, the dtype the others compute in, and (when the hooks
    accept) the inner arguments with the culprits cast to it."""
    text = str(exc)
    if not any(r in text for r in _REFUSALS):
        return None
    inner = [x for a in (*uargs, *ukwargs.values()) for x in (a if isinstance(a, (list, tuple)) else (a,))
             if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())]
    dtypes = {x.dtype for x in inner}
    if len(dtypes) < 2:
        return None
    counts = {d: sum(x.dtype == d for x in inner) for d in dtypes}
    # the expected dtype: a common compute dtype present, the most frequent one first; culprits are the others
    expected = max(dtypes, key=lambda d: (d in _LOW, counts[d], d.itemsize))
    culprits = [owner.get(id(x), x) for x in inner if x.dtype != expected]
    if not space.hooks.refused(getattr(func, "__name__", str(func)), culprits, expected, exc):
        return None

    def cast(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()) and x.dtype != expected:
            return x.to(expected)
        if isinstance(x, (list, tuple)):
            return type(x)(cast(y) for y in x)
        return x

    return [cast(a) for a in uargs], {k: cast(v) for k, v in ukwargs.items()}


def _wrap(out: Any, dev: torch.device, owner: dict[int, VirtualTensor], path: str | None) -> Any:
    if isinstance(out, torch.Tensor):
        same = owner.get(id(out))
        if same is None:
            return make(VirtualTensor, out, dev, path)
        if same._td_elem is not out:  # an in-place op ran on the meta twin of a small real tensor
            same._td_elem = out
        if same.shape != out.shape or same.stride() != out.stride():
            _reshaped(same, out)
        return same
    if isinstance(out, (tuple, list)):
        return type(out)(_wrap(o, dev, owner, path) for o in out)
    return out


def _reshaped(t: VirtualTensor, out: torch.Tensor) -> None:
    """An in-place op that changes the shape of the tensor it returns (``transpose_``, ``unsqueeze_``, ``t_``,
    ``resize_``; ``nn.GRU`` / ``nn.RNN`` with ``batch_first`` end with ``output.transpose_(0, 1)``): the wrapper the
    program holds takes the inner tensor's new shape and strides, as the real tensor would (autograd recorded the op
    already; this changes only the wrapper's metadata, below it)."""
    size, stride, offset = out.size(), out.stride(), out.storage_offset()
    need = 0 if 0 in size else (offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1) * out.element_size()
    with torch._C._DisableTorchDispatch(), torch._C._AutoDispatchBelowAutograd():
        storage = torch._C.TensorBase.untyped_storage(t)
        if storage.nbytes() < need:  # a wrapper's storage is sized by its first shape: ``resize_`` may outgrow it
            torch._C.TensorBase.set_(t, torch.UntypedStorage(need, device=storage.device), offset, size, stride)
        else:
            torch._C.TensorBase.as_strided_(t, size, stride, offset)

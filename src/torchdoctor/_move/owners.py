"""``move``'s owners: putting moved tensors back where they belong, and what quantized owners forbid.

Parameters stay the same objects wherever ``Module.to`` keeps them; Parameter subclasses (bitsandbytes
``Params4bit`` / ``Int8Params``) are rebuilt whole where it replaces them; wrapper subclasses go through their
own ``.to``; every change leaves an undo record. Nothing here imports bitsandbytes or accelerate: owners are
recognised by class name and module, so a missing or broken install costs nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass as _is_wrapper

from torchdoctor._move.undo import SetData, SetSlots, Swap, UndoLog, Unit, grad_restore
from torchdoctor._placement import same_device
from torchdoctor._walk import Entry, is_quant_type, set_tensor, hook_chain


def _dict(obj: Any) -> dict[str, Any]:
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:
        return {}
    return d if type(d) is dict else {}


_PLAIN = (torch.Tensor, nn.Parameter)


def is_wrapper(t: Any) -> bool:
    """A ``__tensor_flatten__`` wrapper (torchao, TwoTensor ...): only its own ``.to`` keeps outer and inners agreeing."""
    if type(t) in _PLAIN:
        return False
    try:
        return bool(_is_wrapper(t))
    except Exception:
        return False


def real_storage(t: torch.Tensor) -> bool:
    """A strided tensor whose storage is its own bytes (plain tensors, Parameters, bitsandbytes parameters), so
    views of one storage can be found and moved once; not fake / virtual / wrapper tensors."""
    return (type(t) in _PLAIN or _bnb_kind(t) is not None) and t.layout == torch.strided


def is_quantized_owner(t: torch.Tensor) -> bool:
    return is_quant_type(type(t))


def _bnb_kind(t: torch.Tensor) -> str | None:
    tp = type(t)
    if not (getattr(tp, "__module__", "") or "").startswith("bitsandbytes"):
        return None
    return tp.__name__


def refusal(e: Entry, device: torch.device | None) -> tuple[str, str] | None:
    """Why ``move`` must not touch this parameter (reason, fix), or None.

    * A 4-bit weight repacked for CPU kernels (bitsandbytes repacks in place on the first eval forward on
      AVX512-BF16 CPUs) is in a layout only the CPU path reads; ``Params4bit.to`` keeps that
      layout, only ``.cuda()`` / ``.xpu()`` undo it.
    * A bitsandbytes weight not quantized yet is quantized by its own ``.to(device)``; moving its float data
      instead would give a layer that has no quant_state on the new device.
    """
    if device is None or device.type in ("meta",):
        return None
    kind = _bnb_kind(e.tensor)
    if kind is None or e.slot != "param":
        return None
    d = _dict(e.tensor)
    qs = d.get("quant_state")
    if kind == "Params4bit":
        if qs is not None and _dict(qs).get("packing_format_for_cpu") and device.type != "cpu":
            return ("4-bit weight repacked for bitsandbytes' CPU kernels (quant_state.packing_format_for_cpu)",
                    f"model.{device.type}()  # Params4bit.{device.type}() undoes the CPU repacking, then\n"
                    f"torchdoctor.move(model, device={str(device)!r})")
        if not d.get("bnb_quantized", True):
            return ("4-bit weight not quantized yet (bitsandbytes quantizes it in Params4bit.to)",
                    f"model.to({str(device)!r})  # quantizes; then torchdoctor.move(model, device={str(device)!r})")
    if kind == "Int8Params" and e.tensor.dtype != torch.int8 and not d.get("has_fp16_weights", False):
        return ("8-bit weight not quantized yet (bitsandbytes quantizes it in Int8Params.to)",
                f"model.to({str(device)!r})  # quantizes; then torchdoctor.move(model, device={str(device)!r})")
    return None


def new_parameter(old: nn.Parameter, data: torch.Tensor) -> nn.Parameter:
    """A Parameter of the same class as ``old`` holding ``data``, with ``old``'s attributes.

    ``Module._apply`` builds ``Parameter(applied)`` when ``.data =`` cannot cross the tensor types (cpu -> meta),
    which fails for Params4bit / Int8Params ("requires that detach() returns an instance of the same type") after
    Params4bit.to has already moved the shared quant_state in place. Building the subclass directly and
    copying its ``__dict__`` (quant_state, blocksize, CB/SCB, module ...) keeps it whole; the quant_state tensors
    are moved by the caller as their own entries.
    """
    cls = type(old)
    if cls is nn.Parameter:
        return nn.Parameter(data, requires_grad=old.requires_grad)
    new = torch.Tensor._make_subclass(cls, data, old.requires_grad)
    d = _dict(old)
    if d:
        _dict(new).update(d)
    return new  # type: ignore[return-value]


def hook_refusal(hook: Any, device: torch.device | None) -> str | None:
    """Why an accelerate hook forbids moving the module it sits on, or None."""
    for h in hook_chain(hook):
        hd = _dict(h)
        name = type(h).__name__
        if hd.get("offload") or hd.get("weights_map") is not None:
            return f"{name}(offload=True): its weights live in the hook's weights_map and are loaded per forward"
        if name in ("CpuOffload", "UserCpuOffloadHook"):
            return f"{name}: the hook moves the model to its execution device on every forward"
        if name == "GroupOffloadingHook":
            group = _dict(hd.get("group"))
            return (f"{name} (diffusers group offloading): the weights rest on {group.get('offload_device')} and "
                    f"are onloaded to {group.get('onload_device')} per call; diffusers refuses .to() on them")
        dev = hd.get("execution_device")
        if dev is not None and device is not None:
            try:
                hook_dev = torch.device(dev)
            except (RuntimeError, TypeError):
                continue
            if hook_dev.type != device.type or (hook_dev.index or 0) != (device.index or 0):
                return f"{name}(execution_device={hook_dev}): the hook would move the inputs back to {hook_dev}"
    return None


GROUP_FIX = ("# diffusers group offloading places the weights itself: apply it again with the onload_device you\n"
             "# want (apply_group_offloading(model, onload_device=..., ...)), or rebuild the model without it")
HOOK_FIX = ("from accelerate.hooks import remove_hook_from_module\n"
            "remove_hook_from_module(model, recurse=True)  # then torchdoctor.move(model, device=...)\n"
            "# or keep the hooks and let them place the weights (pipe.enable_model_cpu_offload(device=...))")


# --- moving, and putting moved tensors back into their owners, each change after its undo record -------------------

def data_of(t: torch.Tensor) -> torch.Tensor:
    return t.data if isinstance(t, nn.Parameter) and not is_wrapper(t) else t


def convert(t: torch.Tensor, device: torch.device, dtype: torch.dtype, non_blocking: bool) -> torch.Tensor:
    """``t.to`` with only what changes (so ``cuda`` never re-targets a tensor already on ``cuda:0``)."""
    d = t.device
    same = d == device or (d.type == device.type and (d.index or 0) == (device.index or 0))
    if same and not non_blocking:
        return t.to(dtype)  # a cast: the positional form parses fastest (issue 28)
    return t.to(device=None if same else device, dtype=None if t.dtype == dtype else dtype,
                non_blocking=non_blocking)


def new_tensors(unit: list[tuple[torch.Tensor, torch.device, torch.dtype]], non_blocking: bool) -> list[torch.Tensor]:
    """The moved data of one unit (tensor, target device, target dtype): one tensor, or views of one storage moved
    once, each view rebuilt at its offset and strides (a storage shared by several tensors is copied once)."""
    t0, device, dtype = unit[0]
    if len(unit) == 1:
        return [convert(t0 if is_wrapper(t0) else data_of(t0), device, dtype, non_blocking)]
    datas = [data_of(t) for t, _, _ in unit]
    cast = datas[0].dtype != dtype
    st = datas[0].untyped_storage()
    flat = torch.empty(0, dtype=datas[0].dtype if cast else torch.uint8, device=datas[0].device)
    flat.set_(st, 0, (st.nbytes() // flat.element_size(),), (1,))
    whole = convert(flat, device, dtype if cast else flat.dtype, non_blocking)
    if type(whole) is not torch.Tensor:  # a subclass (a virtual run's twin): its storage is not where its data is
        return [whole.view(dt).as_strided(d.size(), d.stride(), d.storage_offset()) for (_, _, dt), d in zip(unit, datas)]
    moved = whole.untyped_storage()
    return [torch.empty(0, dtype=dt, device=moved.device).set_(moved, d.storage_offset(), d.size(), d.stride())
            for (_, _, dt), d in zip(unit, datas)]


def compatible(old: torch.Tensor, new: torch.Tensor) -> bool:
    """Whether ``param.data = new`` works, decided as ``Module._apply`` decides it."""
    return (torch._has_compatible_shallow_copy_type(old, new) and not _is_fake(new)
            and not torch.__future__.get_overwrite_module_params_on_conversion())


def _is_fake(t: torch.Tensor) -> bool:
    if type(t) in _PLAIN:
        return False
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def install(e: Entry, aliases: list[Entry], new: torch.Tensor, device: torch.device, dtype: torch.dtype,
            log: UndoLog, unit: Unit, i: int, swapped: dict[int, torch.Tensor], non_blocking: bool,
            was: str | None = None) -> None:
    """Put ``new`` where ``e`` (and its aliases) were, keeping Parameter objects where Module.to keeps them.
    ``was``: the compact form of ``e``'s tensor before the move, when the caller has it already.

    Everything that can fail for want of memory (the grad's conversion, a new Parameter) is built first; then each
    change is made right after its undo record is written.
    """
    slots = [e, *aliases] if aliases else [e]
    if swapped:
        for x in slots:
            if x.slot != "param" and id(x.owner) in swapped:  # attributes of a tensor replaced just before
                x.owner = swapped[id(x.owner)]
    t = e.tensor
    grad = t.grad if isinstance(t, nn.Parameter) else None
    if isinstance(t, nn.Parameter) and is_wrapper(t):
        new_grad = _moved_grad(grad, device, dtype, non_blocking)
        holder = nn.Parameter(new, requires_grad=t.requires_grad)
        log.add(Swap(t, holder, e.path))  # swapping back restores the old grad too: it went with the old impl
        torch.utils.swap_tensors(t, holder)  # as Module._apply does for wrapper subclasses: same object
        if new_grad is not None:
            t.grad = new_grad
        return
    if isinstance(t, nn.Parameter) and compatible(t, new):
        new_grad = _moved_grad(grad, device, dtype, non_blocking)
        log.add(SetData(t, new, e.path, lambda: unit.data(i), was))
        t.data = new
        if grad is not None and new_grad is not None:
            keep = log.keeps(not same_device(grad.device, device))
            log.add(SetData(grad, new_grad, f"{e.path}.grad", grad_restore(grad, new_grad, keep)))
            grad.data = new_grad
        return
    original: torch.Tensor | None = None
    if isinstance(t, nn.Parameter):
        replacement: torch.Tensor = new_parameter(t, new)
        if grad is not None:
            replacement.grad = _moved_grad(grad, device, dtype, non_blocking)
        swapped[id(t)] = replacement
        original = t  # the old Parameter object comes back whole
    else:
        replacement = new
        d = _dict(t)
        if d and replacement is not t:  # attributes a library set on the tensor (transformers' _is_buffer ...)
            _dict(replacement).update(d)
            swapped[id(t)] = replacement
    rec = SetSlots(slots, replacement, unit, i, original, was)
    log.add(rec)
    for x in slots:
        rec.reached += 1  # before the write: a write that lands and then raises is still undone
        set_tensor(x, replacement)


def _moved_grad(grad: torch.Tensor | None, device: torch.device, dtype: torch.dtype, non_blocking: bool
                ) -> torch.Tensor | None:
    """The grad as ``Module._apply`` moves it: with its parameter, cast only if floating."""
    if grad is None:
        return None
    return convert(grad, device, dtype if grad.is_floating_point() else grad.dtype, non_blocking)

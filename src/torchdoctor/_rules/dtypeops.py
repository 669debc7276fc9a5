"""Which ops a device runs in a dtype it only partly computes in (data): the family an op is judged in.

A virtual device runs its ops on meta kernels, or on this CPU's kernels for the few values a run keeps, so the
verdict on a dtype must come from the device's own kernel table, never from this CPU build's: the CPU multiplies
float8 tensors and refuses to add them, while CUDA does neither.

Float8 on CUDA and XPU is a storage dtype: their kernels hold, move, gather and select it (copies and casts,
views, ``cat``, ``where``, ``fill_``, indexing, ``eq``/``ne``) and compute with it only through ``_scaled_mm``;
every other op raises there (``NotImplementedError: "mul_cuda" not implemented for 'Float8_e4m3fn'``). XPU follows
CUDA's list (intel/torch-xpu-ops keeps its float8 kernels aligned with CUDA's). MPS cannot hold float8 at all
(``DeviceProfile.supports``). A device with no kernels of a dtype at all (Arc's float64) still holds it: an op
that only holds, moves or re-views data runs.

>>> import torch
>>> from torchdoctor._rules.profile import DeviceProfile
>>> cuda = DeviceProfile.for_device("cuda")
>>> judged_family(torch.ops.aten.mul.Tensor, "storage", cuda, torch.float8_e4m3fn)
'compute'
>>> judged_family(torch.ops.aten.cat.default, "storage", cuda, torch.float8_e4m3fn)
'storage'
>>> device_says("cuda", "aten::mul", torch.float8_e4m3fn)
'NotImplementedError: "mul_cuda" not implemented for \\'Float8_e4m3fn\\''
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._rules.profile import DeviceProfile

# ops that only hold, move or re-view data: a device with no kernels of a dtype (Arc's float64) still holds it
DATA_ONLY = frozenset(f"aten::{n}" for n in (
    "_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "clone", "detach", "alias", "lift_fresh",
    "lift_fresh_copy", "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "slice", "select",
    "unsqueeze", "squeeze", "as_strided", "contiguous", "empty", "empty_like", "empty_strided", "new_empty",
    "new_empty_strided", "set_", "split", "split_with_sizes", "chunk", "unbind", "narrow", "unfold", "diagonal",
    "view_as", "expand_as", "movedim", "flatten", "unflatten", "_reshape_alias", "resize_", "_pin_memory",
    "is_same_size", "_has_compatible_shallow_copy_type", "to", "_local_scalar_dense"))

# what CUDA's (and XPU's) kernels also do in float8 besides the above: fill, gather, select, concatenate, compare
# for equality, and the scaled matmuls (the list intel/torch-xpu-ops aligns XPU's float8 kernels with)
FLOAT8_KERNELS = DATA_ONLY | frozenset(f"aten::{n}" for n in (
    "fill_", "fill", "zero_", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros",
    "new_ones", "new_full", "eye", "cat", "stack", "where", "eq", "ne", "equal", "flip", "index", "_unsafe_index",
    "index_select", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put", "gather", "constant_pad_nd",
    "repeat", "embedding", "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter", "_scaled_mm",
    "_scaled_mm_v2", "_scaled_grouped_mm", "isnan"))

_GPUS = frozenset({"cuda", "xpu"})

# the kernel names the devices' dispatch macros report, for the ops programs meet ("mul_cuda" not implemented for
# 'Float8_e4m3fn'); an op not here is said without a name
_KERNEL_NAMES: dict[str, dict[str, str]] = {
    "cuda": {"aten::mul": "mul_cuda", "aten::add": "ufunc_add_CUDA", "aten::sub": "ufunc_add_CUDA",
             "aten::div": "div_true_cuda", "aten::abs": "abs_cuda", "aten::mm": "addmm_cuda",
             "aten::addmm": "addmm_cuda"},
    "xpu": {"aten::mul": "mul_xpu", "aten::add": "add_xpu", "aten::sub": "add_xpu", "aten::div": "div_true_xpu",
            "aten::gt": "compare_xpu", "aten::lt": "compare_xpu", "aten::ge": "compare_xpu",
            "aten::le": "compare_xpu", "aten::normal": "normal_kernel_xpu", "aten::normal_": "normal_kernel_xpu"},
}


def _op_name(op: Any) -> str:
    return getattr(getattr(op, "_schema", None), "name", "")


def torch_name(dtype: torch.dtype) -> str:
    """The dtype as torch's kernels name it in their errors: ``Float8_e4m3fn``, ``BFloat16``, ``Double``."""
    name = str(dtype).removeprefix("torch.")
    if name.startswith("float8"):
        return "F" + name[1:]
    return {"float64": "Double", "float32": "Float", "float16": "Half", "bfloat16": "BFloat16",
            "complex128": "ComplexDouble"}.get(name, name)


def storage_only(profile: DeviceProfile, op: Any, dtype: torch.dtype) -> bool:
    """True when ``profile``'s device holds ``dtype`` but has no kernel of ``op`` in it: float8 on a GPU outside
    ``FLOAT8_KERNELS``."""
    return dtype in FLOAT8_DTYPES and profile.type in _GPUS and _op_name(op) not in FLOAT8_KERNELS


def judged_family(op: Any, family: str, profile: DeviceProfile, dtype: torch.dtype) -> str:
    """The family an op is judged in: an op family judged by storage (elementwise, reductions, factories) computes
    all the same, so a dtype the device holds without computing in it — float8 on CUDA and XPU outside their
    float8 kernels; a dtype the profile has no kernels for at all (``unsupported_dtypes``: Arc's float64, where every
    kernel raises "Required aspect fp64 is not supported on the device") outside the data-only ops — is judged as
    compute."""
    if family != "storage":
        return family
    if dtype in FLOAT8_DTYPES:
        return "compute" if storage_only(profile, op, dtype) else family
    if not profile.unsupported_dtypes:
        return family
    return "compute" if str(dtype).removeprefix("torch.") in profile.unsupported_dtypes \
        and _op_name(op) not in DATA_ONLY else family


def device_says(device_type: str, op_name: str, dtype: torch.dtype) -> str:
    """What the device raises for ``op_name`` in ``dtype`` when it has no kernel of it, in torch's words."""
    kernel = _KERNEL_NAMES.get(device_type, {}).get(op_name)
    return (f'NotImplementedError: "{kernel}" not implemented for \'{torch_name(dtype)}\'' if kernel else
            f"NotImplementedError: ... not implemented for '{torch_name(dtype)}'")


def float8_message(device_type: str, op: Any, dtype: torch.dtype) -> str:
    """The problem's text for an op a GPU has no float8 kernel of: what it raises, and the compute dtype to use."""
    name = _op_name(op)
    short = name.removeprefix("aten::")
    return (f"{device_type} has no {str(dtype).removeprefix('torch.')} kernel for {short}, so this raises there "
            f"({device_says(device_type, name, dtype)}): float8 is a storage dtype on {device_type} (it computes "
            "only through torch._scaled_mm); cast the float8 operands to the compute dtype (bfloat16 or float32) "
            f"before the {short}")

"""Ops a backend has no kernel for (data): on the real device they raise before computing anything.

A virtual device runs every op on meta kernels, so an op the real backend lacks would pass unnoticed. Each name
here has a CPU and a CUDA kernel and no kernel for the backend, no composite that decomposes it, in torch's own
op table (``native_functions.yaml``, checked by ``tests/rules/test_missing.py`` where torchgen is installed), and
is one programs meet: int8 matmuls of quantized models, CTC loss, eigen decompositions. On MPS such an op raises
``NotImplementedError: The operator 'aten::_int_mm' is not currently implemented for the MPS device`` unless
``PYTORCH_ENABLE_MPS_FALLBACK=1`` was set before torch started (then it runs on the CPU, slower). Ops that MPS
sends to the CPU by itself (``linalg_svd``, ``embedding_renorm_``) are not listed: they do not raise.

XPU is not listed: its kernels live in torch-xpu-ops, outside that table, and the ops programs meet there have
them (``_int_mm`` included); Arc's missing float64 is a dtype limit (``DeviceProfile.unsupported_dtypes``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torchdoctor._placement import compact, tensor_device
from torchdoctor._report.model import Problem
from torchdoctor._rules.args import _arg_names, _Call, _gather

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._rules.profile import DeviceProfile

_CPU_INSTEAD = "run that call on the CPU (its inputs .cpu(), the result moved back)"

# op (aten schema name) -> what to do instead on that device, besides the fallback flag
MISSING: dict[str, dict[str, str]] = {
    "mps": {
        "aten::_int_mm": "or dequantize for mps: torch.mm(x, w.to(x.dtype)) * scale, as the CPU path of the "
                         "quantized layer does",
        "aten::_ctc_loss": "or compute the loss on the CPU: F.ctc_loss(log_probs.cpu(), targets.cpu(), ...)",
        "aten::linalg_eig": f"or {_CPU_INSTEAD}",
        "aten::_linalg_eigvals": f"or {_CPU_INSTEAD}",
        "aten::linalg_matrix_exp": f"or {_CPU_INSTEAD}",
        "aten::geqrf": f"or {_CPU_INSTEAD}",
        "aten::ormqr": f"or {_CPU_INSTEAD}",
        "aten::_pdist_forward": "or torch.cdist(x, x) on mps (pdist is its upper triangle)",
        "aten::poisson": f"or {_CPU_INSTEAD}",
        "aten::binomial": f"or {_CPU_INSTEAD}",
        "aten::take": "or index the flattened tensor: x.flatten()[index]",
        "aten::put_": "or index_put_ on the flattened tensor: x.view(-1).index_put_((index,), source)",
        "aten::mode": f"or {_CPU_INSTEAD}",
        "aten::_adaptive_avg_pool3d": f"or {_CPU_INSTEAD}",
        "aten::fractional_max_pool2d": f"or {_CPU_INSTEAD}",
        "aten::fractional_max_pool3d": f"or {_CPU_INSTEAD}",
        "aten::multi_margin_loss": f"or {_CPU_INSTEAD}",
        "aten::multilabel_margin_loss_forward": f"or {_CPU_INSTEAD}",
        "aten::segment_reduce": f"or {_CPU_INSTEAD}",
        "aten::_fused_adagrad_": "or torch.optim.Adagrad(..., fused=False)",
    },
}

_FLAGS = {"mps": "PYTORCH_ENABLE_MPS_FALLBACK=1"}
_TORCH_SAYS = {"mps": "NotImplementedError: The operator '{op}' is not currently implemented for the MPS device"}


def lacks(device_type: str, op_name: str) -> str | None:
    """What to do instead when ``device_type`` has no kernel for ``op_name`` (``aten::_int_mm``), else None.

    >>> lacks("mps", "aten::_int_mm") is not None, lacks("cuda", "aten::_int_mm")
    (True, None)
    """
    table = MISSING.get(device_type)
    return None if table is None else table.get(op_name)


def missing_message(device_type: str, op_name: str) -> str:
    """The problem's text: what the real device raises, the fallback flag, and the path without the op."""
    instead = lacks(device_type, op_name) or ""
    said = _TORCH_SAYS.get(device_type, "NotImplementedError").format(op=op_name)
    flag = _FLAGS.get(device_type)
    return (f"{device_type} has no kernel for {op_name}, so this raises there ({said}); "
            + (f"set {flag} before torch is imported to run it on the CPU (slower), " if flag else "")
            + instead).rstrip(", ")


def missing_problem(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None,
                    profile: DeviceProfile) -> Problem | None:
    """The problem of one op call the profile's backend has no kernel for, when a tensor of it is on that device."""
    name = getattr(getattr(op, "_schema", None), "name", "")
    if lacks(profile.type, name) is None:
        return None
    kw = kwargs or {}
    c = _Call(op, args, kw, _gather(args, kw), _arg_names(op))
    if not any(tensor_device(t).type == profile.type for _, t in c.tensors):
        return None
    shown = tuple(f"{c.label(k)}: {compact(t.dtype, tuple(t.shape), tensor_device(t))}" for k, t in c.tensors)
    return Problem("missing_kernel", str(op), "op", name, f"an op {profile.type} has a kernel for",
                   f"{op}: {missing_message(profile.type, name)}", op=str(op), tensors=shown)


def missing_fix(device_type: str, op_name: str, at: str | None = None) -> str:
    """The fix as one advice line: the fallback flag, or the path without the op (``at``: the user's line)."""
    flag = _FLAGS.get(device_type)
    where = f" at {at}" if at else ""
    return (f"# {op_name}{where} has no {device_type} kernel: "
            + (f"set {flag} before torch is imported (it runs on the CPU, slower), " if flag else "")
            + (lacks(device_type, op_name) or "")).rstrip(", ")

"""Globals of torch's own records that ``torch.load(weights_only=True)`` accepts.

The restricted unpickler turns them into placeholders like any other global (nothing is imported on the file's
say-so), but does not report them as unsafe: torch itself would load them.
"""

from __future__ import annotations

import sys

__all__ = ["DTENSOR", "NJT_REBUILD", "TORCH_RECORDS", "torch_allows"]


DTENSOR = "torch.distributed.tensor.DTensor"
NJT_REBUILD = "torch.nested._internal.nested_tensor._rebuild_njt"
# Records of torch's own distributed and nested jagged tensors: torch.load(weights_only=True) accepts them (NJTs
# once torch.nested and torch._dynamo are imported, as its message says); they stay placeholders (never
# imported) but are not reported as unknown globals.
TORCH_RECORDS = frozenset({
    DTENSOR, "torch.distributed.tensor._api.DTensor", "torch.distributed.tensor._dtensor_spec.DTensorSpec",
    "torch.distributed.tensor._dtensor_spec.TensorMeta", "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
    "torch.distributed.device_mesh.DeviceMesh", "torch.distributed._mesh_layout._MeshLayout",
    "torch.distributed._mesh_layout._FlatLayout", "torch.distributed.tensor.placement_types.Shard",
    "torch.distributed.tensor.placement_types.Replicate", "torch.distributed.tensor.placement_types.Partial",
    "torch.distributed.tensor.placement_types._StridedShard", NJT_REBUILD,
    "torch.nested._internal.nested_tensor.NestedTensor", "torch._dynamo.decorators._DimRange",
})  # fmt: skip


def _registered() -> set[str]:
    """Globals registered with ``torch.serialization.add_safe_globals`` in this process (only when torch is
    already imported: reading a checkpoint never imports it)."""
    serialization = sys.modules.get("torch.serialization")
    if serialization is None:
        return set()
    try:
        objs = [g[0] if isinstance(g, tuple) else g for g in serialization.get_safe_globals()]
    except Exception:  # another torch
        return set()
    return {f"{getattr(o, '__module__', '')}.{getattr(o, '__qualname__', '')}" for o in objs}


def torch_allows(name: str) -> bool:
    """True when torch's weights-only unpickler accepts the global ``name`` (``module.qualname``), exactly.

    >>> torch_allows("collections.OrderedDict"), torch_allows("posix.system"), torch_allows("torch.os.system")
    (True, False, False)
    """
    from torchdoctor._checkpoint.names import WEIGHTS_ONLY  # the allow-list: a pickle's globals only, never a header

    return name in WEIGHTS_ONLY or name in _registered()

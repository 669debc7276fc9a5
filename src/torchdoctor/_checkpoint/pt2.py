"""``torch.export.save`` archives (``.pt2``): a zip with ``archive_format`` = ``pt2`` and no ``data.pkl``.

``torch.export.load`` reads the graph from JSON, the weights and constants through their JSON configs, and some
members with pickle: a weight or constant whose config says ``use_pickle`` with ``torch.load(weights_only=False)``,
an ``opaque_obj_*`` constant with ``pickle.loads``, a ``custom_obj_*`` one with TorchScript's unpickler. So every
member under ``data/`` is judged by its content (a zip or a pickle stream: its globals, by the restricted reader;
raw tensor bytes parse as neither), and the tensors are listed from the configs (dtype, sizes, device), never read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdoctor._checkpoint.bounds import MAX_PICKLE_BYTES, Budget
from torchdoctor._checkpoint.dtypes import DTYPES
from torchdoctor._checkpoint.errors import CheckpointError, UnsafePickle
from torchdoctor._checkpoint.modclass import merge
from torchdoctor._checkpoint.unpickle import StorageRef, TensorStub

__all__ = ["is_pt2", "read_pt2"]

# torch._export.serde.schema.ScalarType, by value (the configs store the number)
_SCALAR = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32", 8: "float64",
           9: "complex32", 10: "complex64", 11: "complex128", 12: "bool", 13: "bfloat16", 28: "uint16",
           29: "float8_e4m3fn", 30: "float8_e5m2", 31: "float8_e4m3fnuz", 32: "float8_e5m2fnuz",
           33: "float8_e8m0fnu", 34: "uint32", 35: "uint64"}  # fmt: skip


def is_pt2(entries: dict[str, Any], prefix: str) -> bool:
    return prefix + "archive_format" in entries


def _stub(fqn: str, meta: Any) -> TensorStub | None:
    """A tensor as a config describes it; None for a shape that is not plain integers (symbolic sizes)."""
    if not isinstance(meta, dict):
        return None
    dtype = DTYPES.get(_SCALAR.get(meta.get("dtype"), ""))  # type: ignore[arg-type]
    raw = [s.get("as_int") if isinstance(s, dict) else None for s in meta.get("sizes") or []]
    sizes = [s for s in raw if type(s) is int and 0 <= s < 2**62]
    if dtype is None or len(sizes) != len(raw):
        return None
    device: dict[str, Any] = meta["device"] if isinstance(meta.get("device"), dict) else {}
    kind, index = str(device.get("type", "cpu"))[:40], device.get("index")
    location = f"{kind}:{index}" if type(index) is int else kind
    numel = 1
    for s in sizes:
        numel *= s
    return TensorStub(StorageRef(f"pt2/{fqn}", location, dtype, numel), 0, tuple(sizes), None, dtype, location,
                      bool(meta.get("requires_grad")))


def read_pt2(entries: dict[str, Any], read: Callable[[Any, int], bytes], prefix: str, label: str,
             budget: Budget) -> Any:
    """The archive as a PickleFile: the tensors its configs list, the globals its pickled members name."""
    import json

    from torchdoctor._checkpoint.pickles import PickleFile, read_nested, unpickle_one

    root: dict[str, Any] = {}
    unknown: list[str] = []
    for name, info in entries.items():
        if not name.startswith(prefix + "data/"):
            continue
        data = read(info, MAX_PICKLE_BYTES) if info.file_size <= MAX_PICKLE_BYTES else b""
        if name.endswith("_config.json"):
            try:
                config = json.loads(data).get("config", {})
            except (ValueError, AttributeError, RecursionError):
                raise CheckpointError(f"{label}: {name} is not a readable weights or constants config") from None
            for fqn, payload in (config.items() if isinstance(config, dict) else ()):
                stub = _stub(str(fqn), payload.get("tensor_meta") if isinstance(payload, dict) else None)
                if stub is not None:
                    root[str(fqn)] = stub
            continue
        try:
            if data.startswith(b"PK\x03\x04"):  # a pickled weight: torch.load(weights_only=False)
                unknown += read_nested(data, f"{label}: {name}", budget).unknown_globals
            elif data[:1] == b"\x80":  # opaque objects: pickle.loads; custom objects: TorchScript's unpickler
                unknown += unpickle_one(data, 0, None, f"{label}: {name}", budget)[1]
        except UnsafePickle as exc:
            unknown += exc.globals
        except CheckpointError:  # raw tensor bytes that look like neither: what they are, the config says
            continue
    note = "torch.export archive (.pt2): tensors listed from its weights and constants configs"
    return PickleFile("torch-export", root, {}, merge(unknown), [note])

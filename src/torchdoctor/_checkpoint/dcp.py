"""Distributed checkpoints (``torch.distributed.checkpoint``): a directory of ``.metadata`` plus ``*.distcp`` files.

``FileSystemReader(path).read_metadata()`` would answer the same question, but it calls plain ``pickle.load`` on
``.metadata``: any global in that file would be imported and run. So ``.metadata`` goes through the same bounded,
restricted unpickler as every other pickle; the classes of ``torch.distributed.checkpoint`` become records
(never imported), read here by field name: per key its dtype, global shape and chunks (the sharding), and where
each chunk's bytes sit, which is checked against the ``.distcp`` files without reading them. accelerate's and
FSDP's sharded state dicts (``pytorch_model_fsdp_0/``) are such directories.
"""

from __future__ import annotations

import io
import os
import stat
from typing import Any

from torchdoctor._checkpoint.bounds import MAX_PICKLE_BYTES, Budget
from torchdoctor._checkpoint.checks import Entry, FileScan, role_of
from torchdoctor._checkpoint.modclass import merge
from torchdoctor._checkpoint.dtypes import DType, shown
from torchdoctor._checkpoint.views import I64, BadRecord, check_sizes, dims_text
from torchdoctor._checkpoint.records import walk
from torchdoctor._checkpoint.torchfile import unpickle_one
from torchdoctor._checkpoint.unpickle import CheckpointError, Placeholder, UnsafePickle, placeholder_class

__all__ = ["DCP_GLOBALS", "read_dcp"]

_M = "torch.distributed.checkpoint.metadata."
DCP_GLOBALS = frozenset({
    _M + "Metadata", _M + "TensorStorageMetadata", _M + "BytesStorageMetadata", _M + "ChunkStorageMetadata",
    _M + "TensorProperties", _M + "MetadataIndex", _M + "StorageMeta", _M + "_MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.filesystem._StorageInfo", "pathlib.PosixPath", "pathlib.PurePosixPath",
    "pathlib.WindowsPath", "pathlib.PureWindowsPath",
})  # fmt: skip  -- plain records of torch's own format: read by field, never imported


def _is(obj: Any, name: str) -> bool:
    return isinstance(obj, Placeholder) and obj._td_global == _M + name


def _fields(obj: Any) -> dict[str, Any]:
    """The fields a dataclass record was rebuilt with (BUILD state, or (dict, slots))."""
    state = obj.__dict__.get("_td_state") if isinstance(obj, Placeholder) else None
    if isinstance(state, tuple) and len(state) == 2 and (state[0] is None or isinstance(state[0], dict)):
        state = {**(state[0] or {}), **(state[1] or {})}
    return state if isinstance(state, dict) else {}


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(v) is int and 0 <= v < I64 for v in value):
        raise CheckpointError(f"corrupted .metadata: {what} is not a list of sizes (non-negative 64-bit integers)")
    return tuple(value)


def _load(path: str, label: str) -> tuple[Any, tuple[str, ...]]:
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{label}: .metadata is not a regular file")
        if st.st_size > MAX_PICKLE_BYTES:
            raise CheckpointError(f"{label}: refused: .metadata holds {st.st_size:,} bytes")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise CheckpointError(f"{label}: cannot read .metadata ({exc.strerror or exc})") from None
    try:
        root, unknown, _ = unpickle_one(data, 0, None, f"{label}/.metadata", Budget(label=label))
    except UnsafePickle as exc:  # names what it would import before failing: reported as such
        return placeholder_class(_M + "Unreadable")(), exc.globals
    return root, unknown


def read_dcp(dirpath: str, label: str) -> FileScan:
    """The tensors a distributed checkpoint holds, from ``.metadata`` alone (dtype, shape, chunks)."""
    try:
        return _read(dirpath, label)
    except CheckpointError:
        raise
    except Exception as exc:  # records shaped in ways torch never writes: unreadable, one line
        raise CheckpointError(f"{label}: unreadable .metadata ({type(exc).__name__}: {str(exc)[:100]})") from None


def _read(dirpath: str, label: str) -> FileScan:
    root, unknown = _load(os.path.join(dirpath, ".metadata"), label)
    if not _is(root, "Metadata"):
        odd = [g for g in unknown if g not in DCP_GLOBALS]
        if odd:  # what dcp.load's plain pickle.load would import and call: the finding, not an unreadable file
            note = ".metadata does not hold torch.distributed.checkpoint Metadata; it calls the globals listed"
            return FileScan(dirpath, label, "torch-dcp", [], {}, [(g, None, ()) for g in odd], [note])
        raise CheckpointError(f"{label}: .metadata does not hold torch.distributed.checkpoint Metadata")
    fields = _fields(root)
    sd_meta = fields.get("state_dict_metadata")
    if not isinstance(sd_meta, dict):
        raise CheckpointError(f"{label}: corrupted .metadata (no state_dict_metadata)")
    entries: list[Entry] = []
    sharding: dict[str, list[dict[str, list[int]]]] = {}
    values: list[str] = []
    for key, meta in sd_meta.items():
        key = str(key)
        if _is(meta, "BytesStorageMetadata"):
            values.append(key)
            continue
        if not _is(meta, "TensorStorageMetadata"):
            raise CheckpointError(f"{label}: corrupted .metadata: {shown(key)} is neither a tensor nor a value")
        f = _fields(meta)
        props = f.get("properties")
        pstate = props.__dict__.get("_td_state") if isinstance(props, Placeholder) else None
        dtype = pstate[0] if isinstance(pstate, tuple) and pstate else _fields(props).get("dtype")
        if not isinstance(dtype, DType):
            raise CheckpointError(f"{label}: corrupted .metadata: {shown(key)} has no dtype")
        try:
            shape = _ints(f.get("size"), f"the size of {shown(key)}")
            chunks = [(_ints(_fields(c).get("offsets"), "a chunk offset"), _ints(_fields(c).get("sizes"), "a chunk size"))
                      for c in f.get("chunks") or []]
        except CheckpointError as exc:
            raise CheckpointError(f"{label}: {exc}") from None
        try:
            numel = check_sizes(shape)[1]
        except BadRecord as exc:
            raise CheckpointError(f"{label}: refused: .metadata entry {shown(key)}: {exc}") from None
        nbytes = numel * dtype.itemsize
        if nbytes >= I64:
            raise CheckpointError(f"{label}: refused: .metadata entry {shown(key)} needs more than 2**63 bytes")
        for offsets, sizes in chunks:
            if len(offsets) != len(shape) or len(sizes) != len(shape) or any(
                    o + n > s for o, n, s in zip(offsets, sizes, shape)):
                raise CheckpointError(f"{label}: corrupted .metadata: a chunk of {shown(key)} (offsets "
                                      f"{dims_text(offsets)}, sizes {dims_text(sizes)}) lies outside its shape "
                                      f"{dims_text(shape)}")
        entries.append(Entry(key, role_of(key), dtype, shape, nbytes, "cpu", key, nbytes, ()))
        if len(chunks) != 1 or chunks[0][1] != shape:
            sharding[key] = [{"offsets": list(o), "sizes": list(s)} for o, s in chunks]
    _check_storage(dirpath, label, fields.get("storage_data"))
    unsafe_names = tuple(g for g in unknown if g not in DCP_GLOBALS)
    in_values = _judge_values(dirpath, label, fields.get("storage_data"), set(values))
    unsafe_names += tuple(g for g in in_values if g not in unsafe_names)
    placeholders = walk(root).placeholders if unsafe_names else {}
    unsafe = [(g, *placeholders.get(g, (None, ()))) for g in unsafe_names]
    notes = ["distributed checkpoint: tensors load onto the devices of the state_dict passed to dcp.load"]
    if values:
        notes.append(f"{len(values)} non-tensor value(s): {', '.join(values[:5])}{' ...' if len(values) > 5 else ''}")
    meta = {"version": str(fields.get("version", ""))[:40]} if fields.get("version") else {}
    return FileScan(dirpath, label, "torch-dcp", entries, meta, unsafe, notes, sharding=sharding)


def _judge_values(dirpath: str, label: str, storage: Any, values: set[str]) -> tuple[str, ...]:
    """What dcp.load would import from the non-tensor values: each is a ``torch.save`` stream in a ``.distcp``
    file that ``DefaultLoadPlanner.load_bytes`` reads with ``torch.load(weights_only=False)``. Read here as
    torch reads an in-memory stream, by the same restricted reader; one that cannot be read is refused."""
    from torchdoctor._checkpoint.torchfile import read_stream

    if not isinstance(storage, dict) or not values:
        return ()
    named: list[str] = []
    for index, info in storage.items():
        fqn = _fields(index).get("fqn")
        if fqn not in values:
            continue
        f = _fields(info)
        rel, offset, length = f.get("relative_path"), f.get("offset"), f.get("length")
        where = f"{label}: non-tensor value {shown(str(fqn))}"
        if f.get("transform_descriptors"):
            raise CheckpointError(f"{where} is stored through transforms {str(f['transform_descriptors'])[:60]}; "
                                  "it cannot be judged, and dcp.load unpickles it with weights_only=False: refused")
        if not isinstance(length, int) or not isinstance(offset, int) or length > MAX_PICKLE_BYTES:
            raise CheckpointError(f"{where}: refused: {length!r} bytes")
        with open(os.path.join(dirpath, str(rel)), "rb") as fh:
            fh.seek(offset)  # checked against the file's size by _check_storage
            raw = fh.read(length)
        try:
            named += read_stream(raw, where).unknown_globals
        except UnsafePickle as exc:
            named += exc.globals
        except CheckpointError as exc:
            raise CheckpointError(f"{exc}; dcp.load unpickles it with torch.load(weights_only=False)") from None
    return merge(named)


def _check_storage(dirpath: str, label: str, storage: Any) -> None:
    """Every chunk's bytes must lie inside a ``.distcp`` file of this directory (sizes only, nothing is read)."""
    if not isinstance(storage, dict):
        return
    sizes: dict[str, int] = {}
    for info in storage.values():
        f = _fields(info)
        rel, offset, length = f.get("relative_path"), f.get("offset"), f.get("length")
        if not isinstance(rel, str) or type(offset) is not int or type(length) is not int:
            raise CheckpointError(f"{label}: corrupted .metadata (a storage entry without path, offset or length)")
        if os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
            raise CheckpointError(f"{label}: .metadata points outside the checkpoint directory ({shown(rel)})")
        if rel not in sizes:
            try:
                sizes[rel] = os.stat(os.path.join(dirpath, rel)).st_size
            except OSError:
                raise CheckpointError(f"{label}: {rel} is listed in .metadata but missing") from None
        if not 0 <= offset < I64 or not 0 <= length < I64 or offset + length > sizes[rel]:
            raise CheckpointError(f"{label}: truncated: {rel} has {sizes[rel]} bytes, .metadata reads up to "
                                  f"{offset + length}")


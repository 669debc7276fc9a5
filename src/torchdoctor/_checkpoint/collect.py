"""Find and read the checkpoints in a file or a directory; every entry that cannot be checked is named.

A single file that cannot be read raises :class:`CheckpointError` (one line). In a directory, each checkpoint
unit (a file, the shards of one index, a distributed checkpoint) is read on its own: a unit that fails, an
unreadable subdirectory, a FIFO or device file with a checkpoint's name, a dangling symlink or a symlink loop
becomes a :class:`Skipped` entry and the others are still read. Symlinked files and directories are followed
(the Hugging Face cache is made of them), each directory once. Special files are never opened, so a FIFO
cannot block the scan.
"""

from __future__ import annotations

import gc
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torchdoctor._checkpoint.checks import Entry, FileScan, Group, role_of
from torchdoctor._checkpoint.dtypes import shown
from torchdoctor._checkpoint.errors import LFS_POINTER, CheckpointError

# The readers of each format (safetensors, torch.save and its unpickler, zip, DCP) are imported by the function
# that reads that format: `torchdoctor scan model.safetensors` never loads the pickle machinery, a legacy pickle
# never loads zipfile or json (docs/checkpoints.md, "Cost").

__all__ = ["EXTENSIONS", "Skipped", "collect", "file_kind", "gc_paused", "read_file", "read_json"]

EXTENSIONS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl")  # .pkl: accelerate's random_states_0.pkl is torch.load-ed
_MAX_DIR_DEPTH = 4
_MAX_JSON = 64 * 1024 * 1024  # an index or config.json larger than this is not one


class Skipped:
    """A directory entry that was not checked, and why (shown as an ``unreadable`` problem, unless ``loaded`` is
    False: a file ``from_pretrained`` does not load, listed in the report's ``skipped`` and not judged)."""

    __slots__ = ("label", "reason", "loaded")
    label: str
    reason: str
    loaded: bool

    def __init__(self, label: str, reason: str, loaded: bool = True) -> None:
        self.label = label
        self.reason = reason
        self.loaded = loaded

    def __eq__(self, other: object) -> bool:
        return type(other) is Skipped and (self.label, self.reason, self.loaded) == (other.label, other.reason,
                                                                                     other.loaded)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Skipped(label={self.label!r}, reason={self.reason!r}, loaded={self.loaded!r})"


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words.

    >>> import stat
    >>> file_kind(stat.S_IFIFO)
    'a FIFO (named pipe)'
    """
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _read_pickled(path: str, fh: Any, size: int, label: str) -> FileScan:
    from torchdoctor._checkpoint.known import DTENSOR
    from torchdoctor._checkpoint.records import walk
    from torchdoctor._checkpoint.torchfile import read_torch_file
    from torchdoctor._checkpoint.unpickle import UnsafePickle

    try:
        pf = read_torch_file(path, fh, size, label)
    except UnsafePickle as exc:  # it fails to load, but only after importing what it names: that is the finding
        why = str(exc).removeprefix(f"{label}: ")
        notes = [f"the pickle fails to load ({why}) after naming the globals listed; no tensor was read"]
        return FileScan(path, label, "pickle", [], {}, [(g, None, ()) for g in exc.globals], notes, failure=why)
    result = walk(pf.root)
    entries: list[Entry] = []
    refs: dict[str, Any] = {}
    new_entry = tuple.__new__  # Entry(...) through its generated __new__ costs a Python call per tensor
    for key, stub in result.tensors:
        ref = stub.storage
        sid = f"{ref.location}/{ref.key}" if ref is not None else f"nostorage:{key}"
        view = (stub.offset, stub.shape, stub.stride, stub.dtype) if ref is not None else ()
        nbytes = ref.nbytes if ref else 0
        entries.append(new_entry(Entry, (key, role_of(key), stub.dtype, stub.shape, stub.nbytes, stub.location, sid,
                                         nbytes, view)))
        if ref is not None:
            refs.setdefault(key, ref)
    unsafe = [(g, *result.placeholders.get(g, (None, ()))) for g in pf.unknown_globals]
    notes = list(pf.notes)
    shards = sum(1 for _, stub in result.tensors if stub.subclass == DTENSOR)
    if shards:
        notes.append(f"{shards} DTensor(s): this file holds one rank's local shards; shapes are the global ones")

    def small(key: str) -> bytes | None:
        return pf.read_small(refs[key]) if key in refs else None

    return FileScan(path, label, pf.format, entries, {}, unsafe, notes, result.truncated, small)


def read_file(path: str, label: str) -> FileScan:
    """One checkpoint file, detected by content (not extension); anything unreadable raises ``CheckpointError``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block the open
    except OSError as exc:
        raise CheckpointError(f"{label}: cannot read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{label}: {file_kind(st.st_mode)}, not a checkpoint file: not read")
        size = st.st_size
        if size == 0:
            raise CheckpointError(f"{label}: empty file (0 bytes)")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            head = fh.read(len(LFS_POINTER))
            fh.seek(0)
            if head == LFS_POINTER:
                raise CheckpointError(f"{label}: a git-LFS pointer, not the checkpoint itself: run `git lfs pull`")
            if _safetensors_shaped(head, size) or (path.endswith(".safetensors") and not _torch_shaped(head)):
                from torchdoctor._checkpoint.safetensors import read_safetensors

                return read_safetensors(path, fh, size, label)
            if head.startswith(b"GGUF"):
                raise CheckpointError(f"{label}: GGUF file, not a PyTorch checkpoint (the gguf package reads it)")
            return _read_pickled(path, fh, size, label)
    except CheckpointError:
        raise
    except OSError as exc:
        raise CheckpointError(f"{label}: cannot read ({exc.strerror or exc})") from None
    except Exception as exc:  # never a traceback for a file: every other failure is "unreadable", one line
        raise CheckpointError(f"{label}: unreadable ({type(exc).__name__}: {str(exc)[:120]})") from None
    finally:
        os.close(fd)


def _in_dcp(path: str, parent: str) -> bool:
    """A file of a distributed checkpoint: only the directory is loadable (dcp.load reads all of it)."""
    name = os.path.basename(path)
    if name != ".metadata" and not name.endswith(".distcp"):
        return False
    try:
        names = os.listdir(parent)
    except OSError:
        return False
    return ".metadata" in names and any(n.endswith(".distcp") for n in names)


def _safetensors_shaped(head: bytes, size: int) -> bool:
    """A safetensors file by structure, not by one byte: a little-endian header length that fits the file, then
    ``{``. A legacy torch.save stream whose byte 8 is ``{`` declares a header longer than any file."""
    return head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8


def _torch_shaped(head: bytes) -> bool:
    """What torch.load reads whatever the file's name: a zip, or a pickle stream (a protocol 2+ opcode first)."""
    return head.startswith(b"PK\x03\x04") or (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04",
                                                                                   b"\x05"))


def read_json(path: str, label: str) -> Any:
    """A small JSON file (index, config); ``CheckpointError`` when it cannot be read or parsed."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{label}: {file_kind(st.st_mode)}, not a JSON file: not read")
        if st.st_size > _MAX_JSON:
            raise CheckpointError(f"{label}: refused: {st.st_size:,} bytes of JSON, more than {_MAX_JSON:,}")
        import json

        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except CheckpointError:
        raise
    except OSError as exc:
        raise CheckpointError(f"{label}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{label}: not valid JSON ({str(exc)[:80]})") from None


def _read_index(index_path: str, prefix: str, label: str, skipped: list[Skipped]) -> Group:
    doc = read_json(index_path, label)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{label}: not a shard index (needs a JSON object with a 'weight_map')")
    folder = os.path.dirname(index_path)
    label_dir = os.path.dirname(label)
    files = []
    for shard in dict.fromkeys(str(v) for v in weight_map.values()):
        if os.path.isabs(shard) or ".." in shard.replace("\\", "/").split("/"):
            raise CheckpointError(f"{label}: shard {shown(shard)} points outside the checkpoint directory")
        shard_label = f"{label_dir}/{shard}" if label_dir else shard
        if not os.path.lexists(os.path.join(folder, shard)):
            skipped.append(Skipped(shard_label, f"missing: listed in {label} but not in the directory"))
            continue
        try:
            files.append(read_file(os.path.join(folder, shard), shard_label))
        except CheckpointError as exc:
            skipped.append(Skipped(shard_label, _reason(exc, shard_label)))
    found = {e.key for fs in files for e in fs.entries}
    missing = [k for k in weight_map if k not in found]
    extra = sorted(found - set(weight_map))
    return Group(prefix, files, label, missing, extra)


def _reason(exc: CheckpointError, label: str) -> str:
    text = str(exc)
    return text[len(label) + 2:] if text.startswith(f"{label}: ") else text


def _shards_of(index_path: str) -> set[str]:
    try:
        doc = read_json(index_path, index_path)
        return {str(v) for v in doc.get("weight_map", {}).values()}
    except (CheckpointError, AttributeError):
        return set()


def _unit(full: str, prefix: str, label: str, is_index: bool, skipped: list[Skipped]) -> Group | None:
    try:
        if is_index:
            return _read_index(full, prefix, label, skipped)
        return Group(prefix, [read_file(full, label)])
    except CheckpointError as exc:
        skipped.append(Skipped(label, _reason(exc, label)))
        return None


def _dcp_unit(dirpath: str, prefix: str, label: str, skipped: list[Skipped]) -> Group | None:
    from torchdoctor._checkpoint.dcp import read_dcp

    try:
        return Group(prefix, [read_dcp(dirpath, label)])
    except CheckpointError as exc:
        skipped.append(Skipped(label, _reason(exc, label)))
        return None


_HF_BASES = {"model": "model", "pytorch_model": "model", "diffusion_pytorch_model": "diffusion_pytorch_model"}


def _hf_name(unit: str) -> tuple[str, str | None, str] | None:
    """(weights family, variant, format) of a Hugging Face weights file or shard index
    (``diffusion_pytorch_model.fp16.safetensors``, ``model.safetensors.index.json``), None for other names."""
    name = unit[: -len(".index.json")] if unit.endswith(".index.json") else unit
    stem, _, ext = name.rpartition(".")
    if ext not in ("safetensors", "bin"):
        return None
    base, _, variant = stem.partition(".")
    family = _HF_BASES.get(base)
    return (family, variant or None, ext) if family is not None else None


def _what_loads(units: list[str], rel: str, skipped: list[Skipped]) -> list[str]:
    """In a Hugging Face model folder, the files ``from_pretrained`` loads: no variant unless only variants are
    there (``*.fp16.safetensors`` beside the full files is another copy of the same model), and safetensors over
    a ``.bin`` of the same weights. The others are listed as not checked, never judged as part of the model."""
    named = {u: _hf_name(u) for u in units}
    plain = [u for u, n in named.items() if n is not None and n[1] is None]
    keep = []
    for u in units:
        n = named[u]
        label = f"{rel}/{u}" if rel else u
        if n is None:
            keep.append(u)
        elif n[1] is not None and plain:
            skipped.append(Skipped(label, f"a {n[1]!r} variant of the weights beside it: from_pretrained loads it "
                                          f"only with variant={n[1]!r} (scan it alone to check it)", False))
        elif n[2] == "bin" and any(m is not None and m[0] == n[0] and m[1] == n[1] and m[2] == "safetensors"
                                   for m in named.values()):
            skipped.append(Skipped(label, "a .bin copy beside the .safetensors weights, which from_pretrained loads "
                                          "instead (scan it alone to check it)", False))
        else:
            keep.append(u)
    return keep


def collect(root: str) -> tuple[list[Group], str | None, list[Skipped]]:
    """The checkpoints in a file or directory, the directory layout, and the entries that were not checked."""
    name = os.path.basename(os.path.normpath(root)) or root
    skipped: list[Skipped] = []
    try:
        st = os.stat(root)
    except OSError as exc:
        if os.path.islink(root):
            raise CheckpointError(f"{root}: dangling symlink ({exc.strerror})") from None
        raise CheckpointError(f"{root}: no such file or directory" if isinstance(exc, FileNotFoundError)
                              else f"{root}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(st.st_mode):
        parent = os.path.dirname(os.path.abspath(root))
        if _in_dcp(root, parent):  # a .metadata or .distcp file alone (the pre-commit hook passes files)
            from torchdoctor._checkpoint.dcp import read_dcp

            return [Group("", [read_dcp(parent, root)])], None, skipped
        if root.endswith(".index.json"):
            return [_read_index(root, "", name, skipped)], None, skipped
        return [Group("", [read_file(root, name)])], None, skipped
    groups: list[Group] = []
    seen = {os.path.realpath(root)}
    stack = [(root, "", 0)]
    while stack:
        dirpath, rel, depth = stack.pop()
        try:
            with os.scandir(dirpath) as it:
                listing = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            skipped.append(Skipped(rel or ".", f"unreadable directory ({exc.strerror or exc}): not scanned"))
            continue
        names = {e.name for e in listing}
        if ".metadata" in names and any(n.endswith(".distcp") for n in names):
            if not rel:  # the directory asked for is itself one checkpoint: unreadable means exit 2, one line
                from torchdoctor._checkpoint.dcp import read_dcp

                return [Group("", [read_dcp(dirpath, name)])], None, skipped
            group = _dcp_unit(dirpath, rel, rel, skipped)
            groups += [group] if group else []
            continue
        files: list[str] = []
        subdirs: list[tuple[str, str]] = []
        for e in listing:
            if e.name.startswith("."):
                continue
            label = f"{rel}/{e.name}" if rel else e.name
            relevant = e.name.endswith(EXTENSIONS + (".index.json",))
            try:
                mode = e.stat().st_mode  # follows symlinks
            except OSError as exc:
                if e.is_symlink():  # it may have named a checkpoint or a directory of them: say so
                    skipped.append(Skipped(label, f"dangling symlink to {os.readlink(e.path)!r} ({exc.strerror})"))
                elif relevant:
                    skipped.append(Skipped(label, f"cannot read ({exc.strerror or exc})"))
                continue
            if stat.S_ISDIR(mode):
                real = os.path.realpath(e.path)
                if real in seen:
                    skipped.append(Skipped(label, f"symlink to {real!r}, a directory already scanned: not scanned again"))
                elif depth + 1 > _MAX_DIR_DEPTH:
                    skipped.append(Skipped(label, f"deeper than {_MAX_DIR_DEPTH} levels: not scanned"))
                else:
                    seen.add(real)
                    subdirs.append((e.path, label))
            elif stat.S_ISREG(mode):
                if relevant:
                    files.append(e.name)
            elif relevant:
                skipped.append(Skipped(label, f"{file_kind(mode)}, not a checkpoint file: not read"))
        indexes = [f for f in files if f.endswith(".index.json")]
        sharded = set().union(*(_shards_of(os.path.join(dirpath, i)) for i in indexes)) if indexes else set()
        units = indexes + [f for f in files if f.endswith(EXTENSIONS) and f not in sharded]
        if "config.json" in names and len(units) > 1:  # a Hugging Face model (or pipeline component) folder
            units = _what_loads(units, rel, skipped)
        for unit in units:
            prefix = rel if len(units) == 1 else f"{rel}/{unit}" if rel else unit
            label = f"{rel}/{unit}" if rel else unit
            group = _unit(os.path.join(dirpath, unit), prefix, label, unit in indexes, skipped)
            groups += [group] if group else []
        stack.extend(reversed([(path, label, depth + 1) for path, label in subdirs]))
    if not groups and not skipped:
        raise CheckpointError(f"{root}: no checkpoint files ({', '.join(EXTENSIONS)}), shard index or distributed "
                              "checkpoint in this directory")
    layout = (
        "diffusers" if os.path.isfile(os.path.join(root, "model_index.json"))
        else "transformers" if os.path.isfile(os.path.join(root, "config.json")) else None
    )  # fmt: skip
    return groups, layout, skipped


@contextmanager
def gc_paused() -> Iterator[None]:
    """Unpickling builds many small objects; the cyclic GC would rescan the whole heap (torch's included)
    several times for a 4,000-tensor pickle, tripling the scan time. Nothing a scan builds forms cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

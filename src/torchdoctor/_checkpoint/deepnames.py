"""The globals named by storage blobs nested deeper than the reader builds them, by their opcodes alone.

``pickle.dumps(tensor)`` embeds each storage as a small ``torch.save`` stream (``torch.storage._load_from_bytes``);
a blob inside a blob inside a blob is never written by torch and is refused (building fanout ** depth blobs is a
bomb), but a refusal must still name what ``torch.load`` would import down there. So the deeper blobs are only
read for their names: every ``GLOBAL`` / ``INST`` / ``STACK_GLOBAL`` of every pickle in the stream and, through
every bytes argument that is itself a stream, of the blobs below, each distinct blob once, on a byte budget.
"""

from __future__ import annotations

import pickletools

__all__ = ["names_in"]

_MAX_BYTES = 64 * 1024 * 1024  # all streams read for names, together
_MAX_BLOBS = 10_000
_STRINGS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING",
                      "SHORT_BINSTRING"})  # fmt: skip
_BYTES = frozenset({"BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"})


def _pickles(raw: bytes, blobs: list[bytes], names: list[str]) -> None:
    """Names in consecutive pickles of ``raw`` (a legacy stream holds five); bytes arguments are queued."""
    import io

    from torchdoctor._checkpoint.unpickle import _compat  # the names Python's unpickler resolves (py2 aliases)
    from torchdoctor._checkpoint.known import torch_allows

    def add(module: object, name: object) -> None:
        if isinstance(module, str) and isinstance(name, str):
            full = ".".join(_compat(module, name))
            if not torch_allows(full) and full != "torch.storage._load_from_bytes":
                names.append(full)
        else:
            names.append("a global whose name is computed at load time")

    f = io.BytesIO(raw)
    while f.tell() < len(raw):
        strings: list[object] = []
        memo: dict[int, object] = {}
        try:
            for op, arg, _ in pickletools.genops(f):
                if op.name in _STRINGS:
                    strings.append(arg)
                elif op.name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                    memo[len(memo) if op.name == "MEMOIZE" else int(arg or 0)] = strings[-1] if strings else None
                elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                    strings.append(memo.get(int(arg or 0)))
                elif op.name in ("GLOBAL", "INST"):
                    module, _, name = str(arg).partition(" ")
                    add(module, name)
                elif op.name == "STACK_GLOBAL":
                    add(*(strings[-2:] if len(strings) >= 2 else (None, None)))
                elif op.name in _BYTES and isinstance(arg, (bytes, bytearray)):
                    blobs.append(bytes(arg))
        except Exception:  # a damaged pickle ends the stream: torch.load would stop there too
            return


def names_in(raw: bytes) -> tuple[str, ...]:
    """Globals outside torch's weights-only allow-list named anywhere in ``raw`` or the blobs it embeds.

    >>> import pickle, os
    >>> names_in(b"cos\\nsystem\\n(S'x'\\ntR.")
    ('os.system',)
    >>> names_in(pickle.dumps({"w": [1, 2]}))
    ()
    """
    import zipfile

    names: list[str] = []
    queue: list[bytes] = [raw]
    seen: set[int] = set()
    spent = 0
    while queue and spent < _MAX_BYTES and len(seen) < _MAX_BLOBS:
        blob = queue.pop()
        key = hash(blob)
        if key in seen:
            continue
        seen.add(key)
        spent += len(blob)
        if blob.startswith(b"PK\x03\x04"):  # a zip stream: every pickle member in it
            try:
                import io

                with zipfile.ZipFile(io.BytesIO(blob)) as z:
                    for info in z.infolist()[:1000]:
                        if info.filename.lower().endswith(".pkl") and info.file_size <= _MAX_BYTES - spent:
                            queue.append(z.read(info))
            except Exception:  # a damaged archive: torch.load stops there too
                pass
            continue
        if blob[:1] == b"\x80" or blob[:1] in b"c(}]":
            _pickles(blob, queue, names)
    return tuple(dict.fromkeys(names))

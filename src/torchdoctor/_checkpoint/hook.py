"""The pre-commit hook for files without an extension: checked by content, the others skipped with a note.

``torch.load`` and ``pickle.load`` read a file whatever its name, so ``.pre-commit-hooks.yaml`` passes every staged
file without an extension here (``torchdoctor-checkpoints-by-content``). Each is looked at cheaply: a zip holding
a pickle or a ``torch.export`` archive, a tar holding torch's members, a safetensors header, or bytes that parse
as a whole pickle are scanned as ``torchdoctor scan -q`` scans them (same verdicts, same exit codes); anything
else (a script, a licence, an image, a git-LFS pointer of some other file, a pickle of plain data holding no
tensor and nothing that can run code) is skipped, with exit 0 and one line.

    python -m torchdoctor._checkpoint.hook FILE...
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence

__all__ = ["main", "not_a_checkpoint"]

_WINDOW = 4 * 1024 * 1024  # a pickle that does not end within this is not judged "not a checkpoint": scanned


def _zip_loadable(path: str) -> bool:
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            names = [n.lower() for n in z.namelist()]
    except Exception:  # a damaged zip that starts like one: torch.load would try it, so the scan says why not
        return True
    return any(n.endswith(".pkl") or n.endswith("/archive_format") for n in names)


def _tar_loadable(path: str) -> bool:
    import tarfile

    from torchdoctor._checkpoint.tarcheck import MEMBERS

    try:
        with tarfile.open(path, mode="r:") as tar:
            return any(m.name in MEMBERS for m in tar.getmembers())
    except Exception:  # tarfile gives up: torch.load reads the file as pickles, judged below
        return False


def _pickle_shaped(head: bytes, size: int) -> bool:
    """Bytes that parse as one whole pickle from the start: what pickle.load and torch.load would unpickle."""
    from torchdoctor._checkpoint.bounds import Budget, prescan
    from torchdoctor._checkpoint.errors import CheckpointError

    try:
        prescan(head, 0, Budget(label="hook"), "hook")
    except CheckpointError as exc:
        return "truncated pickle" in str(exc) and len(head) < size  # runs past the window: scan it whole
    except Exception:  # opcode tables and arguments of arbitrary bytes: not a pickle
        return False
    return True


def not_a_checkpoint(path: str) -> str | None:
    """Why ``path`` is nothing torch.load, pickle.load or safetensors would read; None when it must be scanned.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "LICENSE")
    >>> _ = open(p, "w").write("MIT License\\n")
    >>> not_a_checkpoint(p)
    'not a pickle, torch.save zip, torch < 0.4 tar or safetensors file'
    """
    from torchdoctor._checkpoint.collect import _safetensors_shaped
    from torchdoctor._checkpoint.errors import LFS_POINTER
    from torchdoctor._checkpoint.tarcheck import looks_like_tar

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        with open(path, "rb") as f:
            head = f.read(_WINDOW)
    except OSError as exc:
        return None if os.path.lexists(path) else f"cannot read ({exc.strerror or exc})"
    if not head:
        return "empty"
    if head.startswith(LFS_POINTER):
        return "a git-LFS pointer"
    if head.startswith(b"PK\x03\x04"):
        return None if _zip_loadable(path) else "a zip archive without a pickle: torch.load cannot read it"
    if looks_like_tar(head) and _tar_loadable(path):
        return None
    if _safetensors_shaped(head, st.st_size) or _pickle_shaped(head, st.st_size):
        return None
    return "not a pickle, torch.save zip, torch < 0.4 tar or safetensors file"


def _holds_nothing(path: str) -> bool:
    """A pickle of plain data (no tensor, nothing that can run code): ``scan`` says exit 2, "holds no tensors";
    a file without an extension that holds data is no checkpoint, so the hook lets it pass."""
    from torchdoctor._checkpoint.scan import CheckpointError, check_checkpoint
    from torchdoctor._cli.checkpoint import nothing_to_check

    try:
        return nothing_to_check(path, check_checkpoint(path)) is not None
    except CheckpointError:  # the scan below says what is wrong with it
        return False


def main(argv: Sequence[str] | None = None) -> int:
    files = list(sys.argv[1:] if argv is None else argv)
    scan = []
    for path in files:
        why = not_a_checkpoint(path)
        if why is None and _holds_nothing(path):
            why = "a pickle of plain data: no tensor, no global that can run code"
        if why is None:
            scan.append(path)
        else:
            print(f"{path}: skipped, {why}")
    if not scan:
        return 0
    from torchdoctor._cli.main import main as cli

    return cli(["scan", "-q", *scan])


if __name__ == "__main__":
    raise SystemExit(main())

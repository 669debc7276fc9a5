"""The two errors of a checkpoint read, in a module of their own: every reader raises them, and a safetensors
header read must not import the pickle machinery to name them. With them, the two facts every reader shares
before a format's own module is loaded: the signature of a git-LFS pointer (refused, whatever the file's name)
and the only tensor bytes ever read (here rather than in ``known``, so a safetensors file's first scan loads one
module less: issue 28)."""

from __future__ import annotations

__all__ = ["CheckpointError", "LFS_POINTER", "SMALL_READ", "UnsafePickle"]

LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"  # a git-LFS pointer file in place of the weights
SMALL_READ = 4096  # the only tensor bytes ever read: bitsandbytes' packed JSON quant_state


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: empty, truncated, corrupted or of an unsupported format (one line)."""


CheckpointError.__module__ = "torchdoctor"


class UnsafePickle(CheckpointError):
    """A pickle that fails to load, but only after naming globals that ``torch.load(weights_only=False)`` would
    already have imported and called: reported as those globals (exit 1), never as merely unreadable."""

    def __init__(self, message: str, globals_: tuple[str, ...]) -> None:
        super().__init__(message)
        self.globals = globals_

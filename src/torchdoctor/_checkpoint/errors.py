"""The two errors of a checkpoint read, in a module of their own: every reader raises them, and a safetensors
header read must not import the pickle machinery to name them."""

from __future__ import annotations

__all__ = ["CheckpointError", "UnsafePickle"]


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: empty, truncated, corrupted or of an unsupported format (one line)."""


CheckpointError.__module__ = "torchdoctor"


class UnsafePickle(CheckpointError):
    """A pickle that fails to load, but only after naming globals that ``torch.load(weights_only=False)`` would
    already have imported and called: reported as those globals (exit 1), never as merely unreadable."""

    def __init__(self, message: str, globals_: tuple[str, ...]) -> None:
        super().__init__(message)
        self.globals = globals_

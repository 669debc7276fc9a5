"""Checkpoint files without running pickle code: ``unpickle`` (restricted unpickler), ``torchfile`` (zip/legacy readers), ``checks`` and ``scan``."""

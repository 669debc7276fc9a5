"""Guard: the public context manager (``api``), its per-forward ``session``, the strict dispatch checks and the failure diagnosis."""

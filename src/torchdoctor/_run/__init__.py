"""``torchdoctor run``: an unmodified program, watched (and with ``--device``, on virtual devices)."""

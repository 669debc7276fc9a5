"""Move: ``plan`` (what would move where, and what is refused), ``apply`` (the move, its undo log, verification) and ``owners`` (quantized owners and write-back)."""

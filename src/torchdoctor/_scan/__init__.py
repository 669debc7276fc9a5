"""Scan: ``scan`` and ``assert_placement`` (``scan``), and the one placement policy (``policy``)."""

"""Across ranks: ``check`` every rank with the one policy over torch.distributed, and the ``--distributed`` command."""

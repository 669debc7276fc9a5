"""Across ranks: ``check`` every rank with the one policy over torch.distributed, and the ``--distributed`` command.

``torchdoctor.distributed.check(model, device="cuda:{local_rank}")`` is collective: every rank scans its own model,
``all_gather_object`` brings the results together, and every rank receives the same ``DistributedReport`` of
per-rank problems and cross-rank disagreements.
"""

from torchdoctor._distributed.check import check
from torchdoctor._distributed.report import (
    SCHEMA,
    Disagreement,
    DistributedReport,
    RankReport,
)

__all__ = ["SCHEMA", "Disagreement", "DistributedReport", "RankReport", "check"]

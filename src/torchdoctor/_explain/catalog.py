"""The assembled tables of ``explain``: importing this module registers every signature, cause and context rule.

Registries (``signatures``, ``causes``) sit below their tables (``sigs_device``, ``sigs_dtype``,
``causes_device``, ``causes_dtype``, ``rules``); this module sits above both, and the scanner and the API read the
tables only through it.
"""

from __future__ import annotations

from torchdoctor._explain import (apps, causes_device, causes_dtype, causes_extra, rules, sigs_device, sigs_dtype,
                                  sigs_fifteen, sigs_frames, sigs_more, sigs_own, sigs_platform, sigs_rare,
                                  sigs_eighteen, sigs_nineteen, sigs_seventeen, sigs_sixteen, sigs_thirteen,
                                  sigs_twelve, sigs_twenty, sigs_twentyone)
from torchdoctor._explain.causes import Cause, ContextRule, causes, context_rules
from torchdoctor._explain.signatures import CATEGORIES, Signature, signatures

__all__ = ["CATEGORIES", "Cause", "ContextRule", "Signature", "causes", "context_rules", "signatures"]

_TABLES = (sigs_device, sigs_dtype, sigs_frames, sigs_more, sigs_own, sigs_platform, sigs_rare, sigs_twelve,
           sigs_thirteen, sigs_fifteen, sigs_sixteen, sigs_seventeen, sigs_eighteen, sigs_nineteen, sigs_twenty,
           sigs_twentyone, causes_device, causes_dtype, causes_extra, rules, apps)  # imported for their registrations

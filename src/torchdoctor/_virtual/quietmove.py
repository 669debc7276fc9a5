"""The verb's own move of the object it checks (``simulate``'s ``obj.to(device, dtype)``, a TARGET's): float8 and
packed storage kept as the verb casts (``storage.kept``), and diffusers' warning that names no module silenced."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class _EmptyFp32(logging.Filter):
    # diffusers' ModelMixin.to warns on every .to(dtype), its list of float32 modules empty or not: empty, it names none
    def filter(self, record: logging.LogRecord) -> bool:
        return "should be kept in float32: []" not in record.getMessage()


@contextlib.contextmanager
def quiet_moves() -> Iterator[None]:
    from torchdoctor._virtual.storage import kept  # the verb's own cast keeps float8 and packed storage
    logger, quiet = logging.getLogger("diffusers.models.modeling_utils"), _EmptyFp32()
    logger.addFilter(quiet)
    try:
        with kept():
            yield
    finally:
        logger.removeFilter(quiet)

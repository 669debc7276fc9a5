"""Explain (torch-free): ``tokens`` (device/dtype words in error text, shared with guard), ``signatures`` and
``causes`` (registries) below their tables (``sigs_device``, ``sigs_dtype``, ``causes_device``, ``causes_dtype``,
``rules``), ``catalog`` (the assembled tables), ``scanner`` (logs in blocks), ``context`` (fields, flags, ranking),
``report`` (``Diagnosis``, ``ExplainReport``) and ``api``."""

"""Explain (torch-free): ``signatures`` of error texts, the ``scanner`` over logs, ``causes`` and ``context`` rules, the ``api``."""

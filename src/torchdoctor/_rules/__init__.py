"""The op rules of strict guard and simulate: ``registry`` (Rule, Rules, check) and ``table`` (the rules, as data).

Importing this package loads both, so every rule is registered; the registry never imports its table.
"""

from torchdoctor._rules import registry, table  # noqa: F401

"""Environment rules: ``registry`` (EnvFinding, rule, run_rules) and the rule tables ``builds``, ``packages`` and
``ranks`` (launched ranks: a device per rank, collective backends).

Importing this package registers every rule; the registry never imports its tables.
"""

from torchdoctor._env.rules import builds, packages, ranks, registry  # noqa: F401

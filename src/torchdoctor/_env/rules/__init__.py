"""Environment rules: ``registry`` (EnvFinding, rule, run_rules) and the rule tables ``builds`` and ``packages``.

Importing this package registers every rule; the registry never imports its tables.
"""

from torchdoctor._env.rules import builds, packages, registry  # noqa: F401

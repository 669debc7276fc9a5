"""The command line: ``main`` (argument parsing), ``common`` (usage errors, TARGET), one module per verb, and ``demo``."""

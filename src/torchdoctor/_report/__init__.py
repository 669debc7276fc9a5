"""Results and their rendering: ``text`` (torch-free: schema ids, exit codes, problem lists) and ``model``."""

"""Environment doctor (torch-free at import): ``facts``, ``versions``, ``devices`` (the device chooser), ``rules`` and the ``report``."""

"""Fixes as edits of the user's own files: ``diff`` (a unified diff that replaces one line, checked by ``git apply``
and ``patch -p1``)."""

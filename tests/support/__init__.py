"""Test support: the zoo of tiny real models (``zoo``) and the read-only invariant (``helpers``)."""

"""The one walker: every tensor reachable from an object, with the dotted path a user would type.

``walker`` walks (modules, attributes, containers, tensor-attached state); ``entry`` holds what a walk returns
(``Entry``, ``Walk``) and how a replacement is put back (``set_tensor``); ``kinds`` reads each kind of object and
tensor form (nested, sparse, quantized, DTensor, wrapper subclasses) without running user code.
"""

from torchdoctor._walk.entry import Entry, Walk, set_tensor
from torchdoctor._walk.kinds import describe, form_of, is_jagged_type
from torchdoctor._walk.walker import MAX_DEPTH, MAX_ITEMS, MAX_NODES, hook_chain, is_quant_type, walk

_is_quant_type = is_quant_type  # the name ``torchdoctor._move.owners`` imported before it was public

__all__ = ["MAX_DEPTH", "MAX_ITEMS", "MAX_NODES", "Entry", "Walk", "describe", "form_of", "hook_chain", "is_jagged_type",
           "is_quant_type", "set_tensor", "walk"]

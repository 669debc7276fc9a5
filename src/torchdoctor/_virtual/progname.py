"""The model as the program calls it in a fix of a ``virtual_devices`` block: the block's fix is written for the
program's own object (``net.table.data = ...``), never for a ``model`` the program does not have. When the block
ends, the program's frame that ran it is alive: the first frame of the program's own code whose locals hold the
model (``net``, or ``self.net`` / ``pipe.unet`` one attribute deep) names it (``apart.seen``). ``simulate`` works
on a copy no frame holds, so its fixes keep ``model``, the name of the object given to it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

# ``model`` as a fix's code names the object: ``model.lin``, ``model[0]``, ``torchdoctor.move(model, ...)``
_MODEL = re.compile(r"(?<![\w.'\"`])model(?=[.\[,)])")


def program_named(fixes: Sequence[Fix], root: Any) -> list[Fix]:
    """The fixes with ``model`` written as the program's name for ``root`` (unchanged when none is found, or the
    program calls it ``model``). Only the code is renamed: a proof judges the fix by the tensors it sets."""
    if not fixes or not isinstance(root, torch.nn.Module):
        return list(fixes)
    from torchdoctor._virtual.apart import named_before, seen

    name, late = seen(root).name, False
    if not name:  # the program has ended (``torchdoctor run``): its name when the module started, for a move of a
        name, late = named_before(root), True  # module (a tensor's path is named by the run's own names)
    if not name or name == "model":
        return list(fixes)
    for f in fixes:
        if f.kind in ("path", "note", "input") and "model" in f.code and not (
                late and not f.code.startswith("torchdoctor.move(")):
            code, _, comment = f.code.partition("  #")
            f.code = "\n".join(_MODEL.sub(name, line) for line in code.split("\n")) + (f"  #{comment}" if _ else "")
    return list(fixes)

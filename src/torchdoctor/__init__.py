"""torchdoctor: find, explain and fix device and dtype placement bugs in PyTorch.

Importing this package is cheap: it imports no torch device runtime, no rich and no transformers.
Public names load their module on first use.

>>> import torch, torchdoctor
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
>>> torchdoctor.scan(model).ok
True
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The one table of public names is the ``if TYPE_CHECKING:`` block at the end of this file: type checkers read it
# as imports, and at run time ``_public_table`` reads the same block to build ``__all__`` and the lazy loader.
# A public name is added by adding one import there. Public classes carry ``__module__ == "torchdoctor"`` through
# ``torchdoctor._report.text.public`` where they are defined, so errors print as ``torchdoctor.PlacementError``.


def _public_table() -> dict[str, tuple[str, str | None]]:
    """public name -> (private module, attribute); attribute ``None`` for a module exported whole.

    Read with string operations, not ``ast``: importing ``ast`` would double what ``import torchdoctor`` costs, and
    the block is kept to one ``from X import a, b as c`` per line (a test compares this reading with ``ast``'s)."""
    with open(os.path.join(os.path.dirname(__file__), "__init__.py"), encoding="utf-8") as fh:
        text = fh.read()
    table: dict[str, tuple[str, str | None]] = {}
    block = text[text.index("\nif TYPE_CHECKING:"):]
    for line in block.splitlines()[1:]:
        line = line.strip()
        if not line.startswith("from "):
            continue
        module, _, names = line[5:].partition(" import ")
        for item in names.split(","):
            name, _, asname = item.strip().partition(" as ")
            public = asname.strip() or name.strip()
            if module == "torchdoctor":  # ``from torchdoctor import _x as x``: a module exported whole
                table[public] = (f"torchdoctor.{name.strip()}", None)
            else:
                table[public] = (module, name.strip())
    return table


_TABLE = _public_table()
__all__ = list(_TABLE)


def __getattr__(name: str) -> Any:
    entry = _TABLE.get(name)
    if entry is None:
        raise AttributeError(f"module 'torchdoctor' has no attribute {name!r}")
    module = importlib.import_module(entry[0])
    value = module if entry[1] is None else getattr(module, entry[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover  (the public table: see above)
    from torchdoctor._scan.scan import scan, assert_placement
    from torchdoctor._move.apply import move
    from torchdoctor._guard.api import guard
    from torchdoctor._virtual.simulate import simulate
    from torchdoctor._virtual.session import virtual_devices
    from torchdoctor._explain.api import explain, install_excepthook
    from torchdoctor._env.report import collect_facts, env_report
    from torchdoctor._env.devices import pick_device, choose_device, capabilities, recommend_dtype
    from torchdoctor import _distributed as distributed
    from torchdoctor._report.model import TensorInfo, Problem, PlacementError, PlacementWarning, Target, ScanReport
    from torchdoctor._move.plan import MoveReport, PlanStep
    from torchdoctor._guard.api import Fix
    from torchdoctor._virtual.simulate import SimulationReport
    from torchdoctor._rules.profile import DeviceProfile
    from torchdoctor._explain.api import Diagnosis, ExplainReport
    from torchdoctor._env.report import EnvReport
    from torchdoctor._env.rules.registry import EnvFinding
    from torchdoctor._env.devices import DeviceChoice, DeviceUnavailableError
    from torchdoctor._checkpoint.unpickle import CheckpointError
    from torchdoctor._trace.api import trace, TraceRecord

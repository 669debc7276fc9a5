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
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "scan",
    "move",
    "guard",
    "simulate",
    "explain",
    "install_excepthook",
    "collect_facts",
    "env_report",
    "pick_device",
    "choose_device",
    "capabilities",
    "recommend_dtype",
    "assert_placement",
    "TensorInfo",
    "Problem",
    "PlacementError",
    "PlacementWarning",
    "Target",
    "ScanReport",
    "MoveReport",
    "SimulationReport",
    "DeviceProfile",
    "Diagnosis",
    "EnvReport",
    "DeviceChoice",
    "DeviceUnavailableError",
    "CheckpointError",
]

# public name -> private module that defines it
_LAZY = {
    "scan": "_scan",
    "assert_placement": "_scan",
    "move": "_move",
    "MoveReport": "_move",
    "guard": "_guard",
    "simulate": "_simulate",
    "SimulationReport": "_simulate",
    "DeviceProfile": "_profile",
    "explain": "_explain",
    "install_excepthook": "_explain",
    "Diagnosis": "_explain",
    "collect_facts": "_env",
    "env_report": "_env",
    "EnvReport": "_env",
    "pick_device": "_devices",
    "choose_device": "_devices",
    "capabilities": "_devices",
    "recommend_dtype": "_devices",
    "DeviceChoice": "_devices",
    "DeviceUnavailableError": "_devices",
    "CheckpointError": "_checkpoint",
    "TensorInfo": "_report",
    "Problem": "_report",
    "PlacementError": "_report",
    "PlacementWarning": "_report",
    "Target": "_report",
    "ScanReport": "_report",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchdoctor' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"torchdoctor.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._checkpoint import CheckpointError
    from torchdoctor._devices import DeviceChoice, DeviceUnavailableError, capabilities, choose_device, pick_device, recommend_dtype
    from torchdoctor._env import EnvReport, collect_facts, env_report
    from torchdoctor._explain import Diagnosis, explain, install_excepthook
    from torchdoctor._guard import guard
    from torchdoctor._move import MoveReport, move
    from torchdoctor._report import PlacementError, PlacementWarning, Problem, ScanReport, Target, TensorInfo
    from torchdoctor._scan import assert_placement, scan
    from torchdoctor._profile import DeviceProfile
    from torchdoctor._simulate import SimulationReport, simulate

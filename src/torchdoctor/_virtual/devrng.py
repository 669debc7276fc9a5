"""A virtual cuda or xpu device's default generators and seeds, and cuda's NVTX ranges, answered as a GPU build
answers them: ``torch.cuda.default_generators[i]`` is one generator per device (labelled ``cuda:i``),
``manual_seed``/``manual_seed_all``/``seed``/``initial_seed`` act on them, and ``torch.cuda.nvtx.range_push`` and
its kind are no-ops as without a profiler attached. Threads outside a run keep the real machine's answers."""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._virtual import tensor as V
from torchdoctor._virtual.devices_api import VirtualGenerator
from torchdoctor._virtual.tensor import Space

_NO_TRACKING = -2  # what NVTX's push and pop return when no tool is attached (NVTX_NO_PUSH_POP_TRACKING)


def _generators(space: Space, kind: str) -> tuple[Any, ...]:
    key = (id(_GENERATORS), kind)
    gens = space.api.get(key)
    if gens is None:
        count = space.api[(id(_GENERATORS), "count")]  # a CPU generator labelled with each device
        gens = space.api[key] = tuple(VirtualGenerator(f"{kind}:{i}") for i in range(count))
    return gens  # type: ignore[no-any-return]


class _DefaultGenerators(tuple):  # type: ignore[type-arg]
    """``torch.<kind>.default_generators`` for every thread at once: a run's generators in its threads, the real
    (empty on this build) tuple elsewhere."""

    kind: str
    real: Any

    def __new__(cls, kind: str, real: Any) -> _DefaultGenerators:
        self = super().__new__(cls)
        self.kind, self.real = kind, real
        return self

    def _now(self) -> tuple[Any, ...]:
        space = V.current_space()
        return self.real if space is None else _generators(space, self.kind)

    def __len__(self) -> int:
        return len(self._now())

    def __getitem__(self, i: Any) -> Any:
        return self._now()[i]

    def __iter__(self) -> Any:
        return iter(self._now())

    def __bool__(self) -> bool:
        return bool(self._now())

    def __repr__(self) -> str:
        return repr(self._now())


_GENERATORS: dict[str, _DefaultGenerators] = {}


class _Nvtx:
    """``torch.cuda.nvtx``'s C functions: in a run, a GPU build's answers with no profiler attached; elsewhere the
    stub's error this build raises."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __getattr__(self, name: str) -> Any:
        if V.current_space() is None:
            return getattr(self.real, name)
        return _NVTX_ANSWERS.get(name, _none)


def _none(*args: Any, **kwargs: Any) -> None:
    return None


_NVTX_ANSWERS = {"rangePushA": lambda msg: _NO_TRACKING, "rangePop": lambda: _NO_TRACKING,
                 "rangeStartA": lambda msg: 0, "rangeEnd": _none, "markA": _none}


def install(p: Any, profile: DeviceProfile, space: Space) -> None:
    """Into ``p`` (a ``devices_api.Installs``) for ``profile``'s device type, after ``devices_api.device_api``."""
    kind = profile.type
    mod = getattr(torch, kind, None)
    if kind not in ("cuda", "xpu") or mod is None:
        return
    space.api[(id(_GENERATORS), "count")] = profile.count
    shared = _GENERATORS.setdefault(kind, _DefaultGenerators(kind, mod.__dict__.get("default_generators", ())))
    p.set(mod, "default_generators", shared, shared=True)

    def gens() -> tuple[Any, ...]:
        return _generators(space, kind)

    def manual_seed(seed: Any) -> None:
        gens()[space.current.get(kind, 0)].manual_seed(int(seed))

    def manual_seed_all(seed: Any) -> None:
        for g in gens():
            g.manual_seed(int(seed))

    def seed() -> None:
        gens()[space.current.get(kind, 0)].seed()

    def seed_all() -> None:
        for g in gens():
            g.seed()

    p.many(mod, {"manual_seed": manual_seed, "manual_seed_all": manual_seed_all, "seed": seed, "seed_all": seed_all,
                 "initial_seed": lambda: gens()[space.current.get(kind, 0)].initial_seed()})
    nvtx = getattr(mod, "nvtx", None)
    real = getattr(nvtx, "_nvtx", None)
    if kind == "cuda" and real is not None and type(real).__name__ == "_NVTXStub":  # a GPU build has its own
        p.set(nvtx, "_nvtx", _NVTX_SHARED.setdefault("cuda", _Nvtx(real)), shared=True)


_NVTX_SHARED: dict[str, _Nvtx] = {}

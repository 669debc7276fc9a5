"""What virtual hardware says about itself: its properties, and the memory a run put on each virtual device
(answered by the runtime's memory functions with the real keys, judged against the profile's memory at the end).

Counted: every tensor a move or a factory places on a virtual device (weights, buffers, inputs, caches a program
builds with ``device=``), once per storage, until it is freed. Not counted: intermediate results of ops
(activations), the allocator's rounding and fragmentation. So the numbers are a lower bound of what real hardware
needs, and a run whose placed tensors alone exceed the device is certain not to fit.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
from collections.abc import Iterator
import weakref
from collections import OrderedDict
from typing import Any

import torch

from torchdoctor._report.model import Problem
from torchdoctor._rules.profile import DeviceProfile

_GIB = 1024**3
_LARGE = 1024**2  # torch's caching allocator: requests of 1 MiB and more go to the large pool
_METRICS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes", "active_bytes",
            "inactive_split_bytes", "requested_bytes")
_POOLS = ("all", "large_pool", "small_pool")
_STATS = ("current", "peak", "allocated", "freed")
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
             "num_oom_rejections", "max_split_size")


def gib(n: int) -> str:
    """``132 GiB`` / ``1.5 GiB`` / ``12.0 MiB``: as a person reads a memory size."""
    if n >= 10 * _GIB:
        return f"{n / _GIB:.0f} GiB"
    if n >= _GIB:
        return f"{n / _GIB:.1f} GiB"
    return f"{n / 1024**2:.1f} MiB"


class DeviceProperties(types.SimpleNamespace):
    """``torch.cuda.get_device_properties``: the attributes real code reads (a ``_CudaDeviceProperties``)."""

    def __repr__(self) -> str:
        d = self.__dict__
        return (f"_CudaDeviceProperties(name='{d['name']}', major={d['major']}, minor={d['minor']}, "
                f"total_memory={d['total_memory'] // 1024**2}MB, multi_processor_count={d['multi_processor_count']})")


def properties(profile: DeviceProfile) -> DeviceProperties:
    major, minor = profile.capability
    return DeviceProperties(
        name=profile.name or f"virtual {profile.type}", total_memory=profile.memory, major=major, minor=minor,
        multi_processor_count=132, is_integrated=False, is_multi_gpu_board=False, type=profile.type,
        max_threads_per_multi_processor=2048, warp_size=32, regs_per_multiprocessor=65536, L2_cache_size=50 * 1024**2,
        gcnArchName="", uuid="00000000-0000-0000-0000-000000000000", pci_bus_id=0, pci_device_id=0, pci_domain_id=0,
        max_compute_units=64, gpu_eu_count=512, gpu_subslice_count=64, max_work_group_size=1024, max_num_sub_groups=64,
        sub_group_sizes=[16, 32], driver_version="virtual", version="virtual", platform_name="virtual",
        has_fp16=True, has_fp64=profile.supports("float64", "compute"), has_atomic64=True)


class _Pool:
    __slots__ = ("count", "bytes")

    def __init__(self) -> None:
        self.count = [0, 0, 0, 0]  # current, peak, allocated, freed
        self.bytes = [0, 0, 0, 0]

    def add(self, n: int, sign: int) -> None:
        for row, amount in ((self.count, 1), (self.bytes, n)):
            row[0] += sign * amount
            row[2 if sign > 0 else 3] += amount
            row[1] = max(row[1], row[0])

    def reset_peak(self) -> None:
        self.count[1], self.bytes[1] = self.count[0], self.bytes[0]


class Ledger:
    """Bytes held on each virtual device of one run; thread-safe (a run's threads place tensors too)."""

    def __init__(self, profile: DeviceProfile) -> None:
        self.profile = profile
        self._pools: dict[tuple[int, str], _Pool] = {}
        self._live: dict[int, tuple[int, int, Any]] = {}  # id(storage holder) -> (index, bytes, weakref)
        # reentrant: creating the weakref below can run the garbage collector, and with it `_dropped` of another
        # tensor on this same thread, while `add` holds the lock (a plain Lock deadlocked the test suite there)
        self._lock = threading.RLock()
        self.largest: dict[int, tuple[int, str]] = {}  # index -> (bytes, path) of the largest named tensor

    def _pool(self, index: int, name: str) -> _Pool:
        pool = self._pools.get((index, name))
        if pool is None:
            pool = self._pools[(index, name)] = _Pool()
        return pool

    def add(self, t: Any) -> None:
        """A virtual tensor placed on a device of the profile's type (anything else is ignored)."""
        dev, elem = getattr(t, "_td_device", None), getattr(t, "_td_elem", None)
        if dev is None or elem is None or dev.type != self.profile.type:
            return
        key = id(elem)  # wrappers share their inner tensor: a Parameter made around a moved tensor is one storage
        index = dev.index or 0
        n = int(elem.numel()) * int(elem.element_size())
        with self._lock:
            if key in self._live:
                return
            try:
                ref = weakref.ref(elem, functools.partial(self._dropped, key))
            except TypeError:
                return
            self._live[key] = (index, n, ref)
            for name in ("all", "large_pool" if n >= _LARGE else "small_pool"):
                self._pool(index, name).add(n, 1)
            path = getattr(t, "_td_path", None)
            if path and n > self.largest.get(index, (0, ""))[0]:
                self.largest[index] = (n, path)

    def _dropped(self, key: int, _ref: Any) -> None:
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is not None:
                index, n, _ = entry
                for name in ("all", "large_pool" if n >= _LARGE else "small_pool"):
                    self._pool(index, name).add(n, -1)

    def allocated(self, index: int) -> int:
        return self._pool(index, "all").bytes[0]

    def peak(self, index: int) -> int:
        return self._pool(index, "all").bytes[1]

    def free(self, index: int) -> int:
        return max(self.profile.memory - self.allocated(index), 0)

    def reset_peak(self, index: int) -> None:
        with self._lock:
            for name in _POOLS:
                self._pool(index, name).reset_peak()

    def stats(self, index: int) -> dict[str, int]:
        """``torch.cuda.memory_stats(device)``: every key real PyTorch gives, sorted as it sorts them."""
        out: dict[str, int] = {}
        for metric in _METRICS:
            for name in _POOLS:
                pool = self._pool(index, name)
                row = pool.bytes if metric.endswith("_bytes") else pool.count
                if metric.startswith("inactive_split"):
                    row = [0, 0, 0, 0]  # nothing is split: every placed tensor is its own block
                for stat, value in zip(_STATS, row):
                    out[f"{metric}.{name}.{stat}"] = value
        for name in ("oversize_allocations", "oversize_segments"):
            for stat in _STATS:
                out[f"{name}.{stat}"] = 0
        out.update({k: 0 for k in _COUNTERS})
        all_pool = self._pool(index, "all")
        out["num_device_alloc"], out["num_device_free"] = all_pool.count[2], all_pool.count[3]
        out["max_split_size"] = -1  # real default: no limit
        return OrderedDict(sorted(out.items()))  # type: ignore[return-value]

    def nested(self, index: int) -> dict[str, Any]:
        """``memory_stats_as_nested_dict``: the same numbers, split on the dots."""
        root: dict[str, Any] = {}
        for key, value in self.stats(index).items():
            node = root
            parts = key.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        return root

    def summary(self, index: int, kind: str) -> str:
        """``memory_summary``: a short table in the real one's spirit (the real layout is not an interface)."""
        s = self.stats(index)
        rows = [f"|{'':=<75}|", f"| PyTorch virtual memory summary, device {kind}:{index} ({self.profile.name or kind})"
                f"{'':<10}|", f"|{'':-<75}|", f"| {'Metric':<28}| {'Cur Usage':>14} | {'Peak Usage':>14} | "
                f"{'Total':>11} |"]
        for label, key in (("Allocated memory", "allocated_bytes"), ("Active memory", "active_bytes"),
                           ("GPU reserved memory", "reserved_bytes")):
            rows.append(f"| {label:<28}| {gib(s[key + '.all.current']):>14} | {gib(s[key + '.all.peak']):>14} | "
                        f"{gib(self.profile.memory):>11} |")
        rows.append(f"|{'':=<75}|")
        return "\n".join(rows)

    def problems(self) -> list[Problem]:
        """One ``memory`` problem per device whose peak exceeded the profile's memory."""
        out = []
        kind, total = self.profile.type, self.profile.memory
        for index in sorted({i for i, _ in self._pools}):
            peak = self.peak(index)
            if peak <= total:
                continue
            where = f"{kind}:{index}"
            big = self.largest.get(index)
            largest = f"; the largest tensor is {big[1]} ({gib(big[0])})" if big else ""
            out.append(Problem(
                "memory", where, "device", gib(peak), f"<= {gib(total)}",
                f"needs {gib(peak)} on {where}, which has {gib(total)} ({self.profile.name or 'the profile'}){largest}:"
                f" real hardware raises torch.OutOfMemoryError. Load in a smaller dtype or quantized, offload "
                "(device_map='auto', enable_model_cpu_offload()), or split across devices", op="memory"))
        return out


_LEDGERS: weakref.WeakKeyDictionary[Any, Ledger] = weakref.WeakKeyDictionary()


def ledger(space: Any, profile: DeviceProfile | None = None) -> Ledger | None:
    """The ledger of ``space``'s run (made on first use when ``profile`` is given)."""
    found = _LEDGERS.get(space)
    if found is None and profile is not None:
        found = _LEDGERS[space] = Ledger(profile)
    return found


def functions(led: Ledger, index_of: Any) -> dict[str, Any]:
    """The memory functions of ``torch.cuda`` / ``torch.xpu`` / ``torch.accelerator`` answered from ``led``;
    ``index_of(device)`` is the runtime's device-argument reading (None is the current device)."""
    total = led.profile.memory

    def cur(device: Any = None) -> int:
        return led.allocated(index_of(device))

    def peak(device: Any = None) -> int:
        return led.peak(index_of(device))

    def reset(device: Any = None) -> None:
        led.reset_peak(index_of(device))

    return {
        "memory_allocated": cur, "max_memory_allocated": peak, "memory_reserved": cur, "max_memory_reserved": peak,
        "memory_cached": cur, "max_memory_cached": peak, "device_memory_used": cur,
        "memory_stats": lambda device=None: led.stats(index_of(device)),
        "memory_stats_as_nested_dict": lambda device=None: led.nested(index_of(device)),
        "memory_summary": lambda device=None, abbreviated=False: led.summary(index_of(device), led.profile.type),
        "mem_get_info": lambda device=None: (led.free(index_of(device)), total),
        "get_memory_info": lambda device=None: (led.free(index_of(device)), total),
        "reset_peak_memory_stats": reset, "reset_max_memory_allocated": reset, "reset_max_memory_cached": reset,
        "memory_usage": lambda device=None: int(100 * led.allocated(index_of(device)) / max(total, 1)),
        "get_per_process_memory_fraction": lambda device=None: 1.0,
        "memory_snapshot": lambda *a, **k: [], "list_gpu_processes": lambda device=None: "no processes (virtual device)",
    }


def ran_on(space: Any) -> tuple[str, ...]:
    """The virtual devices ``space``'s run placed tensors on (moves, factories), in index order."""
    led = _LEDGERS.get(space)
    if led is None:
        return ()
    kind = led.profile.type
    return tuple(f"{kind}:{i}" for i in sorted({i for (i, name), pool in led._pools.items()
                                                if name == "all" and pool.count[2]}))


def over_memory(space: Any) -> list[Problem]:
    """The ``memory`` problems of ``space``'s finished run (none when it placed nothing on a virtual device)."""
    led = _LEDGERS.get(space)
    return led.problems() if led is not None else []


_VENDOR = {"cuda": "nvidia", "xpu": "intel", "mps": "apple"}
_FAMILY = {"layer_norm": "norm", "softmax": "compute"}  # the env probe's families in the profile's words


def env_view() -> dict[str, Any] | None:
    """What ``pick_device`` / ``capabilities`` / ``env_report`` see in this thread: the run's hardware, or None."""
    from torchdoctor._virtual.tensor import current_space

    space = current_space()
    led = _LEDGERS.get(space) if space is not None and not space.closed else None
    if led is None:
        return None
    p = led.profile
    name = p.name or f"virtual {p.type}"
    return {"type": p.type,
            "facts": {f"{p.type}_available": True, f"{p.type}_device_count": p.count,
                      "devices": [{"name": name, "vendor": _VENDOR.get(p.type, p.type)}]},
            "run": lambda fam, dt: None if p.supports(dt, _FAMILY.get(fam) or fam) else f"{name} cannot run {fam} in {dt}",
            "outside": lambda: _outside(space)}


@contextlib.contextmanager
def _outside(space: Any) -> Iterator[None]:
    """The real machine for a moment, in a thread of a run (the env probe's own ops on the CPU)."""
    from torchdoctor._virtual.tensor import swap_space

    prev = swap_space(None)
    try:
        with torch._C.DisableTorchFunction():
            yield
    finally:
        swap_space(prev)

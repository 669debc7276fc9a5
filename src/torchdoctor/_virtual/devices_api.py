"""The device runtime APIs of a virtual ``DeviceProfile``, answered only to the threads of a simulation.

``torch.cuda`` / ``torch.xpu`` / ``torch.mps`` / ``torch.accelerator`` answer availability, count, current device,
capability, properties, ``mem_get_info``, streams, events, synchronize and seeding; ``torch.Generator(device)``
works; the legacy types (``torch.cuda.FloatTensor(...)``) build virtual tensors. Each patched name is a switch:
a thread running a simulation (or started by one: threads and thread-pool tasks inherit it) gets that run's
answer, every other thread gets the real one, so concurrent simulations in different threads each see their own
hardware and the rest of the process sees the real machine. A switch stays installed while any run uses it.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.thread
import contextlib
import functools
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._virtual import hardware
from torchdoctor._virtual import tensor as V
from torchdoctor._virtual.legacy import legacy_types
from torchdoctor._virtual.tensor import Space

_MISSING = object()
# filled by ``runtime`` (which imports this module): the mode a thread of a run enters
ENTER: list[Callable[[Space], Any]] = []
_LOCK = threading.RLock()
# (id(owner), name) -> [owner, name, original, users]
_INSTALLED: dict[tuple[int, str], list[Any]] = {}


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _switch(key: tuple[int, str], original: Any) -> Callable[..., Any]:
    def switch(*args: Any, **kwargs: Any) -> Any:
        space = V.current_space()
        impl = space.api.get(key) if space is not None else None
        if impl is None:
            if original is _MISSING:
                raise AttributeError(f"{key[1]} is not available outside a simulation")
            return original(*args, **kwargs)
        return impl(*args, **kwargs)

    return switch


class Installs:
    """The names one run patched; ``set`` installs a switch (or a shared value) once for all concurrent runs."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.keys: list[tuple[int, str]] = []

    def set(self, owner: Any, name: str, value: Any, shared: bool = False) -> None:
        """``shared``: one value for every thread (classes that dispatch themselves, pass-through wrappers)."""
        key = (id(owner), name)
        if not shared:
            self.space.api[key] = value
        with _LOCK:
            slot = _INSTALLED.get(key)
            if slot is None:
                original = owner.__dict__.get(name, _MISSING)
                slot = _INSTALLED[key] = [owner, name, original, 0]
                fallback = getattr(owner, name, _MISSING) if original is _MISSING else original
                setattr(owner, name, value if shared else _switch(key, fallback))
            slot[3] += 1
        self.keys.append(key)

    def many(self, owner: Any, values: dict[str, Any]) -> None:
        for name, value in values.items():
            if hasattr(owner, name):
                self.set(owner, name, value, shared=isinstance(value, type))

    def release(self) -> None:
        with _LOCK:
            for key in reversed(self.keys):
                slot = _INSTALLED.get(key)
                if slot is None:
                    continue
                slot[3] -= 1
                if slot[3] <= 0:
                    owner, name, original = slot[0], slot[1], slot[2]
                    del _INSTALLED[key]
                    if original is _MISSING:
                        with contextlib.suppress(AttributeError):
                            delattr(owner, name)
                    else:
                        setattr(owner, name, original)
        self.keys.clear()


def active_runs() -> int:
    """How many simulations are running in this process (any thread)."""
    with _LOCK:
        slot = _INSTALLED.get((id(torch), "compile"))
        return int(slot[3]) if slot is not None else 0


# -- streams, events, generators, legacy tensor types --------------------------------------------------------------


class VirtualStream:
    """A stream or event on a virtual device: work is ordered already, so waiting and syncing do nothing."""

    _td_original: Any = _MISSING

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if V.current_space() is None and cls._td_original is not _MISSING:
            return cls._td_original(*args, **kwargs)  # another thread: the real class
        return object.__new__(cls)

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        space = V.current_space()
        kind = space.vtype if space is not None else "cuda"
        self.device = space.norm(kind if device is None else device) if space is not None else torch.device(kind, 0)
        self.priority, self.cuda_stream, self.sycl_queue = priority, 0, 0

    wait_stream = wait_event = synchronize = record = wait = _nothing

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else VirtualStream()

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:  # optimizers ask before each step (CUDA graph capture)
        return False

    def elapsed_time(self, end_event: Any) -> float:
        return 0.0

    def __enter__(self) -> VirtualStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def stream_class(name: str, original: Any = _MISSING) -> type:
    """One class per name and original for the process: a run's enter made them anew each time (with the legacy
    types, ~0.4 ms of class creation a run)."""
    key = (name, id(original))
    hit = _CLASSES.get(key)
    if hit is None or hit[0] is not original:
        hit = _CLASSES[key] = (original, type(name, (VirtualStream,), {"_td_original": original}))
    return hit[1]  # type: ignore[no-any-return]


_CLASSES: dict[tuple[str, int], tuple[Any, type]] = {}  # (name, id(original)) -> (original, class)


class _GeneratorMeta(type(torch._C.Generator)):  # type: ignore[misc]
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, torch._C.Generator)


class VirtualGenerator(torch._C.Generator, metaclass=_GeneratorMeta):
    """``torch.Generator("cuda:1")``: a CPU generator underneath, labelled with the virtual device."""

    def __new__(cls, device: Any = "cpu") -> Any:
        space = V.current_space()
        if space is None:
            return torch._C.Generator(device)  # another thread: the real one
        g = super().__new__(cls, "cpu")  # type: ignore[call-arg]
        g.__dict__["_td_device"] = space.norm(device)
        return g

    def __init__(self, device: Any = "cpu") -> None:
        pass

    device = property(lambda self: self.__dict__["_td_device"])  # type: ignore[assignment]


# -- the profile's answers -----------------------------------------------------------------------------------------


def _check_index(profile: DeviceProfile, space: Space, device: Any) -> int:
    d = space.norm(profile.type if device is None else device)
    if (d.index or 0) >= profile.count:
        raise RuntimeError(f"invalid device ordinal: {d} (the simulated profile has {profile.count} {profile.type} "
                           "device(s); pass DeviceProfile(count=...))")
    return d.index or 0


def device_api(p: Installs, profile: DeviceProfile, space: Space) -> None:
    """``torch.cuda`` / ``torch.xpu`` / ``torch.mps`` (and the matching parts of ``torch.accelerator``)."""
    kind = profile.type
    major, minor = profile.capability
    props = hardware.properties(profile)
    led = hardware.ledger(space, profile)
    assert led is not None
    mem = hardware.functions(led, lambda device=None: _check_index(profile, space, device))

    def current() -> int:
        return space.current.get(kind, 0)

    def set_device(device: Any) -> None:
        if not (isinstance(device, int) and device < 0):
            space.current[kind] = _check_index(profile, space, device)

    def exchange(device: int) -> int:
        prev = current()
        set_device(device)
        return prev

    @contextlib.contextmanager
    def device_index(device: Any) -> Iterator[None]:
        prev = current()
        if device is not None:
            set_device(device)
        try:
            yield
        finally:
            space.current[kind] = prev

    mod = getattr(torch, kind, None)
    rng = lambda device=None: torch.zeros(16, dtype=torch.uint8)  # noqa: E731
    stream_cls = stream_class("Stream", getattr(mod, "Stream", _MISSING))
    stream = lambda device=None: stream_cls(device)  # noqa: E731
    common = {
        "is_available": lambda *a, **k: True, "device_count": lambda: profile.count, "synchronize": _nothing,
        "empty_cache": _nothing, **mem, "manual_seed": _nothing,
        "seed": _nothing, "get_rng_state": rng, "set_rng_state": _nothing, "current_stream": stream,
        "set_stream": _nothing, "set_per_process_memory_fraction": _nothing,
    }
    if kind in ("cuda", "xpu"):
        p.many(mod, dict(
            common, is_initialized=lambda: True, init=_nothing, _lazy_init=_nothing, current_device=current,
            set_device=set_device, _exchange_device=exchange, _maybe_exchange_device=exchange,
            get_device_name=lambda device=None: props.name, get_device_capability=lambda device=None: (major, minor),
            get_device_properties=lambda device=None: (_check_index(profile, space, device), props)[1],
            reset_accumulated_memory_stats=_nothing, is_current_stream_capturing=lambda: False, get_arch_list=list,
            # torch answers True below sm80 too unless asked for native support (a bf16 tensor can be made there,
            # and autocast asks exactly this): only including_emulation=False tells the hardware
            is_bf16_supported=lambda including_emulation=True: (including_emulation and kind == "cuda"
                                                                and profile.supports(torch.bfloat16, "storage"))
            or profile.supports(torch.bfloat16, "matmul") and (kind != "cuda" or (major, minor) >= (8, 0)),
            is_tf32_supported=lambda: kind == "cuda" and (major, minor) >= (8, 0), manual_seed_all=_nothing,
            seed_all=_nothing, initial_seed=lambda: 0, get_rng_state_all=lambda: [rng() for _ in range(profile.count)],
            set_rng_state_all=_nothing, default_stream=stream, stream=lambda s=None: contextlib.nullcontext(s),
            ipc_collect=_nothing,
            Stream=stream_cls, Event=stream_class("Event", getattr(mod, "Event", _MISSING)),
            **legacy_types(kind, mod)))
        p.many(getattr(mod, "memory", None), mem)  # torch.cuda.memory.memory_stats, as some code imports it
    if kind == "cuda":
        p.set(torch.backends.cuda, "is_built", lambda: True)
    if kind == "mps":
        p.many(torch.backends.mps, {"is_available": lambda: True, "is_built": lambda: True})
        p.many(torch.mps, dict(common, current_allocated_memory=lambda: led.allocated(0),
                               driver_allocated_memory=lambda: led.allocated(0),
                               recommended_max_memory=lambda: profile.memory,
                               Event=stream_class("Event", getattr(mod, "Event", _MISSING))))
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        p.many(acc, dict(
            common, current_accelerator=lambda check_available=False: torch.device(kind), current_device_index=current,
            current_device_idx=current, set_device_index=set_device, set_device_idx=set_device,
            device_index=device_index,
            get_device_capability=lambda device=None: {"capability": (major, minor)}))
    # device-generic torch.Event / torch.Stream (transformers' generate on mps records one per step)
    p.set(torch, "Event", stream_class("Event", torch.__dict__.get("Event", _MISSING)), shared=True)
    p.set(torch, "Stream", stream_class("Stream", torch.__dict__.get("Stream", _MISSING)), shared=True)


# -- threads: a run follows the threads and pool tasks it starts ----------------------------------------------------

_ORIG_START = threading.Thread.start
_ORIG_SUBMIT = concurrent.futures.ThreadPoolExecutor.submit
_POOL_WORKER = getattr(concurrent.futures.thread, "_worker", None)


def run_in(space: Space, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn`` in this thread as part of ``space``'s run (a thread or pool task it started)."""
    if space.closed or V.current_space() is space:
        return fn(*args, **kwargs)
    prev = V.swap_space(space)
    try:
        with torch.set_grad_enabled(space.grad), ENTER[0](space):
            return fn(*args, **kwargs)
    finally:
        V.swap_space(prev)


def _start(self: threading.Thread) -> None:
    space = V.current_space()
    if space is not None and not space.closed and getattr(self, "_target", None) is not _POOL_WORKER:
        self.run = functools.partial(run_in, space, self.run)  # type: ignore[method-assign]
    _ORIG_START(self)


def _submit(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    space = V.current_space()
    if space is not None and not space.closed:
        fn = functools.partial(run_in, space, fn)
    return _ORIG_SUBMIT(self, fn, *args, **kwargs)


def follow_threads(p: Installs) -> None:
    p.set(threading.Thread, "start", _start, shared=True)
    p.set(concurrent.futures.ThreadPoolExecutor, "submit", _submit, shared=True)


# -- process-wide settings a run may change ------------------------------------------------------------------------


def _settings() -> list[tuple[Callable[[], Any], Callable[[Any], Any]]]:
    b = torch.backends
    flags: list[tuple[Callable[[], Any], Callable[[Any], Any]]] = [
        (torch.get_default_dtype, torch.set_default_dtype),
        (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        (lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
         lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        (torch.get_num_threads, torch.set_num_threads),
    ]
    for owner, names in ((b.cudnn, ("enabled", "benchmark", "deterministic", "allow_tf32")),
                         (b.cuda.matmul, ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                                          "allow_bf16_reduced_precision_reduction"))):
        for name in names:
            flags.append((functools.partial(getattr, owner, name), functools.partial(setattr, owner, name)))
    return flags


def snapshot() -> Callable[[], None]:
    """The process-wide settings now (default dtype, matmul precision, determinism, backend flags); calling the
    result puts them back."""
    saved: list[tuple[Callable[[], Any], Callable[[Any], Any], Any]] = []
    for get, put in _settings():
        with contextlib.suppress(Exception):
            saved.append((get, put, get()))

    def restore() -> None:
        for get, put, value in saved:
            with contextlib.suppress(Exception):
                # only what the run changed: use_deterministic_algorithms imports torch._inductor (seconds)
                if get() != value:
                    put(value)

    return restore

"""Virtual devices around a block of the user's own code: what ``@pytest.mark.simulate`` runs a test body under.

``simulate`` copies one object and drives it; a test builds its own objects and moves them itself. Here nothing is
copied: inside ``virtual_devices(...)`` the runtime answers for the profile's hardware (``torch.cuda.is_available()``
is True, ``device_count()`` is the profile's count), ``tensor.to("cuda:1")`` and factories with ``device="cuda:1"``
give virtual tensors, and every aten op on them is checked by the strict rules. Problems are recorded by module and
tensor path and the run goes on as if each were fixed; on exit they are raised together as one ``PlacementError``.
Values are real (``data="cpu"``), so the test's own assertions on numbers still hold.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from torchdoctor._rules.presets import as_profile
from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._report.text import call_stack, format_error
from torchdoctor._report.model import PlacementError, Problem
from torchdoctor._report.records import MutableRecord
from torchdoctor._placement import device_str, dtype_str, parse_device, parse_dtype
from torchdoctor._virtual.groups import grouped
from torchdoctor._virtual.makers import CastMakers
from torchdoctor._virtual.modcast import module_casts
from torchdoctor._virtual.patched import MARK, held_path, rename
from torchdoctor._virtual.hardware import over_memory, ran_on
from torchdoctor._virtual.recorder import LIMIT, _culprits_then_rest, _Recorder, _Stop
from torchdoctor._virtual.tensor import Space, is_virtual
from torchdoctor._tracker import ModuleStack
from torchdoctor._virtual.runtime import virtual_world
from torchdoctor._virtual.training import train_checks

if TYPE_CHECKING:  # the proof machinery loads with the first problem: a block that runs clean never imports it
    from torchdoctor._virtual.prove import Fix

__all__ = ["VirtualSession", "virtual_devices"]


class _OwnStack(ModuleStack):
    """Modules the test built have no path from a walk: the outermost one entered names its submodules."""

    def _pre(self, mod: torch.nn.Module, args: Any) -> None:
        if not self.stack and id(mod) not in self.paths:
            try:
                for name, sub in mod.named_modules(remove_duplicate=False):
                    # a torch.compile wrapper and the module it wraps are one path (as scan names them)
                    self.paths.setdefault(id(sub), ".".join(p for p in name.split(".") if p != "_orig_mod"))
            except Exception:  # a strange module tree must not break the test it watches
                pass
        super()._pre(mod, args)


class _Located(list):  # type: ignore[type-arg]
    """The recorder's problem list, keeping the program's call stack when each problem was recorded (``torchdoctor
    run`` names the first frame of the user's or plugin's code)."""

    def __init__(self) -> None:
        super().__init__()
        self.stacks: dict[tuple[str, ...], list[tuple[str, int, str]]] = {}
        self.roots: Any = None  # the run's outermost modules (a network patched into them is named as held)
        self.renames: dict[str, str] = {}  # a patched path -> the path the program holds it by
        self.networks: set[str] = set()  # the names of the networks held so
        self._held: dict[int, Any] = {}

    def append(self, problem: Any) -> None:
        f: Any = sys._getframe(1)
        if MARK in (problem.path or "") and problem.path not in self.renames and self.roots is not None:
            held = held_path(problem.path, list(self.roots), f, self._held)
            if held is not None:
                self.renames[problem.path] = held[0]
                self.networks.add(held[1])
        key, op = (problem.kind, problem.path), (problem.module_type or "", problem.op or "")  # each op its line
        if key + op not in self.stacks:
            stack = self.stacks[key + op] = call_stack(f, 400)
            self.stacks.setdefault(key, stack)
            if problem.module_type:  # two roots may hold one path (an Embedding's weight, a Linear's): each its line
                self.stacks.setdefault(key + (problem.module_type,), stack)
        super().append(problem)


@dataclass(init=False, repr=False, eq=False)
class VirtualSession(MutableRecord):
    """The running simulation of a block: ``device``, ``dtype``, ``profile`` and the ``problems`` recorded so far.
    (Methods written out, not generated: a virtual run imports it before the program's first line.)"""

    device: torch.device
    dtype: torch.dtype | None
    profile: DeviceProfile
    data: str = "cpu"
    problems: list[Problem] = field(default_factory=list)
    stopped: str | None = None
    culprits: int = 0  # the first ``culprits`` problems caused the ones after them
    # (kind, path, op, found) of a problem on a tensor made in the run -> the named tensors it was made from
    sources: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict)
    # (kind, path) -> the call stack (file, line, function; outermost first) when the problem was recorded
    stacks: dict[tuple[str, ...], list[tuple[str, int, str]]] = field(default_factory=dict)
    ops: int = 0  # aten ops the block ran on virtual tensors (known on exit)
    ran_on: tuple[str, ...] = ()  # the virtual devices the block placed tensors on (known on exit)
    networks: tuple[str, ...] = ()  # names of networks patched into a model's forward, as the program holds them
    renamed: dict[str, str] = field(default_factory=dict)  # a patched tensor's walk path -> the program's path
    # the exception that ended the block, taken for a consequence of the problems recorded before it (raised,
    # chained, with them; with raise_on_exit=False kept here, so it is never lost)
    failure: BaseException | None = None
    # where device/dtype/profile came from ("@pytest.mark.simulate(...) of test_x"): said in the error
    whence: dict[str, str] = field(default_factory=dict)
    fixes: tuple[Fix, ...] = ()  # the fix by parts, each proven at the failing ops or saying what was tried
    _rec: Any = field(default=None, init=False, repr=False, compare=False)
    _casts: Any = field(default=None, init=False, repr=False, compare=False)  # the program's module casts (modcast)
    _fields = ("device", "dtype", "profile", "data", "problems", "stopped", "culprits", "sources", "stacks", "ops",
               "ran_on", "networks", "renamed", "failure", "whence", "fixes")  # compared and shown (not _rec, _casts)

    def __init__(self, device: torch.device, dtype: torch.dtype | None, profile: DeviceProfile, data: str = "cpu",
                 problems: list[Problem] | None = None, stopped: str | None = None, culprits: int = 0,
                 sources: dict[tuple[str, ...], tuple[str, ...]] | None = None,
                 stacks: dict[tuple[str, ...], list[tuple[str, int, str]]] | None = None, ops: int = 0,
                 ran_on: tuple[str, ...] = (), networks: tuple[str, ...] = (), renamed: dict[str, str] | None = None,
                 failure: BaseException | None = None, whence: dict[str, str] | None = None,
                 fixes: tuple[Fix, ...] = ()) -> None:
        self.device, self.dtype, self.profile, self.data, self.stopped = device, dtype, profile, data, stopped
        self.problems = [] if problems is None else problems  # (the very objects given: a block's recorder fills them)
        self.sources, self.stacks = {} if sources is None else sources, {} if stacks is None else stacks
        self.culprits, self.ops, self.ran_on, self.networks, self.failure = culprits, ops, ran_on, networks, failure
        self.renamed, self.whence = {} if renamed is None else renamed, {} if whence is None else whence
        self.fixes = fixes
        self._rec = self._casts = None

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def changes(self) -> dict[str, tuple[str, float]]:
        """Problem path -> (its last change as the run saw it, ``time.time()`` then): a copy the program's own line
        took to the cpu (``on cpu since `.cpu()` at app.py:7``), which no trace of the model records."""
        return dict(self._rec.entry.changes) if self._rec is not None else {}

    def adopt(self, found: Any, assume: torch.device | None = None) -> int:
        """Name the tensors and modules of an object the block built (``found``: its walk) by their paths, as
        ``simulate`` names those of its copy, so problems say ``0.weight``, not "a tensor"; with ``assume``, its
        tensors on meta (weights not loaded) are taken as loaded there and count against the device's memory.
        Returns how many were. Only for objects the block made itself: their tensors are relabelled in place.
        Memory counts what the block's own ``.to(device, dtype)`` keeps; what it casts counts once cast."""
        from torchdoctor._virtual.hardware import ledger
        from torchdoctor._virtual.tensor import VirtualTensor, current_space, make, unsupported_form, virtual_class
        from torchdoctor._walk import set_tensor

        rec, space = self._rec, current_space()
        if rec is None or space is None:
            raise RuntimeError("VirtualSession.adopt runs inside its virtual_devices block")
        for path, mod in found.modules:
            rec.modules.paths.setdefault(id(mod), path)
        rec.roles.update({e.path: e.role for e in found.entries if e.alias_of is None})
        led, assumed = ledger(space), 0
        for e in found.entries:
            t = e.tensor
            if e.alias_of is not None:
                continue
            if isinstance(t, VirtualTensor):
                if t._td_path is None:
                    t._td_path = e.path
                if assume is not None and t._td_device.type == "meta":
                    t._td_device, assumed = assume, assumed + 1
                    if led is not None and self._kept(t):
                        led.add(t)
            elif unsupported_form(t) is None:
                # a real tensor (made before the block, or CPU / meta work of the block, which stays real): a twin
                # where it is held, named by its path (and on ``assume`` when on meta)
                on = assume if assume is not None and t.device.type == "meta" else t.device
                twin = make(virtual_class(type(t)), space.inner_of(t), on, e.path, t.requires_grad)
                twin.__dict__.update(getattr(t, "__dict__", {}))
                try:
                    set_tensor(e, twin)
                except TypeError:
                    continue
                if on is not t.device:
                    assumed += 1
                    if led is not None and self._kept(twin):
                        led.add(twin)
        return assumed

    def _kept(self, t: torch.Tensor) -> bool:
        """A tensor a move to the block's dtype keeps as it is (what it casts takes memory once cast)."""
        return self.dtype is None or t.dtype == self.dtype or not t.is_floating_point()

    def where_ran(self) -> str:
        """Where the work ran, said against the device asked for: ``ran on cuda:1`` or ``ran on cuda:0 (the
        program picked it; cuda:1 was asked for)``."""
        asked = device_str(self.device)
        if not self.ran_on or self.ran_on == (asked,):
            return f"ran on {asked}" if self.ran_on else f"placed nothing on a virtual device ({asked} asked for)"
        return f"ran on {', '.join(self.ran_on)} (the program picked {'them' if len(self.ran_on) > 1 else 'it'}; " \
               f"{asked} was asked for)"

    def error(self) -> PlacementError:
        """One ``PlacementError`` for everything recorded: headline, culprits by path, then the fix."""
        where = device_str(self.device) + (f" in {dtype_str(self.dtype)}" if self.dtype is not None else "")
        first = self.problems[0]
        head = (f"{len(self.problems)} placement problem(s) on virtual {where}"
                + (f", first in {first.module_path or '<root>'} ({first.module_type})" if first.module_type else "")
                + ":")
        shown, culprits = grouped(self.problems, self.culprits, self.networks)  # one cause, one line
        rows = [line[2:] if line.startswith("  ") else line
                for line in _culprits_then_rest(tuple(shown), culprits, 40)]
        if self.stopped:
            rows.append(f"stopped early: {self.stopped}")
        if self.whence:
            rows.append(whence_line(self.whence))
        if self.ran_on and self.ran_on != (device_str(self.device),):
            rows.append(f"the work {self.where_ran()}")
        # a block of the program's own code runs once: its fix is proven at the failing ops (``atop``)
        fix = "\n".join(f.code for f in self.fixes) or None
        from torchdoctor._virtual.prove import proof_lines
        said = "\n".join(proof_lines(self.fixes)) if self.fixes else None
        return PlacementError(format_error(head, rows, said, limit=len(rows)), module_path=first.module_path,
                              module_type=first.module_type,
                              op=first.op, tensors=first.tensors, problems=tuple(self.problems), fix=fix)


    def text(self) -> str:
        """The block's report as ``str(session)`` prints it: the error's text, or that nothing was found."""
        if self.problems:
            return str(self.error())
        where = device_str(self.device) + (f" in {dtype_str(self.dtype)}" if self.dtype is not None else "")
        return f"no placement problem on virtual {where} ({self.ops} ops; {self.where_ran()})"

    __str__ = text

    def to_dict(self) -> dict[str, Any]:
        """The block's report as JSON: its problems by path and each part of the fix with ``proven``."""
        return {"ok": self.ok, "device": device_str(self.device),
                "dtype": dtype_str(self.dtype) if self.dtype is not None else None,
                "problems": [p.to_dict() for p in self.problems], "fixes": [f.to_dict() for f in self.fixes],
                "stopped": self.stopped, "expected": dict(self.whence), "ran": self.where_ran()}


def not_stored(n: int, limit: int) -> list[Problem]:
    """The line that says how many problems the limit left out (none when it left none)."""
    if n <= 0:
        return []
    return [Problem("truncated", "<run>", "limit", f"{n} more", f"at most {limit}",
                    f"{n} more problem(s) not stored: at most {limit} are kept (limit=); the run went on to its end",
                    op="limit")]


def expectation(device: torch.device, dtype: torch.dtype | None, profile: DeviceProfile,
                sources: dict[str, str] | None = None) -> dict[str, str]:
    """What a virtual run expected and where each part came from: ``sources`` names the argument, the command
    line's option, ``[tool.torchdoctor]`` with its file or the pytest marker; a profile without a source is the
    default of the device's type."""
    sources = sources or {}
    out = {"device": device_str(device), "device_source": sources.get("device") or "the device= argument",
           "profile": profile.name or f"default {profile.type}",
           "profile_source": sources.get("profile") or f"the default profile of {profile.type}"}
    if dtype is not None:
        out.update(dtype=dtype_str(dtype), dtype_source=sources.get("dtype") or "the dtype= argument")
    return out


def whence_line(e: dict[str, str]) -> str:
    """``expected: cuda:1 bfloat16 on NVIDIA T4 (device from ...; dtype from ...; profile from ...)``."""
    what = " ".join(v for v in (e.get("device"), e.get("dtype")) if v) + f" on {e.get('profile')}"
    whence = "; ".join(f"{k} from {e[k + '_source']}" for k in ("device", "dtype", "profile") if e.get(k + "_source"))
    return f"expected: {what} ({whence})"


_CALL = {"device": "the virtual_devices() device argument", "dtype": "the virtual_devices() dtype argument",
         "profile": "the virtual_devices() profile argument"}


@contextlib.contextmanager
def virtual_devices(device: str | torch.device = "cuda:1", dtype: str | torch.dtype | None = None, *,
                    profile: DeviceProfile | str | None = None, count: int | None = None, data: str = "cpu",
                    limit: int = LIMIT, raise_on_exit: bool = True,
                    select: bool = False) -> Iterator[VirtualSession]:
    """Run your own code on virtual ``device`` hardware (``cuda:1``, ``xpu``, ``mps``) on any machine.

    Inside the block the program sees that hardware: ``torch.cuda.is_available()``, ``device_count()``,
    ``get_device_properties`` and the memory functions (``memory_stats`` with the real keys, ``mem_get_info``,
    ``memory_allocated`` ...) answer from ``profile`` (a ``DeviceProfile`` or a preset name such as ``"t4"``), and so
    do ``torchdoctor.pick_device()`` and ``env_report()``. Nothing is copied: your objects are moved by your own
    code, every op is checked by the strict rules, and threads the block starts run on the same virtual devices.
    Problems (placement, and memory beyond the profile's) are recorded by path and the run goes on as if each were
    fixed; on exit they are raised together as one ``PlacementError`` (``raise_on_exit=False``: read
    ``session.problems`` instead). ``data="cpu"`` keeps real values, so the block's own numbers still hold.
    ``@pytest.mark.simulate`` runs a test body in this block; ``torchdoctor run --device`` a whole program.
    Device 0 stays current, as on real hardware: a bare ``"cuda"`` (``.cuda()``, ``torch.device("cuda")``) is
    ``cuda:0`` unless the program calls ``torch.cuda.set_device(N)``, so a program that hard-codes ``.cuda()`` in a
    ``cuda:1`` run meets the ``cuda:1`` tensors as it would there; ``session.ran_on`` lists the devices the work ran
    on. ``select=True`` makes ``device`` current, as ``CUDA_VISIBLE_DEVICES`` plus ``torch.cuda.set_device(N)``
    would.

    >>> import torch
    >>> with virtual_devices("cuda:1") as sim:
    ...     model = torch.nn.Linear(4, 2).to("cuda:1")
    ...     y = model(torch.ones(3, 4, device="cuda:1"))
    >>> y.device, sim.ok
    (device(type='cuda', index=1), True)
    """
    dev = parse_device(device)
    if not is_virtual(dev):
        raise ValueError(f"virtual devices are cuda, xpu or mps devices, not {device_str(dev)!r}; "
                         "e.g. device='cuda:1'")
    dt = parse_dtype(dtype) if dtype is not None else None
    profile_given = profile is not None
    profile = as_profile(profile) or DeviceProfile.for_device(dev)
    if profile.type != dev.type:
        raise ValueError(f"device {device_str(dev)} is not of the profile's type {profile.type!r}")
    profile = profile.with_count(max(count or 1, (dev.index or 0) + 1))
    dev = torch.device(dev.type, dev.index or 0)
    rec = _Recorder(profile, dev, dt, limit, {})
    rec.use_stack(_OwnStack(rec.roles))
    rec.problems = located = _Located()
    located.roots = rec.modules.outermost
    session = VirtualSession(dev, dt, profile, data, rec.problems, stacks=located.stacks,
                             whence=expectation(dev, dt, profile, {k: v for k, v in _CALL.items()
                                                                   if k != "profile" or profile_given}))
    session._rec = rec
    space = Space(data, profile.type, rec)
    if select:  # as CUDA_VISIBLE_DEVICES plus torch.cuda.set_device(N): the program's own "cuda" is cuda:N
        space.current.select(dev.type, dev.index or 0)
    failure: BaseException | None = None
    # autograd as the program has it: training steps run (backward, optimizers), their tensors checked too
    # CastMakers: a cast in a forward (``h.float()``) is named at its line, as simulate names it
    with virtual_world(space, profile, CastMakers()), rec.modules.tracking(), train_checks(rec), \
            module_casts() as casts:  # a component the program casts itself is fixed at that line
        try:
            yield session
        except _Stop:
            pass
        except Exception as exc:
            from torchdoctor._virtual.intread import storage_read  # what the program's error was: only on one

            if not rec.problems and not storage_read(exc, rec, _Stop) and not rec.escaped(exc):
                raise
            failure = exc  # most likely a consequence of the problems: report them, chained to it
    session._casts = casts
    session.stopped = rec.stopped
    session.failure = failure
    session.ran_on = ran_on(space)
    rec.computed = space.computed  # type: ignore[attr-defined]  # read by culprits_first
    session.problems[:] = rename(rec.culprits_first(list(rec.problems), rec.modules.outermost), located.renames) \
        + over_memory(space) + not_stored(len(rec.overflow), limit)
    for old, new in located.renames.items():  # the lines recorded, under the paths the program knows
        for key in [k for k in located.stacks if k[1] == old]:
            located.stacks[(key[0], new) + key[2:]] = located.stacks.pop(key)
    session.networks = tuple(sorted(located.networks))
    session.renamed = dict(located.renames)
    session.culprits = rec.blamed
    session.sources = rec.sources
    session.ops = space.ops
    if session.problems:  # the fix machinery loads only for a block with problems
        from torchdoctor._virtual.blockfix import proven_fixes

        session.fixes = proven_fixes(session)
    else:
        session.fixes = ()
    if raise_on_exit and rec.problems:
        raise session.error() from failure
    if isinstance(failure, AssertionError) and _own_assert(failure):  # the program's own check: never swallowed
        raise failure


def _own_assert(exc: BaseException) -> bool:
    """An ``assert`` in the program's own code (its innermost frame outside installed packages and torch), not a
    library's check failing as a consequence of a placement problem."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    file = tb.tb_frame.f_code.co_filename if tb is not None else ""
    return not any(part in file for part in ("site-packages", "dist-packages", "/torch/", "/torchdoctor/"))

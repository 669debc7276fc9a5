"""``guard``: runtime placement errors that name the module and the tensor, and say the fix.

>>> import torch, torchdoctor
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 4))
>>> model[0].bias.data = model[0].bias.data.double()
>>> try:
...     with torchdoctor.guard(model):
...         model(torch.ones(1, 4))
... except torchdoctor.PlacementError as e:
...     print(e.module_path, e.problems[0].path, e.problems[0].found, e.problems[0].expected)
0 0.bias float64 float32
>>> with torchdoctor.guard(model, mode="fix") as g:
...     _ = model(torch.ones(1, 4))
>>> g.fixes
[Fix(path='0.bias', found='float64', expected='float32', kind='dtype', op='aten.addmm.default', module_path='0')]
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import types
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from torch import nn

from torchdoctor._guard.record import NOTHING, GuardReport, Note, key_of
from torchdoctor._guard.session import Session
from torchdoctor._report.records import FrozenRecord
from torchdoctor._report.text import public_types, user_stacklevel

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._report.model import Problem
    from torchdoctor._rules.profile import DeviceProfile

# the rules, the report types and the machinery that explains a problem load with the first problem a guard meets
# (or a profile given by name): a watched program that raises nothing never imports them (issue 43 point 4)

__all__ = ["Fix", "guard"]

log = logging.getLogger("torchdoctor.guard")
MODES = ("explain", "strict", "fix", "warn")
F = TypeVar("F", bound=Callable[..., Any])


# a frozen record written once, not compiled per class by the decorator (issue 43 point 4): equal, hashed and shown
# by its first six fields, as the decorator made it (the rest were repr=False, compare=False)
@dataclass(init=False, repr=False, eq=False)
class Fix(FrozenRecord):
    """One repair ``fix`` (or ``warn``) mode applied on the fly: the tensor at ``path`` went from ``found``
    to ``expected`` for the ops that needed it. The model itself is never changed. What strict would have said of
    it comes along: ``maker`` (where an operand made in a forward was made: op, line, where its dtype was read from,
    what it was made from), ``code`` (the lasting fix, aimed at that maker), ``proof`` ("fix proven: ..." /
    "fix unproven: ..." with what was tried) and ``patch`` (a unified diff of the user's file, or None)."""

    path: str
    found: str
    expected: str
    kind: str = "dtype"
    op: str | None = None
    module_path: str | None = None
    maker: str | None = field(default=None, repr=False, compare=False)
    code: str | None = field(default=None, repr=False, compare=False)
    proof: str | None = field(default=None, repr=False, compare=False)
    patch: str | None = field(default=None, repr=False, compare=False)
    _fields = ("path", "found", "expected", "kind", "op", "module_path")

    def __init__(self, path: str, found: str, expected: str, kind: str = "dtype", op: str | None = None,
                 module_path: str | None = None, maker: str | None = None, code: str | None = None,
                 proof: str | None = None, patch: str | None = None) -> None:
        d = self.__dict__
        d["path"] = path
        d["found"] = found
        d["expected"] = expected
        d["kind"] = kind
        d["op"] = op
        d["module_path"] = module_path
        d["maker"] = maker
        d["code"] = code
        d["proof"] = proof
        d["patch"] = patch

    @property
    def proven(self) -> bool:
        return bool(self.proof and self.proof.startswith("fix proven"))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "proven": self.proven}


class guard:  # noqa: N801 - reads like torch.no_grad
    """Watch a forward (and backward) and turn placement failures into errors that name the module, the
    tensor and the fix.

    ``with guard(model, mode="fix") as g:`` / ``@guard`` / ``@guard(mode="strict")`` / ``@guard(model)``.
    Modes: ``explain`` (default, no per-op cost: explains an error that escapes), ``strict`` (checks ops against
    the rules before they run: inside the modules whose tensors disagree, or every op with ``every_op=True``), ``fix`` (aligns the values passed to an op, records ``g.fixes``),
    ``warn`` (like fix, with one ``PlacementWarning`` per distinct problem). Paths are relative to ``obj``,
    or to the outermost module entered when ``obj`` is None. Every mode says the same of a problem: the culprit,
    the maker of an operand made in a forward (its line, where its dtype was read from), the fix aimed there,
    whether it was proven and its diff; ``g.report().to_dict()`` keeps it all after the block.
    """

    fixes: list[Fix]
    problems: list[Problem]

    def __new__(cls, obj: Any = None, *, mode: str = "explain", profile: DeviceProfile | str | None = None,
                every_op: bool = False) -> Any:
        if _is_plain_callable(obj):  # bare @guard on a function
            return cls(None, mode=mode, profile=profile, every_op=every_op)(obj)
        return super().__new__(cls)

    def __init__(self, obj: Any = None, *, mode: str = "explain", profile: DeviceProfile | str | None = None,
                 every_op: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"guard mode must be one of {', '.join(MODES)}, not {mode!r}")
        # strict with a model checks per op only inside modules whose tensors disagree (_guard/fastpath.py);
        # every_op=True checks every op, as strict without a model does (a silent promotion by a tensor made
        # inside a module whose own tensors agree raises nothing, so only a per-op check sees it)
        self.every_op = bool(every_op)
        self.model = obj  # the guarded object (a module, a pipeline): paths are relative to it
        self.mode = mode
        self.profile = _as_profile(profile)  # a preset name ("t4") or a DeviceProfile
        self.fixes = []
        self.problems = []
        self._lock = threading.Lock()
        self._seen: set[Any] = set()
        self._fixed: set[str] = set()
        self._local = threading.local()
        self._compiled_warned = False
        self._notes: dict[Any, Note] = {}  # what was said of each problem, by notes.key_of
        self._told: dict[Any, Note] = {}  # fix / warn: the note of each distinct problem, told once

    def __repr__(self) -> str:
        return f"guard(mode={self.mode!r}, fixes={len(self.fixes)}, problems={len(self.problems)})"

    # -- context manager and decorator ----------------------------------------------------------------------
    def __enter__(self) -> guard:
        session = Session(self)
        session.start()
        stack = self._local.__dict__.setdefault("sessions", [])
        stack.append(session)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: types.TracebackType | None) -> None:
        session: Session = self._local.sessions.pop()
        session.stop()
        if exc is None or _is_placement_error(exc) or not isinstance(exc, Exception):
            return None
        try:
            from torchdoctor._guard.diagnose import explain_error  # the explanation is loaded by the first error
            from torchdoctor._guard import rawarg

            if session.lean is not None:  # a no-grad forward's running modules, from the traceback
                session.lean.rebuild(exc.__traceback__ or tb)
            explained = rawarg.amend(session, exc, tb, explain_error(session, exc, tb))
        except Exception:  # never let the explanation replace the user's error
            log.debug("guard could not explain %r", exc, exc_info=True)
            return None
        if explained is None:
            return None
        if isinstance(exc, RuntimeError):
            raise explained from exc
        _tell(exc, str(explained))
        return None

    def __call__(self, fn: F) -> F:
        if not callable(fn):
            raise TypeError("guard(...) decorates a function; use `with guard(model):` around calls")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        wrapper.guard = self  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    # -- bookkeeping (sessions in several threads share one guard) -------------------------------------------
    def _record_problems(self, problems: list[Problem], instead: list[Problem] | None = None) -> None:
        """Keep each problem once; ``instead``: problems recorded before that these take the place of (the data fed
        to a component that is the odd one out was no problem of its own)."""
        with self._lock:
            at = len(self.problems)
            if instead:
                gone = {id(p) for p in instead}
                at = next((i for i, p in enumerate(self.problems) if id(p) in gone), at)
                self.problems[:] = [p for p in self.problems if id(p) not in gone]
            for p in problems:
                key = (p.kind, p.path, p.module_path, p.op)
                if key not in self._seen:
                    self._seen.add(key)
                    self.problems.insert(at, p)
                    at += 1

    def _record_fixes(self, problems: list[Problem], note: Note = NOTHING) -> None:
        with self._lock:
            for p in problems:
                path = p.path if p.role in ("parameter", "component") else f"{p.module_path or '<root>'}: {p.path}"
                if path not in self._fixed:
                    self._fixed.add(path)
                    self.fixes.append(Fix(path, p.found, p.expected, p.kind, p.op, p.module_path, note.maker,
                                          note.fix, note.proof, note.patch))

    def _note(self, problems: Any, note: Note) -> None:
        """Keep what was said of these problems (the maker, the fix, its proof and diff) for ``report()``."""
        with self._lock:
            for p in problems:
                self._notes.setdefault(key_of(p), note)

    def _note_once(self, key: Any, problems: list[Problem], tell: Callable[[], Note]) -> Note:
        """fix / warn: the note of a problem told the first time it is met (``tell`` reads frames and source)."""
        with self._lock:
            note = self._told.get(key)
        if note is None:
            try:
                note = tell()
            except Exception:  # the note is extra: the alignment goes on without it
                log.debug("guard could not tell %r", key, exc_info=True)
                note = NOTHING
            with self._lock:
                self._told[key] = note
            self._note(problems, note)
        return note

    def _group_note(self, paths: list[str], running: str | None = None) -> Note | None:
        """The note of a component told as the odd one out that holds every one of ``paths`` (None if none); with
        no model tensor among the operands, the one whose module ``running`` runs inside that component (the data
        fed to a float32 ControlNet is the same finding at each of its ops)."""
        if not paths and running is None:
            return None
        with self._lock:
            told = [n for n in self._told.values() if n.groups]

        def inside(p: str, g: str) -> bool:
            return bool(g) and (p == g or p.startswith(g + "."))

        for note in told:
            if paths and all(any(inside(p, g) for g in note.groups) for p in paths):
                return note
            if not paths and running is not None and any(g == "<root>" or inside(running, g) for g in note.groups):
                return note
        return None

    def report(self) -> GuardReport:
        """What this guard saw: its problems and fixes, each with the maker, the fix, its proof and its diff
        (``report().to_dict()`` for JSON)."""
        with self._lock:
            return GuardReport(self.mode, tuple(self.problems), tuple(self.fixes), dict(self._notes))

    def _first_time(self, key: Any) -> bool:
        with self._lock:
            if ("warned", key) in self._seen:
                return False
            self._seen.add(("warned", key))
            return True

    def _warn_compiled(self) -> None:
        with self._lock:
            if self._compiled_warned:
                return
            self._compiled_warned = True
        warnings.warn(f"torchdoctor.guard(mode={self.mode!r}) does not check inside torch.compile'd regions; "
                      "only code that runs eagerly is checked", _placement_warning(), stacklevel=user_stacklevel())


def _tell(exc: BaseException, note: str) -> None:
    """Put guard's explanation of an error that is no RuntimeError (numpy's ``TypeError`` on bfloat16, GradScaler's
    ``ValueError``) into ``str(exc)`` itself: the program's ``except TypeError`` still holds, and every frontend
    that prints the message shows it (notes are dropped by some: loggers' ``%s``, web UIs, ``str(e)``). An exception
    whose text is not its one string argument gets a note instead."""
    args = exc.args
    if type(exc).__str__ is BaseException.__str__ and len(args) == 1 and isinstance(args[0], str):
        exc.args = (f"{args[0]}\n\n{note}" if args[0] else note,)
    elif hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10
        exc.args = (*args, note)


def _as_profile(profile: Any) -> Any:
    if profile is None:
        return None
    from torchdoctor._rules.presets import as_profile

    return as_profile(profile)


def _is_placement_error(exc: BaseException) -> bool:
    """Is ``exc`` a PlacementError? None can exist before its module is imported, so that is not imported here."""
    model = sys.modules.get("torchdoctor._report.model")
    return model is not None and isinstance(exc, model.PlacementError)


def _placement_warning() -> type[Warning]:
    from torchdoctor._report.model import PlacementWarning

    return PlacementWarning


def _is_plain_callable(obj: Any) -> bool:
    return callable(obj) and not isinstance(obj, (nn.Module, type)) and isinstance(
        obj, (types.FunctionType, types.MethodType, functools.partial, types.BuiltinFunctionType))


# --- explaining an escaping error ---------------------------------------------------------------------------

def explain_running(g: guard, exc: BaseException) -> str | None:
    """What `g` says of `exc` raised inside its innermost session on this thread (None outside one, or when it
    has nothing to say): for `torchdoctor run`, which sees the error before the session's `__exit__` does."""
    sessions = getattr(g._local, "sessions", None)
    if not sessions or exc.__traceback__ is None:
        return None
    from torchdoctor._guard import rawarg
    from torchdoctor._guard.diagnose import explain_error

    session = sessions[-1]
    filled = session.lean is not None and session.lean.rebuild(exc.__traceback__)
    try:
        explained = rawarg.amend(session, exc, exc.__traceback__, explain_error(session, exc, exc.__traceback__))
    finally:
        if filled:  # the program may go on: its next forward starts from an empty stack, as the post hooks leave it
            session.lean.clear()
    return str(explained) if explained is not None else None


public_types(guard, Fix)

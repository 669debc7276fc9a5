"""What a trace knows: the traced roots, their last seen placement per path, and the diff around each call.

A *call* is the outermost patched function running in a thread. The first time a call touches an object of a
traced root (the module whose method runs, a tensor whose ``.data`` is set, a hook's module...), the trace reads
that object's subtree (the *scope*) before anything changes; when the outermost call returns it reads the scopes
again and records every path whose device or dtype differs, appeared or disappeared. So whatever the call did
inside (direct ``_parameters`` writes included) is seen, and nothing runs between calls. A read is a walk, or the
walk's cached shape re-read slot by slot (``snapshot.py``); what is kept between calls holds no tensor, and
records are made when read (or at once when a log or file takes them).
"""

from __future__ import annotations

import logging
import threading
import time
import types
from operator import attrgetter, itemgetter
from typing import Any, Callable

import torch
from torch import nn

from torchdoctor._placement import device_str, dtype_str
from torchdoctor._trace.record import TraceRecord, births, describe_frame, this_thread, user_site
from torchdoctor._trace.snapshot import Shape, Snap, drop, owned, ref as _ref, snapshot, strip

log = logging.getLogger("torchdoctor.trace")

_LORA_WORDS = ("lora", "adapter", "merge", "unload", "fuse")
UNSEEN = "(code the trace did not see)"
_0, _2, _3 = itemgetter(0), itemgetter(2), itemgetter(3)
_SHAPE = attrgetter("shape")


class Call:
    """The outermost patched call running in one thread."""

    __slots__ = ("via", "name", "subject", "frame", "scopes", "covered", "whole")

    def __init__(self, via: str, name: str, subject: Any, frame: types.FrameType | None) -> None:
        self.via = via
        self.name = name
        self.subject = subject
        self.frame = frame
        self.scopes: dict[int, tuple[Session, Root, list[Scope]]] = {}  # id(root) -> ...
        self.covered: set[int] = set()  # sessions whose only root is watched whole by this call: nothing to add
        self.whole: Any = None  # the tuple of sessions that were all covered (patches.SESSIONS when it is the same)


class Scope:
    __slots__ = ("path", "before", "objects", "modules")

    def __init__(self, path: str, before: Snap, objects: dict[int, tuple[str, Any]], modules: dict[str, Any]) -> None:
        self.path = path
        self.before = before
        self.objects = objects
        self.modules = modules


def _under(path: str, scope: str) -> bool:
    """``path`` is ``scope`` or below it (the root scope ``""`` holds everything)."""
    return scope == "" or path == scope or path.startswith(scope + ".")


def diff(before: Snap, after: Snap) -> list[tuple[str, str, Any, Any]]:
    """``(kind, path, before entry | None, after entry | None)``; a tensor found again under a new path (a layer
    wrapped by a LoRA layer) is the same tensor: recorded only if its placement changed."""
    out: list[tuple[str, str, Any, Any]] = []
    by_id: dict[int, Any] | None = None
    for path, a in after.items():
        b = before.get(path)
        if b is not None:  # the same slot, whatever object fills it now
            if b[2] != a[2] or b[3] != a[3]:
                out.append(("move", path, b, a))
            continue
        if by_id is None:
            by_id = {v[1]: v for v in before.values()}
        old = by_id.get(a[1])
        if old is not None and old[0] is a[0]:  # both alive during the call: the id is the tensor
            if old[2] != a[2] or old[3] != a[3]:
                out.append(("move", path, old, a))
            continue
        out.append(("add", path, None, a))
    # (every path of after found in before, and as many: the same paths, none removed; a whole-model cast)
    if len(after) != len(before) or (out and by_id is not None):
        after_ids = {v[1] for v in after.values()}
        for path, b in before.items():
            if path not in after and b[1] not in after_ids:
                out.append(("remove", path, b, None))
    return out


def _navigate(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(obj, nn.Module):
            nxt = obj.__dict__.get("_modules", {}).get(part)
            obj = nxt if nxt is not None else obj.__dict__.get(part)
        elif isinstance(obj, dict):
            obj = dict.get(obj, part)
        elif isinstance(obj, (list, tuple)):
            obj = obj[int(part)] if part.isdigit() and int(part) < len(obj) else None
        else:
            d = getattr(obj, "__dict__", None)
            obj = d.get(part) if isinstance(d, dict) else None
        if obj is None:
            return None
    return obj


def _tensor_at(obj: Any, path: str) -> Any:
    """The tensor at a walker path: a module's child, parameter, buffer or attribute, an item, an attribute."""
    for part in path.split("."):
        d = obj.__dict__ if isinstance(obj, (nn.Module, torch.Tensor)) else None
        if isinstance(obj, nn.Module) and d is not None:
            for store in ("_modules", "_parameters", "_buffers"):
                slots = d.get(store)
                if slots is not None and part in slots:
                    obj = slots[part]
                    break
            else:
                obj = d.get(part)
        else:
            obj = _navigate(obj, part)
        if obj is None:
            return None
    return obj


class Root:
    """One traced object: its last seen placement per path and the scope of every object met."""

    def __init__(self, obj: Any, label: str, strong: bool) -> None:
        self.strong = obj if strong else None
        self.ref = _ref(obj) if not strong else None
        self.label = label
        self.state: Snap = {}
        self.modules: dict[str, Any] = {}

    @property
    def obj(self) -> Any:
        return self.strong if self.ref is None else self.ref()

    def resolve(self, path: str) -> Any:
        root = self.obj
        if not path or root is None:
            return root
        hit = _navigate(root, path)
        if hit is None:
            ref = self.modules.get(path)
            hit = ref() if ref is not None else None
        return hit


class Session:
    """The machinery behind one ``trace``: roots, records and the emit callback."""

    def __init__(self, obj: Any, adopt: bool, emit: Callable[[TraceRecord], None],
                 live: Callable[[], bool] = lambda: True) -> None:
        self.lock = threading.RLock()
        self.adopting = adopt
        self.emit = emit
        self.live = live  # must each record be made (and emitted) when its change is found?
        self.roots: list[Root] = []
        self.objects: dict[int, tuple[Root, str, Any]] = {}  # id -> (root, scope path, ref)
        self._records: list[TraceRecord] = []
        self._by_path: dict[str, list[TraceRecord]] = {}
        self._pending: list[tuple[Any, ...]] = []  # changes found while nothing emits: made into records when read
        self.shapes: dict[tuple[int, str], Shape | None] = {}  # per (object, path): its walk's shape (snapshot.py)
        if obj is not None:
            self._add_root(obj, type(obj).__name__ if adopt else "", strong=True)

    # -- roots ----------------------------------------------------------------------------------------------
    def _add_root(self, obj: Any, label: str, strong: bool) -> Root:
        root = Root(obj, label, strong)
        snap, objects, modules = snapshot(obj, "", self.shapes)
        root.state, root.modules = strip(snap), modules
        with self.lock:
            contained = set()
            for r in self.roots:
                o = r.obj
                hit = objects.get(id(o)) if o is not None else None
                if o is None or (hit is not None and hit[1] is not None and hit[1]() is o):
                    contained.add(id(r))
            if contained:  # an adopted pipeline swallows the components adopted before it
                self.roots = [r for r in self.roots if id(r) not in contained]
                self.objects = {k: v for k, v in self.objects.items() if id(v[0]) not in contained}
            self.roots.append(root)
            for oid, (scope, ref) in objects.items():
                self.objects[oid] = (root, scope, ref)
            rref = _ref(obj)
            self.objects[id(obj)] = (root, "", rref)
        for path, name, file, line in births({**objects, id(obj): ("", rref)}):  # made before it was traced
            if path in snap:
                self._record(root, [("add", path, None, snap[path])], (f".{name} =", f"assignment to .{name}"),
                             "Module.__setattr__", file, line)
        return root

    def find(self, obj: Any) -> tuple[Root, str] | None:
        hit = self.objects.get(id(obj))
        if hit is None:
            return None
        ref = hit[2]
        if ref is not None and ref() is not obj:
            return None
        return hit[0], hit[1]

    # -- one call -------------------------------------------------------------------------------------------
    def contact(self, call: Call, candidates: tuple[Any, ...], adopt: bool) -> None:
        if id(self) in call.covered:  # the common case inside a whole-model .to(): one check per submodule
            return
        for obj in candidates:
            hit = self.find(obj)
            if hit is not None:
                break
        else:
            obj = candidates[0] if candidates else None
            if not (adopt and self.adopting and obj is not None and not isinstance(obj, torch.Tensor)):
                return
            root = self._add_root(obj, type(obj).__name__, strong=False)
            hit = (root, "")
        root, path = hit
        with self.lock:
            entry = call.scopes.get(id(root))
            scopes = entry[2] if entry is not None else []
            if any(_under(path, s.path) for s in scopes):
                return
            target = root.resolve(path)
            if target is None:
                return
            before, objects, modules = snapshot(target, path, self.shapes)
            narrower = [s for s in scopes if _under(s.path, path)]
            self._unobserved(root, before, narrower)
            for s in narrower:
                for p in [p for p in before if _under(p, s.path)]:
                    if p not in s.before:
                        del before[p]  # appeared during this call: the final diff shows it as added
                before.update(s.before)
                objects.update(s.objects)
            scopes = [s for s in scopes if s not in narrower] + [Scope(path, before, objects, modules)]
            call.scopes[id(root)] = (self, root, scopes)
            if path == "" and len(self.roots) == 1 and not self.adopting:
                call.covered.add(id(self))

    def _unobserved(self, root: Root, before: Snap, narrower: list[Scope]) -> None:
        """Changes made since the last look by code no patch saw (a direct ``_parameters`` write...)."""
        changes = []
        for p, v in before.items():
            old = root.state.get(p)
            if old is not None and (old[2] != v[2] or old[3] != v[3]) and not any(_under(p, s.path) for s in narrower):
                changes.append(("move", p, old, v))
        if changes:
            self._record(root, changes, (UNSEEN, UNSEEN), "snapshot", None, None)

    def finish(self, call: Call, site: list[Any]) -> None:
        for session, root, scopes in list(call.scopes.values()):
            if session is not self:
                continue
            changes = []
            with self.lock:
                for s in scopes:
                    target = root.resolve(s.path)
                    if target is None:
                        continue
                    after, objects, modules = snapshot(target, s.path, self.shapes)
                    changes.extend(diff(s.before, after))
                    drop(root.state, s.before)
                    root.state.update(strip(after))
                    drop(self.objects, s.objects)
                    self.objects.update(owned(root, objects))
                    root.modules.update(modules)
            if changes:
                if not site:
                    site.extend(_site(call))
                self._record(root, changes, site[0], call.via, site[1], site[2])

    def final_check(self) -> None:
        """At exit: changes made since the last call by code no patch saw."""
        for root in list(self.roots):
            obj = root.obj
            if obj is None:
                continue
            with self.lock:
                snap, _, _ = snapshot(obj, "", self.shapes)
                self._unobserved(root, snap, [])
                root.state = strip(snap)
        self.shapes.clear()  # a finished trace keeps no module of the user's

    def _record(self, root: Root, changes: list[tuple[str, str, Any, Any]], label: tuple[str, str], via: str,
                file: str | None, line: int | None) -> None:
        # what a record needs, without the tensors (a record must not keep one alive); the record itself, its
        # strings and its dataclass are made when someone reads the records, or now if they are emitted
        kinds = list(map(_0, changes))
        try:
            if kinds.count("move") != len(kinds):
                raise LookupError
            _, paths, bs, afters = zip(*changes)  # a whole-model cast: every change a move, made at C speed
            items = list(zip(kinds, paths, map(_2, bs), map(_3, bs), map(_2, afters), map(_3, afters),
                             map(_SHAPE, map(_0, afters))))
        except (LookupError, AttributeError, ValueError, RuntimeError):  # RuntimeError: a lazy module's parameter
            items = [(kind, path, b[2] if b is not None else None, b[3] if b is not None else None,
                      a[2] if a is not None else None, a[3] if a is not None else None,
                      _shape_of(a[0] if a is not None else b[0])) for kind, path, b, a in changes]
        batch = (items, root.label, label, via, file, line, time.time(), this_thread())
        with self.lock:
            self._pending.append(batch)
            made = self._flush(len(items)) if self.live() else []
        for rec in made:
            try:
                self.emit(rec)
            except Exception:  # a diagnostic never breaks the program it watches
                log.debug("torchdoctor.trace: emitting a record failed", exc_info=True)

    def _flush(self, last: int = 0) -> list[TraceRecord]:
        """Make the pending changes into records (oldest first); returns the last ``last`` of them."""
        with self.lock:
            pending, self._pending = self._pending, []
            names: dict[Any, str | None] = {None: None}  # device / dtype -> its string

            def name(x: Any, fn: Callable[[Any], str]) -> str | None:
                text = names.get(x, "")
                if text == "":
                    text = names[x] = fn(x)
                return text

            for items, root, label, via, file, line, now, thread in pending:
                lora_call = any(w in label[1].lower() for w in _LORA_WORDS)
                for kind, path, bdev, bdt, adev, adt, shape in items:
                    rec = TraceRecord(
                        path=path, kind=kind, from_device=name(bdev, device_str), from_dtype=name(bdt, dtype_str),
                        to_device=name(adev, device_str), to_dtype=name(adt, dtype_str),
                        call=label[0], qualname=label[1], via=via, file=file, line=line, time=now, root=root,
                        shape=tuple(shape) if shape is not None else None, lora=lora_call or "lora_" in path, thread=thread)
                    self._records.append(rec)
                    self._by_path.setdefault(path, []).append(rec)
            return self._records[len(self._records) - last:] if last else []

    @property
    def records(self) -> list[TraceRecord]:
        with self.lock:
            if self._pending:
                self._flush()
            return self._records

    # -- queries --------------------------------------------------------------------------------------------
    def path_of(self, t: torch.Tensor) -> str | None:
        hit = self.find(t)
        if hit is None:
            return None
        root = hit[0]
        obj = root.obj
        for p, v in root.state.items():
            if v[1] == id(t):
                found = _tensor_at(obj, p) if obj is not None else None
                if found is None or found is t:  # not reachable any more: trust the id the state kept
                    return p
        return None

    def history(self, path: str) -> list[TraceRecord]:
        with self.lock:
            records = self.records
            exact = self._by_path.get(path)
            if exact:
                return list(exact)
            suffix = "." + path
            return [r for r in records if r.path.endswith(suffix)]


def _site(call: Call) -> tuple[tuple[str, str], str | None, int | None]:
    """((call, qualname), file, line) of the user's line that made ``call``."""
    user, callee = user_site(call.frame)
    if callee is not None:
        label = describe_frame(callee)
    else:
        owner = type(call.subject).__name__ if call.subject is not None else ""
        name = call.name
        if name.endswith(" ="):  # an assignment to a module attribute: ``.bias =``
            label = (name, f"assignment to {owner}{name[:-2]}")
        elif name == "data":
            label = (".data =", "assignment to .data")
        else:
            label = (f"{name}()", f"{owner}.{name}" if owner else name)
    if user is None:
        return label, None, None
    return label, user.f_code.co_filename, user.f_lineno


def _shape_of(t: Any) -> Any:
    """``t.shape``, or None where it has none to tell (a lazy module's uninitialized parameter refuses the read)."""
    try:
        return getattr(t, "shape", None)
    except RuntimeError:
        return None

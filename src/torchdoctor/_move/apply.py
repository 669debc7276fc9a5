"""``move``: carry out a plan unit by unit, with an undo log, then verify nothing was left behind.

``torchdoctor._move.plan`` decides what moves where (and what is refused); this module changes the object, and
``torchdoctor._move.undo`` puts it back when anything fails: a tensor part-way, an interrupt, or the verification.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
import traceback
from typing import Any

import torch

from torchdoctor._move import holders
from torchdoctor._move import owners as q
from torchdoctor._move.available import refuse_missing
from torchdoctor._move.plan import Expect, Moved, MoveReport, _Plan, build
from torchdoctor._move.undo import (CastBack, Outcome, SetSlots, UndoLog, Unit, compact_of, irreplaceable,
                                   owns_storage)
from torchdoctor._placement import device_str, dtype_str, parse_device, parse_dtype, same_device
from torchdoctor._report.model import PlacementError, Problem
from torchdoctor._report.text import format_error, human_bytes

__all__ = ["move"]

log_ = logging.getLogger("torchdoctor.move")
_PARAM, _TENSOR = torch.nn.Parameter, torch.Tensor
_compatible = torch._has_compatible_shallow_copy_type
_ALWAYS = frozenset({"cpu", "meta"})  # device types that exist on every machine (no availability check)
_VERIFYING = "\0verifying"  # the cursor's value once every unit is in place (no path looks like it)


def _mode(rollback: bool | str) -> str:
    if rollback is True or rollback == "exact":
        return "exact"
    if rollback is False or rollback == "off":
        return "off"
    if rollback == "auto":
        return "auto"
    raise ValueError(f"rollback must be 'auto', 'exact' (or True) or False, not {rollback!r}")


def _claim(out: Outcome) -> tuple[str, list[str], str | None, list[Problem]]:
    """What the rollback achieved, as the object shows it: (headline part, rows, fix, one problem per tensor)."""
    problems = [Problem("not_restored", path, "", now, was, f"{path} is {now} after the rollback, was {was}")
                for path, now, was in out.differs]
    problems += [Problem("lost_precision", path, "", was, was, f"{path} was cast down and back: it lost precision")
                 for path, was in out.lossy]
    if out.differs:
        rows = [f"{path}  now {now}, was {was}" for path, now, was in out.differs]
        rows += [f"{path}  restored, lost precision" for path, _ in out.lossy]
        return (f"rolling back could not restore everything: the object IS half-moved; these {len(out.differs)} "
                "differ from before", rows, None, problems)
    if out.lossy:
        return (f"rolled back: every tensor has its old device and dtype again, but these {len(out.lossy)} were cast "
                "down and back and lost precision", [path for path, _ in out.lossy],
                "torchdoctor.move(obj, ..., rollback='exact')  # keeps the originals until the move is done", problems)
    return "rolled back: the object is as before", [], None, problems


def _undo(head: str, log: UndoLog, done: list[Moved], total: int
          ) -> tuple[str, list[str], str | None, list[Problem], BaseException | None]:
    """Roll back (unless rollback=False): (headline, rows, fix, problems, an interrupt met while rolling back)."""
    if log.mode == "off":
        return (f"{head}; NOT rolled back (rollback=False): these {len(done)} of {total} moved, the rest are where "
                "they were", [f"{m.path}  {m.src} -> {m.dst}" for m in done], None, [], None)
    out = log.rollback()
    claim, rows, fix, problems = _claim(out)
    return f"{head}; {claim}", rows, fix, problems, out.interrupt


def _interrupt(stop: BaseException, text: str) -> BaseException:
    """An interrupt stays an interrupt; its note says, in full, what the object is now."""
    if hasattr(stop, "add_note"):
        stop.add_note(f"torchdoctor: {text}")
    return stop


def move(obj: Any, device: str | torch.device | int | None = None, dtype: str | torch.dtype | None = None, *,
         non_blocking: bool = False, keep_fp32: bool = True, rollback: bool | str = "auto",
         optimizer: Any = "auto") -> MoveReport:
    """Move every tensor reachable from ``obj`` to ``device`` and cast its floating tensors to ``dtype``, in place.

    Reaches what ``Module.to`` misses (tensor attributes, list-held modules, quant_state, 8-bit state,
    containers), keeps ``Parameter`` objects and tied weights, never casts integer / packed / quantization
    tensors, keeps ``_keep_in_fp32_modules`` and fp32 peft adapters in fp32 (``keep_fp32=False`` casts what
    ``Module.to`` casts), verifies with ``scan``. Refuses up front (nothing moved) under accelerate offload
    hooks or with meta tensors to materialise.

    Optimizers that hold the moved parameters have their state moved with them: a state tensor that sat on its
    parameter's device, or had its parameter's dtype, follows it (Adam's ``exp_avg`` after a cast to float64);
    state kept apart on purpose (``step`` on cpu, fp32 state of a bf16 parameter, 8-bit optimizer state) stays.
    It is verified and rolled back with the model. ``optimizer="auto"`` (the default) finds them: nothing is
    searched when no parameter is held outside the model, else the caller's frames, then every object the GC
    tracks; the report names each one found (``report.optimizers``) or says it could not look. ``optimizer=opt``
    (or a list) takes exactly those; ``optimizer=None`` touches no optimizer.

    A device this machine does not have (``cuda:1`` on a CPU-only build) is refused before anything moves, with
    what to use instead (``torchdoctor.pick_device()``, or ``virtual_devices`` / ``simulate`` to try it).

    When anything fails part-way (an error, an out-of-memory, a ``KeyboardInterrupt``) or the verification finds a
    tensor left behind, everything is undone: the same objects come back, views share their storage again, grads
    come back with their parameters. ``rollback="auto"`` keeps no second copy on the filling device, so a narrowing
    same-device cast is undone by casting back, and the error names every tensor that lost precision;
    ``rollback="exact"`` (or True) keeps the originals until the move is done; ``False`` undoes nothing and lists
    what moved. An interrupt is re-raised as it is, with a note saying what the object is now.

    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> m.scale = torch.ones(2)            # Module.to leaves this behind
    >>> [(row.path, row.dst) for row in move(m, "meta", torch.bfloat16).moved]
    [('0.weight', 'bf16[2,2]@meta'), ('0.bias', 'bf16[2]@meta'), ('scale', 'bf16[2]@meta')]
    >>> m = torch.nn.Linear(2, 2); w = m.weight
    >>> _ = move(m, dtype=torch.bfloat16); m.weight is w, m.weight.dtype
    (True, torch.bfloat16)
    """
    t0 = time.perf_counter()
    dev = parse_device(device) if device is not None else None
    dt = parse_dtype(dtype) if dtype is not None else None
    if dev is None and dt is None:
        raise ValueError("move needs device= and/or dtype=, e.g. torchdoctor.move(model, 'cuda:0', torch.bfloat16)")
    if dt is not None and not (dt.is_floating_point or dt.is_complex):
        raise TypeError(f"move casts floating-point tensors only: dtype must be a floating dtype, not {dt}")
    if dev is not None and dev.type not in _ALWAYS:
        refuse_missing(dev)
    log = UndoLog(_mode(rollback))
    # The cyclic GC is paused as scan pauses it: move's records are freed by reference counting when it returns,
    # and a collection started by them would walk the whole heap (transformers and torch: ~350k objects) in the
    # middle of a cast (issue 28). Tensors are freed by reference counting either way.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _move(obj, dev, dt, keep_fp32, non_blocking, log, optimizer, t0)
    finally:
        if gc_was_enabled:
            gc.enable()


def _move(obj: Any, dev: torch.device | None, dt: torch.dtype | None, keep_fp32: bool, non_blocking: bool,
          log: UndoLog, optimizer: Any, t0: float) -> MoveReport:
    given = _given(optimizer)
    _owned(obj, given)
    p = build(obj, dev, dt, keep_fp32)
    p.raise_refusals()
    opt_state, opts, was, held, note = _optimizers(optimizer, given, p.steps)
    done: list[Moved] = []
    extra: list[str] = []
    cursor = [""]
    total, left = 0, []
    try:
        swapped: dict[int, torch.Tensor] = {}
        total = _apply(p, log, done, cursor, non_blocking, swapped)
        if opt_state is not None:
            opt_state.rekey(opts, swapped, log, was)
            for path, src, dst, nbytes in opt_state.apply(opt_state.plan(obj, opts, was), log, non_blocking, cursor):
                done.append(Moved(path, src, dst, nbytes))
                extra.append(path)  # optimizer state: Module.to never moves it
                total += nbytes
        cursor[0] = _VERIFYING
        left = _verify(obj, dev, dt, keep_fp32, p.expect)
        if opt_state is not None:
            left += opt_state.left_behind(obj, opts, was)
    except BaseException as exc:
        where = {_VERIFYING: "while verifying the result", "": "before the first tensor"}.get(cursor[0],
                                                                                             f"at {cursor[0]}")
        what = type(exc).__name__ + (f": {str(exc).splitlines()[0]}" if str(exc).strip() else "")
        head, rows, fix, problems, stop = _undo(f"move failed {where} after {len(done)} tensor(s) ({what})", log,
                                                done, len(p.steps))
        # the traceback's frames hold the new copies (on the target device): drop them with the failed move
        traceback.clear_frames(exc.__traceback__)
        full = format_error(head, rows, fix, limit=len(rows))
        log_.info("%s", full)
        if not isinstance(exc, Exception):
            raise _interrupt(exc, full)
        if stop is not None:
            raise _interrupt(stop, full) from exc
        raise PlacementError(format_error(head, rows, fix), problems=problems, fix=fix) from exc
    if left:
        head, rows, _, problems, stop = _undo(f"move finished but {len(left)} tensor(s) were left behind", log, done,
                                              len(p.steps))
        rows = [*rows, "left behind:", *(f"  {x}" for x in left)] if rows else left
        fix = "torchdoctor.scan(obj, device=..., dtype=...)  # for the details"
        log_.info("%s", format_error(head, rows, fix, limit=len(rows)))
        if stop is not None:
            raise _interrupt(stop, format_error(head, rows, fix, limit=len(rows)))
        raise PlacementError(format_error(head, rows, fix), problems=problems, fix=fix)
    _successors(log)
    kept = p.kept
    missed = [s.entry.path for s in p.steps if not s.entry.moved_by_module_to] + extra
    log.clear()  # frees kept originals now, not at the next gc
    del p, log
    seconds = time.perf_counter() - t0
    log_.info("moved %d tensor(s), %s, to %s in %.3f s", len(done), human_bytes(total),
              " ".join(x for x in (device_str(dev) if dev is not None else None,
                                   dtype_str(dt) if dt is not None else None) if x), seconds)
    held_by = opt_state.rows(opts, len(given), held, done) if opt_state is not None else ()
    return MoveReport(tuple(done), dev, dt, kept=tuple(kept), storage_bytes=total, seconds=seconds,
                      optimizers=held_by, notes=(note,) if note else (), missed=missed)


def _given(optimizer: Any) -> list[Any]:
    """The optimizers passed (checked before anything is planned); none for ``"auto"`` and ``None``."""
    if optimizer is None or (isinstance(optimizer, str) and optimizer == "auto"):
        return []
    from torchdoctor._move import optim

    return optim.optimizers(optimizer)


def _optimizers(optimizer: Any, given: list[Any], steps: list[Any]
                ) -> tuple[Any, list[Any], dict[int, tuple[torch.device, torch.dtype]], list[int], str]:
    """(``_move.optim``, the optimizers, where their parameters were, how many moved tensors each holds, a note),
    or (None, [], {}, [], note) without any: ``_move.optim`` is imported only when there is one, as the first
    ``move`` of a process pays every import (issue 28)."""
    opts, note = list(given), ""
    if isinstance(optimizer, str) and steps:
        wanted = holders.held_elsewhere(steps)
        if wanted:  # something besides the model holds a parameter: look for optimizers among those holders
            t0 = time.perf_counter()
            found = holders.search(wanted, given, sys._getframe(3))  # _optimizers <- _move <- move <- the caller
            opts += found.found
            log_.debug("optimizer search: %d tensor(s) held outside the model, %d optimizer(s) found %s in %.2f ms",
                       len(wanted), len(found.found), "after a pass over every tracked object" if found.heap else
                       "in the caller's frames", (time.perf_counter() - t0) * 1e3)
            if found.error:
                note = (f"could not look for optimizers holding these parameters ({found.error}): pass "
                        "move(obj, ..., optimizer=opt) to move an optimizer's state with them")
        del wanted
    if not opts:
        return None, [], {}, [], note
    from torchdoctor._move import optim

    return optim, opts, optim.before(opts), optim.holding(opts, {id(s.entry.tensor) for s in steps}), note


def _apply(p: _Plan, log: UndoLog, done: list[Moved], cursor: list[str], non_blocking: bool,
           swapped: dict[int, torch.Tensor]) -> int:
    """Move unit by unit, each change after its undo record; returns the bytes now held (each storage once).
    ``swapped`` collects the objects replaced by new ones (old id -> new), for the optimizers that hold them."""
    total = 0
    units = p.units()
    shared = _shared_storages(units) if log.mode == "auto" else set()
    debug = log_.isEnabledFor(logging.DEBUG)
    # a plain Parameter cast on its device, owning its storage, nothing kept: ``param.data = param.data.to(dtype)``
    # with one undo record (what install's Parameter path does, without the unit, the slots and the swaps)
    lean = (log.mode != "exact" and not non_blocking and not debug
            and not torch.__future__.get_overwrite_module_params_on_conversion())
    for unit in units:
        if len(unit) == 1:  # the common case, without the lists a unit of views needs
            s = unit[0]
            e = s.entry
            cursor[0] = e.path
            old = e.tensor
            tp = type(old)
            if (lean and tp is _PARAM and s.owns and s.sid is not None and s.sid not in shared and old.grad is None
                    and not irreplaceable(old)):
                data = old.data
                if data.device == s.device:
                    new = data.to(s.dtype)
                    if type(new) is _TENSOR and _compatible(old, new):
                        src = compact_of(old)
                        log.add(CastBack(old, new, e.path, src, data.dtype))
                        old.data = new
                        nbytes = new.nelement() * new.element_size()
                        total += nbytes
                        done.append(Moved(e.path, src, compact_of(new), nbytes))
                        del old, data, new  # the original is freed here, as Module.to frees it
                        continue
                    del new
                del data
            data = old.data if tp is _PARAM else old if tp is _TENSOR or q.is_wrapper(old) else q.data_of(old)
            src = compact_of(old)
            back = Unit([old], [data], _keeps(log, unit, [old], [data], shared))
            new = q.convert(data, s.device, s.dtype, non_blocking)
            back.news = [new]
            nbytes = _nbytes(new)
            total += nbytes
            q.install(e, s.aliases, new, s.device, s.dtype, log, back, 0, swapped, non_blocking, src)
            done.append(Moved(e.path, src, compact_of(new), nbytes))
            if debug:
                log_.debug("moved %s %s -> %s", e.path, src, done[-1].dst)
            del old, data, back, new  # a same-device cast must not keep the original alive past its unit
            continue
        cursor[0] = unit[0].entry.path
        olds = [s.entry.tensor for s in unit]
        datas = [o if q.is_wrapper(o) else q.data_of(o) for o in olds]
        before = [compact_of(t) for t in olds]
        back = Unit(olds, datas, _keeps(log, unit, olds, datas, shared))
        news = q.new_tensors([(s.entry.tensor, s.device, s.dtype) for s in unit], non_blocking)
        back.news = news
        total += news[0].untyped_storage().nbytes() if len(unit) > 1 else _nbytes(news[0])
        for i, (s, new, src) in enumerate(zip(unit, news, before)):
            cursor[0] = s.entry.path
            q.install(s.entry, s.aliases, new, s.device, s.dtype, log, back, i, swapped, non_blocking, src)
            done.append(Moved(s.entry.path, src, compact_of(new), _nbytes(new)))
        if debug:
            log_.debug("moved %s", "; ".join(f"{m.path} {m.src} -> {m.dst}" for m in done[-len(unit):]))
        del olds, datas, back, news  # a same-device cast must not keep the originals alive past their unit
    return total


def _keeps(log: UndoLog, unit: list[Any], olds: list[torch.Tensor], datas: list[torch.Tensor], shared: set[int]
           ) -> bool:
    """Whether the unit's originals stay referenced until the move is done (see ``torchdoctor._move.undo``)."""
    d, dev = datas[0].device, unit[0].device
    if log.keeps(not (d == dev or same_device(d, dev))):
        return True
    if log.mode != "auto":
        return False
    if len(olds) == 1:  # the common case, without generators
        if irreplaceable(olds[0]):
            return True
        sid = unit[0].sid
        return sid is not None and (sid in shared or not unit[0].owns)  # ``owns``: read by the plan
    if any(irreplaceable(o) for o in olds):
        return True
    sid = unit[0].sid  # the plan read it: views of one storage share the same data's storage
    return sid is not None and (sid in shared or not any(owns_storage(d) for d in datas))


def _shared_storages(units: list[list[Any]]) -> set[int]:
    """Storages reached by more than one unit (views the plan could not move as one)."""
    seen: set[int] = set()
    shared: set[int] = set()
    for unit in units:
        sid = unit[0].sid
        if sid is not None:
            (shared if sid in seen else seen).add(sid)
    return shared


def _nbytes(t: torch.Tensor) -> int:
    try:
        return t.nelement() * t.element_size()
    except Exception:
        return 0


def _verify(obj: Any, device: torch.device | None, dtype: torch.dtype | None, keep_fp32: bool,
            expect: Expect | None = None) -> list[str]:
    """Paths left behind: a fresh plan must be empty, and scan must find nothing on another device or on meta.
    A cast whose plan made an ``Expect`` is done when a fresh walk shows exactly what the plan made; anything else
    (and anything that differs) gets the fresh plan, which names what was left."""
    if expect is not None and expect.holds(obj):
        return []
    left = [str(s) for s in build(obj, device, dtype, keep_fp32).public()]
    if device is not None:
        from torchdoctor._scan.scan import scan  # a cast alone never needs it: the first move stays cheaper

        for prob in scan(obj, device=device, strict=True).problems:
            if prob.kind in ("device", "meta") and not any(x.startswith(prob.path + "  ") for x in left):
                left.append(f"{prob.path}  {prob.message}")
    return left


def _successors(log: UndoLog) -> None:
    """In a virtual run the moved Parameters are new objects (a twin cannot live in a real one): what the program
    does with the old ones it holds reaches the new ones, as the same objects would on the device."""
    space = sys.modules.get("torchdoctor._virtual.tensor")
    space = space.current_space() if space is not None else None
    if space is None:
        return
    from torchdoctor._virtual.replaced import succeeded

    for rec in log.records:
        if isinstance(rec, SetSlots) and isinstance(rec.strong, _PARAM) and rec.strong is not rec.new:
            succeeded(space, rec.strong, rec.new)


def _owned(obj: Any, given: list[Any]) -> None:
    """An optimizer passed for a model that holds none of its parameters is another model's: refused before
    anything moves (its state would stay behind, and the model meant was not moved)."""
    if not given or not isinstance(obj, torch.nn.Module):
        return
    mine = {id(t) for t in obj.parameters()}
    for opt in given:
        held = [t for g in getattr(opt, "param_groups", ()) for t in g.get("params", ())]
        if held and not any(id(t) in mine for t in held):
            raise ValueError(f"optimizer={type(opt).__name__} holds none of the parameters of the "
                             f"{type(obj).__name__} moved: pass the model it trains, or the optimizer of this one")

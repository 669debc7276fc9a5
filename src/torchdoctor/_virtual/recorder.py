"""The recorder of a virtual run: the strict rules on every op, module-entry checks, problems by path with the
culprits first, and the op going on as if fixed so one run finds every problem."""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._rules.registry import OpArgs
from torchdoctor._report.model import Problem
from torchdoctor._placement import FLOAT8_DTYPES, norm_device, compact, device_str, dtype_str, parse_device
from torchdoctor._virtual.groups import at_entry as _at_entry, culprits_then_rest as _culprits_then_rest, picked, \
    policy_blamed, root_holds
from torchdoctor._virtual.metaread import offloaded_here
from torchdoctor._virtual.heldby import never_moved
from torchdoctor._virtual.movecheck import MoveChecks, not_refused
from torchdoctor._virtual.patched import apart
from torchdoctor._virtual.origin import from_origin, operand_at, ran_as_asked, where_called
from torchdoctor._virtual.promote import Promotions, mixed
from torchdoctor._virtual.scripted import Entered
from torchdoctor._virtual.split import note_like, odd_ones, placed_apart
from torchdoctor._virtual.stackview import StackView
from torchdoctor._virtual.keptside import kept_home, kept_side, kept_tag
from torchdoctor._virtual.tensor import Hooks, VirtualTensor, held_by, is_entry as _is_entry, standin
from torchdoctor._virtual.training import amp_backward
from torchdoctor._virtual.written import INT_KERNEL, keeps_written, keeps_written_dtype
from torchdoctor._virtual.argside import computed, local_at, model_made, model_side
from torchdoctor._virtual.lifted import note_source as swap_source, said as swapped_said, swapped_odd
from torchdoctor._tracker import ModuleStack

_CPU = torch.device("cpu")
LIMIT = 100  # problems stored; the run goes on and counts the rest
_DATA_OPS = ("_local_scalar_dense", "nonzero", "item", "tolist", "numpy", "masked_select", "unique", "equal",
             "is_nonzero", "repeat_interleave", "__array__")
_DATA_TEXTS = ("cannot be called on meta", "data-dependent", "data-independent", "nonzero()")  # a mask's index


class _Stop(BaseException):
    """Ends a simulation early (what it cannot run); a BaseException: ``except Exception`` does not swallow it."""


class _Recorder(MoveChecks, StackView, Hooks):
    """Runs the strict rules on every op, records problems by path, and lets the op go on as if fixed."""

    def __init__(self, profile: DeviceProfile, device: torch.device, dtype: torch.dtype | None, limit: int,
                 roles: dict[str, str]) -> None:
        from torchdoctor._rules import registry as _rules

        self.rules, self.profile, self.device, self.dtype, self.limit = _rules, profile, device, dtype, limit
        self.roles = roles
        self.roots: list[nn.Module] = []
        self._model_dtype: torch.dtype | None = None
        self._apart: bool | None = None  # the program placed the model's parts on several devices (``split``)
        self._into = False  # the op's culprits are read by an in-place op (or its ``out=``) into its written tensor
        self._go_on: tuple[list[Any], Any] | None = None  # (culprits, device) the op goes on with, when not the named
        self.problems: list[Problem] = []
        self.seen: set[tuple[str, ...]] = set()
        self.stopped: str | None = None
        self.overflow: list[Problem] = []  # problems met after the limit: counted, and the run goes on
        self.blamed = 0
        # (kind, path, op, found) of a problem on a tensor made in the run -> the named tensors it was made from
        self.sources: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._cases: Any = None  # the failing ops, as metadata twins: each fix is proven on them after the run
        self.use_stack(ModuleStack(roles))

    @property
    def cases(self) -> Any:  # ``atop.Cases``: the proof machinery loads with the first failing op, never before
        if self._cases is None:
            from torchdoctor._virtual.atop import Cases
            self._cases = Cases()
        return self._cases

    def use_stack(self, stack: ModuleStack) -> None:
        """Track modules with ``stack``; owned tensors are checked when each module starts."""
        from torchdoctor._virtual.entry import EntryCheck

        self.modules = stack
        self.where = stack.where
        self.promotions = Promotions(stack)
        self.entry = EntryCheck(self.device, self._entry_note, self._dispatched)
        stack.on_enter = Entered(self.entry, self._entry_note, self.device, stack)

    def _entry_note(self, kind: str, path: str, found: str, expected: str, message: str, op: str, role: str,
                    shown: str, source: str | None = None) -> None:
        if kind == "device" and kept_home(self, found, expected):
            return  # a component kept there on purpose: the op that meets its input says so (``keptside``)
        mpath, mtype = self.where()
        if source is not None:  # the line that made it so (a copy taken to the cpu there): its fix goes there
            self.sources.setdefault((kind, path, op, found), (source,))
        self._add(Problem(kind, path, self.roles.get(path, role), found, expected, message, op=op,
                          module_path=mpath, module_type=mtype, tensors=(f"{path}: {shown}",)),
                  key=(kind, path, self._root_key()))

    def _root_key(self) -> int:  # two roots of a run may hold one path (an Embedding's and a Linear's ``weight``)
        """The outermost running module: each root its own problem; a tensor's entry finding and its ops, one."""
        return id(self.modules.stack[0]) if self.modules.stack else 0

    def culprits_first(self, problems: list[Problem], roots: list[Any]) -> list[Problem]:
        """Culprits first, the ops where problems surfaced second: the model tensors the policy finds off (scan's
        verdict on the run's own objects) that match what the ops found wrong, then the module-entry checks' finds."""
        problems = not_refused(problems, problems)  # (the ops that met a tensor whose move was refused: its own)
        # one tensor met by two outermost calls (a helper held in a list, called after the model) is one problem;
        # two roots' tensors that share a path differ in what they hold (``tensors``) and stay two
        entry = list({(p.kind, p.path, p.found, p.tensors): p for p in problems if _at_entry(p)}.values())
        rest = [p for p in problems if not _at_entry(p)]
        blamed = policy_blamed(problems, roots, {p.path for p in entry}, self._split(), self.sources)
        # an op that met the culprit itself (a tied lm_head reading the upcast embedding) joins the culprit's line
        met = {(p.path, p.kind, p.found): p for p in reversed(rest)}
        blamed = [replace(b, message=f"{b.message}; it surfaced at {m.op}: {m.message}", op=m.op)
                  if (m := met.get((b.path, b.kind, b.found))) is not None else b for b in blamed]
        named = {(b.path, b.kind, b.found) for b in blamed}
        rest = [p for p in rest if (p.path, p.kind, p.found) not in named]
        self.blamed = len(blamed) + len(entry)
        origin: dict[tuple[str, ...], str] = {(b.kind, b.found): b.path for b in blamed}
        for p in entry:  # a module-entry finding is the origin of what its module's ops then meet
            origin.setdefault((p.kind, p.found, p.module_path or ""), p.path)
        # a run some of whose matmul-like ops computed in the dtype asked for ran in it: a component kept in another
        # dtype on purpose (a VAE kept float32 in a float16 pipeline, peft's float32 adapters) is the program's choice
        computed = getattr(self, "computed", None)
        ran = ran_as_asked(self.dtype, roots, computed) if self.dtype not in (computed or {}) else []
        return not_refused(blamed, problems) + entry + \
            [from_origin(p, origin, {b.path for b in blamed}) for p in rest] + ran

    def check(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.entry.pending:  # an attribute / container tensor reached an op: the forward read it
            self.entry.reached(OpArgs(list(args), kwargs).all_tensors())
        findings = self.rules.find(func, args, kwargs, self.profile)
        # a silent promotion (bf16 * fp32 -> fp32): guard's policy; an op the rules found in the wrong dtype is that
        promo = self.promotions.findings(func, args, kwargs) if mixed(args) and not any(
            f.problem.kind == "dtype" for f in findings) else []
        if not findings and not promo:
            return args, kwargs
        new_args, new_kwargs = list(args), dict(kwargs)
        call = OpArgs(new_args, new_kwargs)
        for f in promo:
            self._promoted(f, OpArgs(args, kwargs))
        quiet = torch._C._current_graph_task_id() != -1  # autograd's own op: its forward's problem said it
        for f in (*findings, *promo):  # device and meta first, then dtype, then what the profile cannot run
            self._handle(func, f, call, quiet and (any(q.kind == f.problem.kind for q in self.problems) or amp_backward(f)))
        # the operands as they came and as the run goes on with them: the fix is proven on them (``atop``)
        self.cases.keep(func, (args, kwargs), (new_args, new_kwargs), self._tags, promo[0].target if promo else None)
        return tuple(new_args), new_kwargs

    def _tags(self, t: Any) -> tuple[tuple[str, ...], bool]:
        from torchdoctor._virtual.atop import tags_of
        tags, named = tags_of(t, self.modules.paths)
        # a copy the program took to the cpu and handed in as a module's tensor (``functional_call``): its views
        # (``weight.t()`` in a linear) are named by that line too, so its fix is proven at the op
        moved = self.entry.copies.get(tags[0]) if tags and getattr(t, "_td_device", None) == _CPU else None
        tags = (*tags, moved) if moved is not None and moved not in tags else tags
        if (mine := kept_tag(t)) is not None:  # an input handed to a component kept so on purpose (``keptside``)
            tags = (*tags, mine)
        # the name the program's failing line calls it by (``coef`` in ``g.mul_(coef)``): a fix of that operand at
        # the call (``operandfix``) sets it so, and is proven on these twins (kept for failing ops only)
        at = operand_at(t) if not named else None
        if at is None and not named and self._into and isinstance(t, VirtualTensor):
            at = local_at(t)  # made at the line from the local a fix moves there (``labels != -100``)
        return ((*tags, f"operand {at}") if at is not None else tags), named

    def _promoted(self, f: Any, call: OpArgs) -> None:
        """A model tensor of a wider floating dtype promotes what it meets: named by its path, as the model holds it."""
        for k in f.offenders:
            t = call.at(k)
            hit = self.promotions.path(t)
            if hit is not None:
                self.roles.setdefault(hit[0], hit[1])
                if isinstance(t, VirtualTensor) and t._td_path is None and getattr(t, "_td_real", None) is None:
                    t._td_path = hit[0]

    def failed(self, what: str, exc: BaseException | None, hint: str = "") -> None:
        text = str(exc).strip().splitlines()[0] if exc is not None and str(exc).strip() else ""
        if exc is not None and not isinstance(exc, NotImplementedError) and "meta" not in text.lower() \
                and "fake impl" not in text:
            return  # a genuine error of the user's code: it propagates
        if exc is not None and INT_KERNEL.search(text):  # no kernel for an integer or bool dtype: every device
            return  # refuses it alike (a lerp of an int64 buffer), the program's own error, raised as there
        if not hint and (any(n in what for n in _DATA_OPS) or any(n in text for n in _DATA_TEXTS)):
            hint = "it needs tensor values; simulate with data='cpu'"
        hint = hint or "it has no meta/fake kernel, so it cannot run without the hardware"
        self.stop_unsupported(what, f"{what} cannot be simulated: {hint}" + (f" ({text})" if text else ""))

    def refused(self, op: str, culprits: list[torch.Tensor], expected: torch.dtype, exc: BaseException) -> bool:
        """The kernel refused the odd-dtype tensors (fp8 promotion and kin): a problem by path, then go on cast."""
        text = (str(exc).strip().splitlines() or [""])[0]
        if torch._C._current_graph_task_id() != -1 and amp_backward(None):
            return True  # a backward op under the run's autocast: autograd casts each grad on the device
        for t in culprits:
            origin = getattr(t, "_td_origin", None)
            path = getattr(t, "_td_path", None) or (origin.first_path if origin is not None else None)
            dev = getattr(t, "_td_device", t.device)
            self._note("dtype", path, dtype_str(t.dtype), dtype_str(expected),
                       f"{path or 'a tensor'} {compact(t.dtype, tuple(t.shape), dev)} meets {dtype_str(expected)} in "
                       f"{op}: the kernel refuses ({text}); cast it to {dtype_str(expected)} before use", op=op,
                       key=f"{path}:{t.dtype}")
        return True

    def unsupported(self, path: str | None, what: str, why: str) -> None:
        """A tensor no virtual twin can stand in for: reported at its path, the run goes on without it."""
        self._note("unsupported", path, what, "", f"{path or 'a tensor'} cannot be simulated: {why}", op=what,
                   role="attribute", key=f"{path}:{what}")

    def escaped(self, exc: BaseException) -> bool:
        """A placement error raised by a check in Python before any op ran (``nn.LSTM`` compares its input's dtype
        with its weights' in Python): recorded at the module whose code raised, and the run ends there. False when
        the exception is not about placement (it is the user's own, and propagates)."""
        from torchdoctor._virtual.escaped import escaped_problem  # what an error the program met was: only on one
        found = escaped_problem(exc, self.modules.paths)
        if found is None:
            return False
        problem, self.stopped, sources = found  # sources: the named tensors its input was made from
        self.sources.setdefault((problem.kind, problem.path, problem.op or "", problem.found), sources)
        with contextlib.suppress(_Stop):
            self._add(problem, key=(problem.kind, problem.path, "escaped"))
        return True

    def stop_unsupported(self, op: str, message: str) -> None:
        self._note("unsupported_op", None, op, "", message, op=op, role="op")
        self.stopped = message
        raise _Stop()

    # -- recording and fixing -----------------------------------------------------------------------------------
    def _note(self, kind: str, path: str | None, found: str, expected: str, message: str, op: str = "Tensor.to",
              role: str = "activation", key: str | None = None) -> None:
        mpath, mtype = self.where()
        place = path or ((mpath or "<root>") if mtype else "<top level>")
        self._add(Problem(kind, place, self.roles.get(path or "", role), found, expected, message, op=op,
                          module_path=mpath, module_type=mtype), key=(kind, key) if key else (kind, place, op))

    def _add(self, problem: Problem, key: tuple[Any, ...]) -> None:
        key = tuple(str(k) for k in key)
        if key in self.seen:
            return
        self.seen.add(key)
        if len(self.problems) >= self.limit:  # never ends the user's code: kept apart, counted in the report
            self.overflow.append(problem)
            return
        self.problems.append(problem)

    def _handle(self, func: Any, f: Any, call: OpArgs, quiet: bool = False) -> None:
        p = f.problem
        culprits, anchor = self._culprits(func, f, call)
        tensors = [call.at(k) for k in culprits]
        mpath, mtype = self.where()
        place = (mpath or "<root>") if mtype else "<top level>"
        where = f" (in {place}, {mtype})" if mtype else ""
        listed = tuple(f"{d} ({t._td_path})" if getattr(t, "_td_path", None) else d
                       for d, t in zip(self.rules.describe_args(func, call.args, call.kwargs), call.all_tensors()))
        op, on_device = p.op or str(func), p.kind in ("device", "meta")
        # one problem per named tensor (weights, buffers, quant_state); activations share one
        named = [t for t in tensors if _is_entry(t)]
        for t in named or [t for t in tensors if t._td_path][:1] or tensors[:1] or [None]:
            path = (t._td_path or held_by(t)) if t is not None else None  # held_by: as the program names it
            origin = getattr(t, "_td_origin", None)
            if path is None and t is not None and t.dtype in FLOAT8_DTYPES and origin is not None and origin.first_path:
                path = origin.first_path  # float8 flows unchanged from its table: the table is the culprit, by path
            found, expected, message, named_at, net = p.found, p.expected, p.message, None, None
            if p.kind == "missing_kernel" and (at := where_called()):  # the op at the user's line
                message = message.replace(": ", f" at {at}: ", 1)
            if p.kind == "unsupported_dtype" and not mtype:  # a library's own op outside the model (GradScaler's
                from torchdoctor._virtual.libfloat import library_line  # float64): its line named; a forward's: the model's
                message += library_line(1) or ""
            if p.kind == "unsupported_dtype" and origin is not None and origin.source.at:  # its maker's line
                message += f"; the operand is {origin.describe(self.modules.path_of)}"
            expected = (device_str(anchor) if on_device else dtype_str(anchor)) if anchor is not None else expected
            if t is not None and p.kind != "unsupported_dtype":
                found = device_str(t._td_device) if on_device else dtype_str(t.dtype)
                net = apart(origin.source, self.roots or self.modules.outermost) if origin is not None else None
                made = origin.describe(self.modules.path_of, on_device) if origin else "a tensor made in forward"
                if net is not None:  # a network patched into the model's forward: one problem, its fix the network's
                    made = f"{made} ({net[1]})"
                    self.sources.setdefault((p.kind, place, op, found), net[0])
                # an operand between parts, or a 0-dim into an in-place op: at its line
                split = on_device and anchor is not None and (self._into or self._split())
                named_at = operand_at(t) if f.fixed or split else None  # a loss's target: named as the call passes it
                if named_at is None and split and self._into:  # made at the line from a local (``labels != -100``)
                    named_at = local_at(t)
                if split and named_at:
                    note_like(named_at, call.all_tensors(), anchor)  # moved to the device of what it meets
                made = f"{named_at} ({made})" if named_at and not path else made
                what = f"{path or made} {compact(t.dtype, tuple(t.shape), t._td_device)}"
                moved = origin.moved_copy(t, found, self.modules.path_of) if origin and path and on_device else None
                if moved is not None:  # the model's own tensor is elsewhere: fixed at the line that moved the copy
                    what += moved[0]
                    self.sources.setdefault((p.kind, str(path), str(op), found), (moved[1],))
                message = {"device": f"{what} is on {found} while {op} runs on {expected}",
                           "meta": f"{what} holds no data (meta) and meets real tensors on {expected} in {op}",
                           "dtype": f"{what} is {found} while {op} computes in {expected}"}.get(p.kind, message)
                if p.kind == "meta" and (p.kind, path or place, op, found) not in self.sources and \
                        (hit := offloaded_here()) is not None:  # an offloaded weight read outside
                    message += f" ({hit[1][0].splitlines()[0].removeprefix('culprit ')})"  # its module's call
                    self.sources.setdefault((p.kind, path or place, op, found), (hit[0],))
                if on_device and (swap := swapped_said(t)) is not None:  # offloaded between forward and backward
                    message += f" ({swap})"
                    self.sources.setdefault((p.kind, path or place, op, found), (swap_source(t, path),))
                if t.dtype in FLOAT8_DTYPES and p.kind == "dtype":
                    message += " (torch refuses: Promotion for Float8 Types is not supported; cast it first)"
                elif "promotes the model's" in p.message:  # guard's promotion finding: no error says it
                    message += f" and promotes it to {found} silently (no error; the result computes in {found})"
            entry = _is_entry(t)
            key = (p.kind, found, "op") if p.kind == "unsupported_dtype" else \
                (p.kind, path, self._root_key()) if entry else (p.kind, net[2], found) if net else (p.kind, place, op, found)
            held = path is not None and t is not None and not t._td_path  # named by the program (``heldby``)
            role = self.roles.get(path or "", "held" if held else "parameter" if t is not None and t._td_path and
                                  not self.roles and root_holds(self.modules.stack, t._td_path) else "activation")
            message += never_moved(t, str(path)) if held and role == "held" else ""  # an EMA copy made before the move
            if named_at is not None:  # fixed where the call passes it
                self.sources.setdefault((p.kind, path or place, op, found), (f"operand {named_at}",))
            if not quiet:
                self._add(Problem(p.kind, path or place, role, found, expected,
                                  message + where, op=op, module_path=mpath, module_type=mtype, tensors=listed), key)
            if path is None and origin is not None and (src := origin.placed_by if on_device else origin.source).paths:
                self.sources.setdefault((p.kind, place, op, found), src.paths)
            elif path is None and origin is not None and src.op == "Tensor.to" and src.at and on_device:
                self.sources.setdefault((p.kind, place, op, found), (f"moved a tensor at {src.at}",))  # taken back
            elif path is None and origin is not None and src.op.startswith("torch.") and p.kind in ("device", "dtype"):
                mp = self.modules.paths.get(id(src.module)) if src.module is not None else None  # a factory's call
                self.sources.setdefault((p.kind, place, op, found), ((f"factory {src.op} in `{mp or '<root>'}`"
                                        if src.module is not None else f"factory {src.op}")
                                        + (f" at {src.at}" if src.at else ""),))
        if self._go_on is not None:  # named as before, but the written tensor stays where the program keeps it
            culprits, anchor = self._go_on
            tensors = [call.at(k) for k in culprits]
        if anchor is not None:
            for k, t in zip(culprits, tensors):
                call.put(k, standin(t, anchor))

    def _culprits(self, func: Any, f: Any, call: OpArgs) -> tuple[list[Any], Any]:
        """Which arguments to blame and fix, and the value that fixes them (a device or a dtype)."""
        p, offenders = f.problem, list(f.offenders)
        self._into, self._go_on = False, None
        if p.kind in ("unsupported_dtype", "missing_kernel"):
            return offenders, None  # reported; the kernel runs anyway, and casting would invent dtype problems
        if f.fixed:
            return offenders, f.target
        if p.kind == "meta":
            with contextlib.suppress(ValueError, TypeError, RuntimeError):
                if (real := parse_device(p.expected)).type != "meta":
                    return offenders, real
            return offenders, self.device
        if p.kind == "device" and (swapped := swapped_odd(list(f.considered) or offenders, call)) is not None:
            return swapped  # a parameter an offload took away after an op saved it: the backward meets it there
        schema = getattr(func, "_schema", None)
        name = getattr(schema, "name", "")
        if p.kind == "device" and (kept := keeps_written(schema, f, call)) is not None:
            self._into = True  # fixed at the op's line, by the name it has there (``coef.to(g.device)``)
            if not any(model_made(call.at(k)) for k in kept[0]) or computed(call.at(kept[2][0])):
                return kept[0], kept[1]  # ``losses.masked_fill_(mask, 0)``: what it reads is the odd one out
            # the model's tensors (or what they made) read into a copy kept elsewhere (``ema[n].lerp_(p)``, an EMA's
            # ``s.sub_(d * (s - p))``): the problem names the written one (the model is where it belongs, and a
            # copy of self is no fix), and the op still writes where self is
            self._go_on, self._into = (kept[0], kept[1]), False
            return kept[2], norm_device(call.at(kept[0][0])._td_device)  # ``losses.masked_fill_(mask, 0)``: the written tensor stays; what it reads joins it
        if p.kind == "dtype" and (kept_dt := keeps_written_dtype(schema, f, call)) is not None:
            return kept_dt  # an EMA kept in float32 updated in place from a bf16 model: what it reads is cast
        if p.kind == "device" and name in _INDEX_OPS and offenders and offenders[0][0] != 0 and not self._split():
            table = call.at((0, -1))  # a table left behind, indexed with indices on the device
            if (_is_entry(table) or table._td_device.type == "cpu") and not any(_is_entry(call.at(k)) for k in offenders):
                return [(0, -1)], call.at(offenders[0])._td_device  # (a scheduler's cpu table: moved at the line)
        value = (lambda t: norm_device(t._td_device)) if p.kind == "device" else (lambda t: t.dtype)
        groups: dict[Any, list[Any]] = {}
        for k in list(f.considered) or offenders:
            groups.setdefault(value(call.at(k)), []).append(k)
        # for devices, weights are the usual culprits (activations follow the inputs) unless they sit where the run was
        # asked to go, no hook spreading them: then a tensor made elsewhere is (``.cuda()`` meeting cuda:1 weights)
        with_entries = [v for v, ks in groups.items() if any(_is_entry(call.at(k)) for k in ks)]
        if p.kind == "device" and self._split() and (odd := odd_ones(groups, with_entries, call.all_tensors())):
            return odd  # each part where the program put it
        if p.kind == "device" and not with_entries and self._dispatched() and (odd := model_side(groups, call)):
            self._into = True  # fixed at the op's line: the argument's name there, moved to the model's side
            return odd  # a loss inside a split model's forward: the caller's ``labels`` join the model's side
        if (side := kept_side(self, p, p.op or str(func), groups, with_entries, call)) is not None:
            return side  # a component kept so on purpose: the input handed to it is the odd one (``keptside``)
        if p.kind == "device" and len(groups) == 2 and len(with_entries) == 1:
            other = next(v for v in groups if v != with_entries[0])
            if (with_entries[0] == self.device or with_entries[0].type == self.device.type and other.type == "cpu") \
                    and not self._dispatched():  # (or on the index the program picked: cuda:0 for cuda:1)
                return groups[other], with_entries[0]
            return groups[with_entries[0]], other
        prefer = picked(groups, self.device) if p.kind == "device" else self.dtype or self.model_dtype()
        if prefer is not None and prefer in groups:  # the requested device / dtype, else the model's own dtype
            return [k for v, ks in groups.items() if v != prefer for k in ks], prefer
        return offenders, f.target

    def _dispatched(self) -> bool:
        """A module under an accelerate hook, or in a model the program split itself: not ``device=``'s device."""
        return any("_hf_hook" in getattr(m, "__dict__", {}) for m in self.modules.stack) or self._split()

    def _split(self) -> bool:
        if self._apart is None:
            self._apart = placed_apart(self.roots or self.modules.outermost, self.profile.type)
        return self._apart and not any("_hf_hook" in getattr(m, "__dict__", {}) for m in self.modules.stack)


_INDEX_OPS = frozenset({"aten::index", "aten::_unsafe_index", "aten::index_put", "aten::index_put_",
                        "aten::_index_put_impl_", "aten::_unsafe_index_put"})


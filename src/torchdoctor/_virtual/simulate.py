"""``simulate``: would this run on ``cuda:1`` / ``xpu`` / ``mps``, without that hardware?

The user's object is deep-copied with every reachable tensor replaced by a virtual twin that keeps its current
placement (``_virtual``: no weight bytes are copied); then, as a user would, the copy is moved (``obj.to(device,
dtype)``) and called, or ``call(copy)`` runs. Every aten op is checked by the strict rules (``_rules.find``) against
a ``DeviceProfile``; a problem is recorded with the module and tensor paths, then the op goes on as if it had been
fixed (the culprits relabelled or cast), so one run reports every problem, not only the first.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._report.text import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, render_problems, schema
from torchdoctor._report.html import HtmlMapMixin
from torchdoctor._report.model import Problem, Target, summarize
from torchdoctor._placement import norm_device, compact, device_str, dtype_str, parse_device, parse_dtype
from torchdoctor._virtual.tensor import Hooks, Space, VirtualTensor, is_virtual, make, virtual_copy
from torchdoctor._tracker import ModuleStack
from torchdoctor._virtual.runtime import virtual_world
from torchdoctor._report.text import public_types

__all__ = ["SimulationReport", "simulate"]

log = logging.getLogger("torchdoctor.simulate")
LIMIT = 100  # problems recorded before the run stops
# what a device runtime call this simulator does not answer raises: a cannot-check, not a finding about the model
_NO_RUNTIME = ("not compiled with", "not linked with support", "Cannot access accelerator", "no CUDA GPUs",
               "Found no NVIDIA driver")
_DATA_OPS = ("_local_scalar_dense", "nonzero", "item", "tolist", "numpy", "masked_select", "unique", "equal",
             "is_nonzero", "repeat_interleave", "__array__")


class _Stop(BaseException):
    """Ends a simulation early; a BaseException, so ``except Exception`` in user code does not swallow it."""


@dataclass(frozen=True)
class SimulationReport(HtmlMapMixin):
    """What ``simulate`` found: ``.ok``, ``.problems`` (every problem, not only the first), ``.to_dict()``.
    ``device``/``dtype`` are torch objects here and strings in ``to_dict()``."""

    device: torch.device
    dtype: torch.dtype | None
    data: str
    profile: DeviceProfile
    problems: tuple[Problem, ...]
    ops: int = 0
    seconds: float = 0.0
    stopped: str | None = None  # why the run ended early, if it did
    summary: tuple[dict[str, Any], ...] = ()  # tensors by device and dtype after the move
    culprits: int = 0  # the first ``culprits`` problems are model tensors that caused the ones after them

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok

    def exit_code(self) -> int:
        """0 ok, 1 problems, 2 something could not be simulated (an ``unsupported_op``)."""
        if any(p.kind == "unsupported_op" for p in self.problems):
            return EXIT_USAGE
        return EXIT_PROBLEMS if self.problems else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        p = self.profile
        return {
            "schema": schema("simulate"), "ok": self.ok, "device": device_str(self.device),
            "dtype": dtype_str(self.dtype) if self.dtype is not None else None, "data": self.data,
            "profile": {"type": p.type, "count": p.count, "capability": list(p.capability), "memory": p.memory,
                        "name": p.name},
            "problems": [q.to_dict() for q in self.problems], "ops": self.ops, "seconds": round(self.seconds, 4),
            "stopped": self.stopped, "summary": list(self.summary),
        }

    def text(self, limit: int = 40) -> str:
        where = device_str(self.device) + (f" in {dtype_str(self.dtype)}" if self.dtype else "")
        head = f"{self.ops} ops on virtual {where}, {self.seconds:.2f} s"
        lines = [f"ok: no placement problems ({head})"] if self.ok else \
            [f"{len(self.problems)} problem(s) ({head}):", *_culprits_then_rest(self.problems, self.culprits, limit)]
        if self.stopped:
            lines.append(f"stopped early: {self.stopped}")
        lines.extend(f"  {g['device']:<8} {g['dtype']:<14} {g['tensors']:>7} tensors" for g in self.summary[:limit])
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def _from_origin(p: Problem, origin: dict[tuple[str, ...], str]) -> Problem:
    """A tensor made in forward names the model tensor its wrong dtype or device came from."""
    src = origin.get((p.kind, p.found)) or origin.get((p.kind, p.found, p.module_path or ""))
    if src is None or "a tensor made in forward" not in p.message:
        return p
    return replace(p, message=p.message.replace("a tensor made in forward",
                                                f"a tensor made in forward from {src} ({p.found})", 1))


def _culprits_then_rest(problems: tuple[Problem, ...], n: int, limit: int) -> list[str]:
    if not n:
        return render_problems(problems, limit)
    return [*render_problems(problems[:n], limit), "  where they surfaced:",
            *render_problems(problems[n:], max(1, limit - n))]


class _Recorder(Hooks):
    """Runs the strict rules on every op, records problems by path, and lets the op go on as if fixed."""

    def __init__(self, profile: DeviceProfile, device: torch.device, dtype: torch.dtype | None, limit: int,
                 roles: dict[str, str]) -> None:
        from torchdoctor._rules import registry as _rules

        self.rules, self.profile, self.device, self.dtype, self.limit = _rules, profile, device, dtype, limit
        self.roles = roles
        self.roots: list[nn.Module] = []
        self._model_dtype: torch.dtype | None = None
        self.problems: list[Problem] = []
        self.seen: set[tuple[str, ...]] = set()
        self.stopped: str | None = None
        self.blamed = 0
        self.use_stack(ModuleStack(roles))

    def use_stack(self, stack: ModuleStack) -> None:
        """Track modules with ``stack``; owned tensors are checked when each module starts."""
        from torchdoctor._virtual.entry import EntryCheck

        self.modules = stack
        self.where = stack.where
        stack.on_enter = EntryCheck(self.device, self._entry_note, self._dispatched)

    def _entry_note(self, kind: str, path: str, found: str, expected: str, message: str, op: str, role: str,
                    shown: str) -> None:
        mpath, mtype = self.where()
        self._add(Problem(kind, path, self.roles.get(path, role), found, expected, message, op=op,
                          module_path=mpath, module_type=mtype, tensors=(f"{path}: {shown}",)), key=(kind, path))

    def culprits_first(self, problems: list[Problem], roots: list[Any]) -> list[Problem]:
        """The model tensors the policy finds off (what scan reports on the run's own objects), matching what the
        ops found wrong, go first: the op where a problem surfaced comes second."""
        from torchdoctor._guard.provenance import policy_problems, suspects
        from torchdoctor._walk import walk

        bad = {p.found for p in problems if p.kind in ("dtype", "device")}
        kinds = {p.kind for p in problems} & {"dtype", "device"}
        if not bad:
            return problems
        have = {p.path for p in problems}
        blamed: list[Problem] = []
        try:
            for root in roots:
                found = policy_problems(walk(root))
                for kind in sorted(kinds):
                    for sus in suspects(found, kind, bad, [], None):
                        if sus.matches and sus.problem.path not in have:
                            have.add(sus.problem.path)
                            blamed.append(replace(sus.problem, message=f"culprit: {sus.problem.message}"))
        except Exception:  # provenance is extra: the problems stand without it
            return problems
        self.blamed = len(blamed)
        origin: dict[tuple[str, ...], str] = {(b.kind, b.found): b.path for b in blamed}
        for p in problems:  # a module-entry finding is the origin of what its module's ops then meet
            if p.op is not None and p.op.endswith(".forward") and p.module_path is not None:
                origin.setdefault((p.kind, p.found, p.module_path), p.path)
        return blamed + [_from_origin(p, origin) for p in problems]

    # -- Hooks --------------------------------------------------------------------------------------------------
    def check(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        findings = self.rules.find(func, args, kwargs, self.profile)
        if not findings:
            return args, kwargs
        call = _Args(list(args), dict(kwargs))
        for f in findings:  # device and meta first, then dtype, then what the profile cannot run
            self._handle(func, f, call)
        return tuple(call.args), call.kwargs

    def exists(self, target: torch.device, path: str | None, op: str) -> None:
        if target.type == self.profile.type and (target.index or 0) >= self.profile.count:
            self._note("device", path, device_str(target), f"{self.profile.type}:0..{self.profile.count - 1}",
                       f"{device_str(target)} does not exist (invalid device ordinal): the simulated profile has "
                       f"{self.profile.count} {self.profile.type} device(s)", op=op, key=device_str(target))

    def _moving(self, tensor: torch.Tensor, target: torch.device, dtype: torch.dtype) -> torch.dtype:
        src = getattr(tensor, "_td_device", tensor.device)
        path = getattr(tensor, "_td_path", None)
        self.exists(target, path, "Tensor.to")
        what = f"{path or 'a tensor'} {compact(tensor.dtype, tuple(tensor.shape), src)}"
        if src.type == "meta" and target.type != "meta":
            self._note("meta", path, "meta", device_str(target), f"{what} holds no data (meta): moving it to "
                       f"{device_str(target)} raises 'Cannot copy out of meta tensor'. Load or materialise it first, "
                       "or pass assume_device= if the model is built on meta on purpose")
        if target.type == self.profile.type and not self.profile.supports(dtype, "storage"):
            self._note("unsupported_dtype", path, dtype_str(dtype), f"a dtype {target.type} supports",
                       f"{what} moved to {device_str(target)} as {dtype_str(dtype)}: {target.type} cannot hold "
                       f"{dtype_str(dtype)} tensors, so this raises; cast to float32 first", key=dtype_str(dtype))
        return dtype

    def creating(self, name: str, device: torch.device, kwargs: dict[str, Any]) -> None:
        self.exists(device, None, f"torch.{name}")
        gdev = getattr(kwargs.get("generator"), "device", None)
        if isinstance(gdev, torch.device) and gdev.type != device.type:
            self._note("device", None, device_str(gdev), device_str(device), f"torch.{name}(device="
                       f"{device_str(device)!r}) got a generator on {device_str(gdev)}; real PyTorch expects a "
                       f"'{device.type}' generator: torch.Generator({device.type!r})", f"torch.{name}", "generator")

    def reading(self, tensor: torch.Tensor, what: str) -> None:
        path, dev = getattr(tensor, "_td_path", None), getattr(tensor, "_td_device", tensor.device)
        self._note("device", path, device_str(dev), "cpu", f"{what}() of {path or 'a tensor'} "
                   f"{compact(tensor.dtype, tuple(tensor.shape), dev)}: can't convert {device_str(dev)} device type "
                   "tensor to numpy; call .cpu() first", op=what)

    def failed(self, what: str, exc: BaseException | None, hint: str = "") -> None:
        text = str(exc).strip().splitlines()[0] if exc is not None and str(exc).strip() else ""
        if exc is not None and not isinstance(exc, NotImplementedError) and "meta" not in text.lower() \
                and "fake impl" not in text:
            return  # a genuine error of the user's code: it propagates
        if not hint and (any(n in what for n in _DATA_OPS) or "cannot be called on meta" in text):
            hint = "it needs tensor values; simulate with data='cpu'"
        hint = hint or "it has no meta/fake kernel, so it cannot run without the hardware"
        self.stop_unsupported(what, f"{what} cannot be simulated: {hint}" + (f" ({text})" if text else ""))

    def refused(self, op: str, culprits: list[torch.Tensor], expected: torch.dtype, exc: BaseException) -> bool:
        """The kernel refused the odd-dtype tensors (fp8 promotion and kin): a problem by path, then go on cast."""
        text = (str(exc).strip().splitlines() or [""])[0]
        for t in culprits:
            path = getattr(t, "_td_path", None) or getattr(t, "_td_origin", None)
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

    def moving(self, tensor: torch.Tensor, target: torch.device, dtype: torch.dtype) -> torch.dtype:
        # a model tensor cast with loss (a complex freqs_cis under dtype=bf16); computations that round on purpose
        # (T5's position buckets: float -> long) are activations, not model tensors
        if _is_entry(tensor) and ((tensor.is_complex() and not dtype.is_complex) or (tensor.is_floating_point() and not (
                dtype.is_floating_point or dtype.is_complex) and dtype != torch.bool)):
            path = getattr(tensor, "_td_path", None)
            src = getattr(tensor, "_td_device", tensor.device)
            self._note("dtype", path, dtype_str(tensor.dtype), dtype_str(tensor.dtype),
                       f"{path or 'a tensor'} {compact(tensor.dtype, tuple(tensor.shape), src)} is cast to "
                       f"{dtype_str(dtype)}: the cast loses data (complex to real drops the imaginary part, float to "
                       "int the fraction); keep it or cast the result instead", key=f"lossy:{path}:{dtype}")
        return self._moving(tensor, target, dtype)

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
        self.problems.append(problem)
        if len(self.problems) >= self.limit:
            self.stopped = f"{self.limit} problems recorded (the limit)"
            raise _Stop()

    def _handle(self, func: Any, f: Any, call: _Args) -> None:
        p = f.problem
        culprits, anchor = self._culprits(func, f, call)
        tensors = [call.get(k) for k in culprits]
        mpath, mtype = self.where()
        place = (mpath or "<root>") if mtype else "<top level>"
        where = f" (in {place}, {mtype})" if mtype else ""
        listed = tuple(f"{d} ({t._td_path})" if getattr(t, "_td_path", None) else d
                       for d, t in zip(self.rules.describe_args(func, call.args, call.kwargs), _op_tensors(call)))
        op, on_device = p.op or str(func), p.kind in ("device", "meta")
        # one problem per named tensor (weights, buffers, quant_state); activations share one
        named = [t for t in tensors if _is_entry(t)]
        for t in named or [t for t in tensors if t._td_path][:1] or tensors[:1] or [None]:
            path = t._td_path if t is not None else None
            found, expected, message = p.found, p.expected, p.message
            if anchor is not None:
                expected = device_str(anchor) if on_device else dtype_str(anchor)
            if t is not None and p.kind != "unsupported_dtype":
                found = device_str(t._td_device) if on_device else dtype_str(t.dtype)
                what = f"{path or 'a tensor made in forward'} {compact(t.dtype, tuple(t.shape), t._td_device)}"
                message = {"device": f"{what} is on {found} while {op} runs on {expected}",
                           "meta": f"{what} holds no data (meta) and meets real tensors on {expected} in {op}",
                           "dtype": f"{what} is {found} while {op} computes in {expected}"}.get(p.kind, message)
            entry = _is_entry(t)
            key = (p.kind, found) if p.kind == "unsupported_dtype" else \
                (p.kind, path) if entry else (p.kind, place, op, found)
            self._add(Problem(p.kind, path or place, self.roles.get(path or "", "activation"), found, expected,
                              message + where, op=op, module_path=mpath, module_type=mtype, tensors=listed), key)
        if anchor is not None:
            for k, t in zip(culprits, tensors):
                call.set(k, _fixed(t, anchor))

    def _culprits(self, func: Any, f: Any, call: _Args) -> tuple[list[Any], Any]:
        """Which arguments to blame and fix, and the value that fixes them (a device or a dtype)."""
        p, offenders = f.problem, list(f.offenders)
        if p.kind == "unsupported_dtype":
            return offenders, None  # reported; the kernel runs anyway, and casting would invent dtype problems
        if p.kind == "meta":
            real = _parse(parse_device, p.expected)
            return offenders, real if real is not None and real.type != "meta" else self.device
        name = getattr(getattr(func, "_schema", None), "name", "")
        if p.kind == "device" and name in _INDEX_OPS and offenders and offenders[0][0] != 0:
            table = call.get((0, -1))  # a table left behind, indexed with indices on the device
            if _is_entry(table) and not any(_is_entry(call.get(k)) for k in offenders):
                return [(0, -1)], call.get(offenders[0])._td_device
        value = (lambda t: _norm(t._td_device)) if p.kind == "device" else (lambda t: t.dtype)
        groups: dict[Any, list[Any]] = {}
        for k in list(f.considered) or offenders:
            groups.setdefault(value(call.get(k)), []).append(k)
        # for devices, weights are the usual culprits: activations follow the inputs, placed where asked
        # ... unless the weights sit where the run was asked to go (and no accelerate hook spreads the model over
        # devices): then a tensor made on the wrong device is the culprit (a bare ``.cuda()`` meeting cuda:1 weights)
        with_entries = [v for v, ks in groups.items() if any(_is_entry(call.get(k)) for k in ks)]
        if p.kind == "device" and len(groups) == 2 and len(with_entries) == 1:
            other = next(v for v in groups if v != with_entries[0])
            if with_entries[0] == self.device and not self._dispatched():
                return groups[other], self.device
            return groups[with_entries[0]], other
        prefer = self.device if p.kind == "device" else self.dtype or self.model_dtype()
        if prefer is not None and prefer in groups:  # the requested device / dtype, else the model's own dtype
            return [k for v, ks in groups.items() if v != prefer for k in ks], prefer
        return offenders, f.target

    def _dispatched(self) -> bool:
        """A running module under an accelerate hook: its device comes from the hook, not from ``device=``."""
        return any("_hf_hook" in getattr(m, "__dict__", {}) for m in self.modules.stack)

    def model_dtype(self) -> torch.dtype | None:
        """The model's dtype as the placement policy decides it for the first root (looked up once, at the first
        dtype problem): declared, else a vote no single large tensor can swing."""
        if self._model_dtype is None and self.roots:
            from torchdoctor._scan.policy import Policy
            from torchdoctor._walk import walk

            comps = Policy(walk(self.roots[0]), None, None, False).components
            self._model_dtype = next((c.dtype for c in reversed(comps) if c.dtype is not None), torch.float32)
        return self._model_dtype


_INDEX_OPS = frozenset({"aten::index", "aten::_unsafe_index", "aten::index_put", "aten::index_put_",
                        "aten::_index_put_impl_", "aten::_unsafe_index_put"})


class _Args:
    """An op's arguments, addressed by the rules' keys ``(position or kwarg name, index in a list or -1)``."""

    def __init__(self, args: list[Any], kwargs: dict[str, Any]) -> None:
        self.args, self.kwargs = args, kwargs

    def get(self, key: tuple[Any, int]) -> Any:
        pos, j = key
        v: Any = self.kwargs.get(pos) if isinstance(pos, str) else self.args[pos]
        return v[j] if j >= 0 else v

    def set(self, key: tuple[Any, int], value: Any) -> None:
        pos, j = key
        if j >= 0:
            seq = self.kwargs[pos] if isinstance(pos, str) else self.args[pos]
            value = type(seq)(value if i == j else x for i, x in enumerate(seq))
        if isinstance(pos, str):
            self.kwargs[pos] = value
        else:
            self.args[pos] = value


_norm = norm_device  # cuda is cuda:0 (virtual devices never carry a bare type)


def _parse(parser: Callable[[str], Any], text: str) -> Any:
    try:
        return parser(text)
    except (ValueError, TypeError, RuntimeError):
        return None


def _is_entry(t: Any) -> bool:
    """A tensor of the user's object (a weight, buffer, quant_state ...), not an input or an activation."""
    path = getattr(t, "_td_path", None)
    return isinstance(path, str) and bool(path) and not path.startswith(("input ", "kwarg "))


def _op_tensors(call: _Args) -> list[Any]:
    out: list[Any] = []
    for a in (*call.args, *call.kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif type(a) is list or type(a) is tuple:
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _fixed(t: VirtualTensor, anchor: Any) -> Any:
    if isinstance(anchor, torch.device):
        return make(VirtualTensor, t._td_elem, anchor, t._td_path)
    return make(VirtualTensor, t._td_elem.to(anchor), t._td_device, t._td_path)


# -- the facade ----------------------------------------------------------------------------------------------------


def _place_inputs(space: Space, value: Any, device: torch.device, dtype: torch.dtype | None, path: str) -> Any:
    """Inputs go where the user would put them: on ``device``, floating ones in ``dtype``."""
    if isinstance(value, torch.Tensor):
        elem = space.inner_of(value)
        return make(VirtualTensor, elem.to(dtype) if dtype is not None and elem.is_floating_point() else elem,
                    device, path)
    if isinstance(value, dict):
        return type(value)({k: _place_inputs(space, v, device, dtype, f"{path}.{k}") for k, v in value.items()})
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_place_inputs(space, v, device, dtype, f"{path}.{i}") for i, v in enumerate(value))
    return value


def simulate(
    obj: Any,
    inputs: tuple[Any, ...] | dict[str, Any] | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    *,
    call: Callable[[Any], Any] | None = None,
    assume_device: str | torch.device | None = None,
    profile: DeviceProfile | None = None,
    data: str = "meta",
    limit: int = LIMIT,
) -> SimulationReport:
    """Would ``target`` run on ``device`` (``cuda:1``, ``xpu``, ``mps``) in ``dtype``? Answered without the hardware.

    A copy of ``obj`` (an object or a ``Target``) is moved with ``.to(device, dtype)`` as a user would, then
    called on ``inputs`` (a tuple of positional or a dict of keyword arguments, placed on ``device``), or
    ``call(copy)`` does its own moving and calling. Without either: the move and a placement report. Autograd
    stays off and the user's objects are never modified. ``data="cpu"`` keeps real values (``.item()``,
    ``generate``); ``assume_device`` treats meta tensors as holding data there; ``profile`` describes the hardware.

    >>> import torch, torchdoctor
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    >>> torchdoctor.simulate(model, (torch.randn(2, 4),), device="cuda:1", dtype="bfloat16").ok
    True
    >>> model.extra = [torch.nn.Linear(4, 4)]  # held in a list: Module.to never moves it
    >>> run = lambda m: (m.to("cuda:1"), m.extra[0](m(torch.ones(1, 4, device="cuda:1"))))
    >>> sorted((p.kind, p.path) for p in torchdoctor.simulate(model, device="cuda:1", call=run).problems)
    [('device', 'extra.0.bias'), ('device', 'extra.0.weight')]
    """
    from torchdoctor._walk import walk

    if device is None:
        raise TypeError("simulate needs device=, the device to simulate, e.g. simulate(model, inputs, 'cuda:1')")
    if isinstance(obj, Target):
        obj, args, kwargs = obj.obj, tuple(obj.args), dict(obj.kwargs)
    else:
        args, kwargs = (), {}
    if inputs is not None:
        args, kwargs = ((), dict(inputs)) if isinstance(inputs, dict) else \
            ((inputs,), {}) if isinstance(inputs, torch.Tensor) else (tuple(inputs), {})
    dev, dt = parse_device(device), parse_dtype(dtype) if dtype is not None else None
    assume = parse_device(assume_device) if assume_device is not None else None
    if call is not None and (args or kwargs):
        raise ValueError("give inputs or call, not both: call(copy) does its own moving and calling")
    profile = profile or DeviceProfile.for_device(dev if is_virtual(dev) else "cuda")
    if is_virtual(dev):
        if profile.type != dev.type:
            raise ValueError(f"device {device_str(dev)} is not of the profile's type {profile.type!r}")
        dev = _norm(dev)
        if (dev.index or 0) >= profile.count:
            raise ValueError(f"device {device_str(dev)} does not exist: the profile has {profile.count} "
                             f"{profile.type} device(s); pass profile=DeviceProfile(..., count=N)")
    start = time.perf_counter()
    found = walk(obj)
    from torchdoctor._scan.policy import Policy

    comps = Policy(found, None, None, False).components if dt is not None and (args or kwargs) else []
    model_dt = next((c.dtype for c in reversed(comps) if c.dtype is not None), None)
    # inputs are cast only where simulate itself converts the model: a model already in ``dtype`` gets them as given
    in_dt = None if model_dt == dt else dt
    rec = _Recorder(profile, dev, dt, limit, {e.path: e.role for e in found.entries})
    space = Space(data, profile.type, rec)
    listed = [(e.tensor, assume if assume is not None and e.tensor.device.type == "meta" else e.tensor.device, e.path)
              for e in found.entries if e.alias_of is None]
    placed: Any = None
    # fork_rng: random tensors made for a virtual device come from the CPU generator, which must not move on
    with torch.random.fork_rng(devices=[]), torch.no_grad(), virtual_world(space, profile), rec.modules.tracking():
        clone, memo = virtual_copy(obj, listed, space)
        rec.modules.paths = {id(memo[id(m)]): p for p, m in found.modules if id(m) in memo}
        rec.roots = [memo[id(m)] for _, m in found.roots if id(m) in memo]
        try:
            if call is not None:
                call(clone)
            else:
                to_args = (dev,) if dt is None else (dev, dt)
                if callable(getattr(type(clone), "to", None)):
                    clone.to(*to_args)  # as a user would: the object's own .to (a pipeline's, a model's)
                else:
                    for _, m in found.roots:
                        memo[id(m)].to(*to_args)
                from torchdoctor._scan.scan import scan

                placed = scan(clone, device=dev, dtype=None if args or kwargs else dt)
                if args or kwargs:
                    clone(*(_place_inputs(space, a, dev, in_dt, f"input {i}") for i, a in enumerate(args)),
                          **{k: _place_inputs(space, v, dev, in_dt, f"kwarg {k}") for k, v in kwargs.items()})
        except _Stop:
            pass
        except Exception as exc:
            text = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
            if any(s in str(exc) for s in _NO_RUNTIME):
                with contextlib.suppress(_Stop):
                    rec.stop_unsupported(_api_name(exc), f"a device runtime call is not simulated: {text}")
            elif rec.problems:
                rec.stopped = f"the run ended after the problems above: {text}"  # most likely a consequence
            else:
                raise
    problems = rec.culprits_first(list(rec.problems), rec.roots)
    if placed is not None:
        # what the move left behind; with inputs, the forward's checks judge the rest
        seen = {(p.kind, p.path) for p in problems}
        problems.extend(q for q in placed.problems if (q.kind, q.path) not in seen and (not (args or kwargs) or (
            q.kind == "device" and q.role in ("parameter", "buffer", "quant_state"))))
    if len(problems) > limit:
        problems, rec.stopped = problems[:limit], f"{limit} problems recorded (the limit)"
    # virtual tensors have no storage to share: each canonical path counts once
    summary = summarize((info, None) for info in placed.tensors) if placed is not None else ()
    log.info("simulated %s on %s: %d op(s), %d problem(s)", type(obj).__name__, device_str(dev), space.ops,
             len(problems))
    return SimulationReport(dev, dt, data, profile,
                            tuple(problems), space.ops, time.perf_counter() - start, rec.stopped, summary,
                            rec.blamed)


def _api_name(exc: BaseException) -> str:
    """The innermost torch function in the traceback (``torch.cuda.foo``) or the exception's type."""
    name, tb = type(exc).__name__, exc.__traceback__
    while tb is not None:
        if "/torch/" in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
            name = f"{tb.tb_frame.f_globals.get('__name__', '?')}.{tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return name

public_types(SimulationReport)

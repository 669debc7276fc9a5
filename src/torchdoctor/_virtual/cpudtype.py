"""``simulate(model, inputs, device="cpu", dtype=torch.float16)``: would this run in that dtype on this CPU?

No virtual device is needed: the CPU is here. A copy of the object (real tensors) is moved with ``.to("cpu", dtype)``
as a user would and called on its inputs (floating ones in ``dtype``), every aten op seen by a dispatch mode:

- an op with no kernel for the dtype (``"linalg_svd_cpu" not implemented for 'Half'``, ``Unsupported dtype Half``)
  is named with its module path; the op then runs in float32 and its results are cast back, so the run goes on and
  every such op is found, not only the first;
- a silent promotion (a float32 operand turning ``dtype`` compute into float32) is named by the operand's path
  (a plain attribute ``.to`` never casts, a buffer replaced in forward) or the module that made it; its result is
  cast back to ``dtype``, so one cause gives one problem.

The fixes are proven as ``simulate``'s are: a re-run on a fresh copy with them applied (the model in a dtype the CPU
has kernels for, same size first: float16 -> bfloat16 -> float32; the promoting tensors cast).
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from torchdoctor._guard.dispatch import never_compiled
from torchdoctor._placement import PACKED_DTYPES, dtype_str
from torchdoctor._report.model import Problem
from torchdoctor._virtual.cpuasks import asks_accelerator
from torchdoctor._virtual.cpucasts import CastRecords, cast_words, mixed_words
from torchdoctor._virtual.cpucopy import copied
from torchdoctor._virtual.origin import where_called

# the words torch's CPU kernels use when a dtype has no kernel
_NO_KERNEL = ("not implemented for", "Unsupported dtype", "doesn't support tensors of type", "Low precision dtypes",
              "not supported for", "does not support")
_NAMES = {torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float64: "Double"}
# the words of torch's refusals to mix dtypes in one op
# (``expected m1 and m2 to have the same dtype``, index_put's ``dtypes match``, an in-place op's ``can't be cast to``)
_MISMATCH = ("same dtype", "expected scalar type", "expected both", "but found", "should be the same", "dtypes match",
             "to be equal to", "expect parameter to have scalar type", "can't be cast to the desired output type",
             "but expected")
_COPIES = ("aten._to_copy", "aten.copy_", "aten.to", "aten.copy", "aten.clone", "aten.detach", "aten.lift_fresh")


def _dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
    """One op of the run (``Checks.__torch_dispatch__``): run (past a missing kernel), then a promotion out of the
    dtype is named and its result cast back."""
    kwargs = kwargs or {}
    self.ops += 1
    op = str(func.overloadpacket)
    out = self.run(func, args, kwargs, str(func))
    flat = tree_flatten((args, kwargs))[0]
    if self.fell and any(isinstance(t, torch.Tensor) and t.is_complex() and self._fell(t) for t in flat):
        out = self._real_back(out)  # |stft|: the magnitude of a spectrum computed wide for want of a kernel
    ins = [t for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()]
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if kwargs.get("dtype") is not None or ins and self.carried(ins):  # a dtype the code chose (guard's policy too)
        self.chosen.update((id(t), weakref.ref(t)) for t in outs if t.dtype != self.dtype or not self.wide(ins))
    elif outs and (not ins and not any(isinstance(a, torch.Tensor) for a in args) or ins and all(
            self.factory(t) for t in ins)):  # a factory given no dtype (``dtype=None`` too), and what only it made
        made = self.factory(ins[0]) if ins else (f"torch.{op.removeprefix('aten.')}", where_called())
        self.made.update((id(t), (weakref.ref(t), *made)) for t in outs)
    self.casts.follow(ins, outs, self.names, self.factory)  # a view of a cast's result is still the cast's
    if op in _COPIES:
        return out
    if any(t.dtype == self.dtype for t in ins) and any(t.dtype != self.dtype for t in outs):
        wider = [t for t in ins if t.dtype != self.dtype and t.dim() > 0 and not self.deliberate(t)]
        if wider:
            self.met = (func, args, kwargs)  # the op, for the proof of a fix at it (``proven_at_op``)
            self._promoted(str(func), wider)
            return self._back(out)
    return out


# torch wraps a mode's __torch_dispatch__ in dynamo's disable, which imports dynamo (seconds) on the first op;
# told once to the code object instead, as guard's mode does
_UNWRAPPED = never_compiled(_dispatch.__code__)


class Checks(torch.utils._python_dispatch.TorchDispatchMode):
    """Every op of the run: no kernel in ``dtype`` or a promotion out of it is a problem, then the op goes on."""

    def __init__(self, dtype: torch.dtype, names: dict[int, tuple[str, str]], stack: list[Any],
                 paths: dict[int, str]) -> None:
        super().__init__()
        self.dtype, self.names, self.stack, self.paths = dtype, names, stack, paths
        self.problems: list[Problem] = []
        self.seen: set[tuple[str, ...]] = set()
        self.ops = 0
        self.met: tuple[Any, Any, Any] | None = None
        self.at: dict[str, tuple[Any, Any, Any]] = {}  # a named promoting tensor -> the op it promoted
        # tensors made in a dtype the code chose (a factory or cast told its dtype, and what only they made): the
        # float32 timestep embedding or norm upcast a model casts back is no silent promotion
        self.chosen: dict[int, weakref.ref[torch.Tensor]] = {}
        self.made: dict[int, tuple[weakref.ref[torch.Tensor], str, str | None]] = {}  # default-dtype factories
        self.sources: dict[tuple[str, ...], tuple[str, ...]] = {}  # (kind, path, op, found) -> the factory call
        self.casts = CastRecords(self.where)  # the program's casts to another dtype, named by their line
        # complex results of an op run wide for want of a kernel (an fft's spectrum) and what is computed from them:
        # the real values taken from them (``abs``, ``real``) go on in ``dtype``, as on hardware with that kernel
        self.fell: dict[int, weakref.ref[torch.Tensor]] = {}

    def factory(self, t: torch.Tensor) -> tuple[str, str | None] | None:
        """``(torch.ones, file:line)`` of a tensor a factory given no dtype made (the default dtype), or None."""
        hit = self.made.get(id(t))
        return hit[1:] if hit is not None and hit[0]() is t else None

    def deliberate(self, t: torch.Tensor) -> bool:
        ref = self.chosen.get(id(t))
        return ref is not None and ref() is t and self.names.get(id(t)) is None

    def wide(self, ins: list[torch.Tensor]) -> list[torch.Tensor]:
        return [t for t in ins if t.dtype != self.dtype]

    def carried(self, ins: list[torch.Tensor]) -> bool:
        """Every input chosen so, or every one out of the run's dtype: a stream the program keeps wider on purpose
        (Mamba's ``residual = residual.float()``, then ``hidden + residual`` each block) stays the program's choice;
        a model tensor or a factory given no dtype among them never is."""
        return all(self.deliberate(t) for t in self.wide(ins) or ins)

    def where(self) -> tuple[str | None, str | None]:
        if not self.stack:
            return None, None
        m = self.stack[-1]
        return self.paths.get(id(m), ""), type(m).__name__

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # read by TorchDispatchMode.__init_subclass__: no import of dynamo
        return not _UNWRAPPED

    __torch_dispatch__ = _dispatch

    def run(self, func: Any, args: Any, kwargs: Any, op: str) -> Any:
        """``func`` run; where it has no kernel in the dtype: named, then run in float32 and cast back."""
        try:
            return func(*args, **kwargs)
        except (NotImplementedError, RuntimeError) as exc:
            text = (str(exc).strip().splitlines() or [""])[0]
            odd = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
                   and t.is_floating_point() and t.dtype != self.dtype]
            if odd and any(s in text for s in _MISMATCH):  # a wider tensor met the dtype where torch refuses a mix
                self._promoted(op, odd, text)
                narrow = tree_map(lambda t: t.to(self.dtype) if any(t is o for o in odd) else t, (args, kwargs))
                return self.run(func, narrow[0], narrow[1], op)  # and on, past a missing kernel too
            if not any(s in text for s in _NO_KERNEL) or _NAMES.get(self.dtype, "?") not in text and \
                    dtype_str(self.dtype) not in text and "Low precision" not in text:
                raise
            self._no_kernel(op, text)
            wide = tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == self.dtype else t,
                            (args, kwargs))
            return self._real_back(func(*wide[0], **wide[1]))

    def _back(self, out: Any) -> Any:
        return tree_map(lambda t: t.to(self.dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                        out)

    def _fell(self, t: torch.Tensor) -> bool:
        ref = self.fell.get(id(t))
        return ref is not None and ref() is t

    def _real_back(self, out: Any) -> Any:
        """``out`` with its floating tensors cast back to ``dtype`` and its complex ones kept as run wide."""
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.is_complex():
                self.fell[id(t)] = weakref.ref(t)
        return self._back(out)

    def _no_kernel(self, op: str, text: str) -> None:
        mpath, mtype = self.where()
        place = (mpath or "<root>") if mtype else "<top level>"
        if ("unsupported_dtype", place, op) in self.seen:
            return
        self.seen.add(("unsupported_dtype", place, op))
        name = dtype_str(self.dtype)
        where = f" (in {place}, {mtype})" if mtype else ""
        self.problems.append(Problem("unsupported_dtype", place, "activation", name, "float32",
                                     f"{op} has no {name} kernel on cpu: {text}{where}", op=op, module_path=mpath,
                                     module_type=mtype))

    def _promoted(self, op: str, wider: list[torch.Tensor], refused: str | None = None) -> None:
        mpath, mtype = self.where()
        place = (mpath or "<root>") if mtype else "<top level>"
        name = dtype_str(self.dtype)
        where = f" (in {place}, {mtype})" if mtype else ""
        for t in wider:
            path, role = self.names.get(id(t), (None, "activation"))
            if path is None and any(p.kind == "unsupported_dtype" for p in self.problems):
                continue  # most likely what the float32 run of an op without a kernel gave back (a complex result)
            key = ("dtype", path or place, op if path is None else "")
            if key in self.seen:
                continue
            self.seen.add(key)
            if path is not None and self.met is not None and refused is None:
                self.at.setdefault(path, self.met)
            made = self.factory(t) if path is None and self.casts.of(t) is None else None  # the last cast wins
            site = self.casts.of(t) if path is None and made is None else None
            mix = self.casts.makers_of(t, self.factory) if path is None and made is None and site is None else ()
            what = path or (f"a tensor made by {made[0]} in `{place}`" + (f" at {made[1]}" if made[1] else "") +
                            f" (no dtype given: {'the default' if t.dtype == torch.get_default_dtype() else 'from its data,'} "
                            f"{dtype_str(t.dtype)})" if made else
                            cast_words(site, self.casts.place(t))[0] if site is not None else
                            mixed_words(mix)[0] if mix else "a tensor made in forward")
            if site is not None or mix:  # the fix is at that cast (or at the attribute it read), at every maker
                self.sources[("dtype", place, op, dtype_str(t.dtype))] = mixed_words(mix)[1] if mix else \
                    cast_words(site, "")[1]  # type: ignore[arg-type]
            if made is not None:  # the fix is at that call: dtype= the input's
                self.sources[("dtype", place, op, dtype_str(t.dtype))] = (
                    f"factory {made[0]} in `{place}`" + (f" at {made[1]}" if made[1] else ""),)
            how = f"meets {name} in {op}, which refuses the mix: {refused}" if refused else \
                f"promotes {op} out of {name} into {dtype_str(t.dtype)}: a silent promotion (no error at this op; " \
                "what follows computes wider, and an op that needs one dtype, a matmul with the model's weights, raises)"
            self.problems.append(Problem("dtype", path or place, role, dtype_str(t.dtype), name,
                                         f"{what} {dtype_str(t.dtype)}{list(t.shape)} {how}{where}", op=op,
                                         module_path=mpath, module_type=mtype))


class Calls(torch.overrides.TorchFunctionMode):
    """The torch functions whose dtype check runs before any aten op (``torch.fft.rfft``'s "Unsupported dtype
    Half"): the same naming and going on as ``Checks`` gives the ops."""

    def __init__(self, checks: Checks) -> None:
        super().__init__()
        self.checks = checks

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))
        module = getattr(func, "__module__", None) or "torch"
        out = self.checks.run(func, args, kwargs or {}, f"{module.removeprefix('torch._C.')}.{name}")
        if getattr(func, "__name__", None) in _FROM_DATA and isinstance(out, torch.Tensor) and out.is_floating_point() and \
                (kwargs or {}).get("dtype") is None:  # its dtype read from the data: a float64 numpy array's
            c = self.checks
            c.chosen.pop(id(out), None)  # (the copy it makes is told that dtype: no choice of the program's)
            c.made[id(out)] = (weakref.ref(out), f"torch.{func.__name__}", where_called())
        return self.checks.casts.made(func, args, out)


_FROM_DATA = frozenset(("tensor", "as_tensor", "from_numpy", "asarray"))  # factories whose dtype follows the data


def check_cpu(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype,
              call: Callable[[Any], Any] | None, fixes: list[Any] | None = None) -> tuple[list[Problem], int, Any]:
    """One run of a copy of ``obj`` in ``dtype`` on the CPU: (problems, ops, the copy)."""
    from torchdoctor._virtual.prove import apply_fixes, recasts
    from torchdoctor._virtual.remake import remade
    from torchdoctor._walk import walk

    clone = copied(obj)
    cast = tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                    (args, kwargs))
    if call is None and isinstance(clone, torch.nn.Module):  # float8 and packed storage kept, as the program holds it
        clone.to("cpu")._apply(lambda t: t.to(dtype) if t.is_floating_point() and t.dtype not in PACKED_DTYPES else t)
    elif call is None and callable(getattr(type(clone), "to", None)):
        clone.to("cpu", dtype)
    apply_fixes(clone, fixes or [])
    found = walk(clone)
    names = {id(e.tensor): (e.path, e.role) for e in found.entries}
    paths = {id(m): p for p, m in found.modules}
    stack: list[Any] = []
    def leave(m: Any, a: Any, o: Any) -> None:  # returns None: the output stays the module's own
        if stack:
            stack.pop()

    pre = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: stack.append(m))
    post = torch.nn.modules.module.register_module_forward_hook(leave)
    mode = Checks(dtype, names, stack, paths)
    mode.casts.recast = recasts(fixes or [])  # a proof's re-run: the casts at the fixed lines write the fixed dtype
    try:
        # a factory fixed at its line makes its tensor as the fix says in a proof's re-run
        with remade(fixes or []), torch.no_grad() if call is None else torch.enable_grad(), mode, Calls(mode), \
                warnings.catch_warnings():
            warnings.filterwarnings("ignore", "ComplexHalf support is experimental")  # (the check's half, not the program's)
            try:
                if call is not None:
                    call(clone)
                elif args or kwargs:
                    clone(*cast[0], **cast[1])
            except (AssertionError, RuntimeError) as exc:
                if not asks_accelerator(exc, mode):
                    raise
    finally:
        pre.remove()
        post.remove()
    SOURCES.clear()
    SOURCES.update(mode.sources)
    return mode.problems, mode.ops, clone


SOURCES: dict[tuple[str, ...], tuple[str, ...]] = {}  # the last check_cpu's factory calls, read by simulate_cpu


def simulate_cpu(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype | None,
                 call: Callable[[Any], Any] | None, limit: int, report: Callable[..., Any]) -> Any:
    """``simulate`` on ``device="cpu"``: the report of ``check_cpu``, with its fixes proven, made by ``report``
    (``simulate``'s own report type, handed in: this module is imported by ``simulate``, never the reverse)."""
    from torchdoctor._rules.profile import DeviceProfile
    from torchdoctor._virtual.fixes import fix_items
    from torchdoctor._virtual.prove import Fix, held, proven
    from torchdoctor._virtual.session import expectation

    if dtype is None:
        raise ValueError("simulate on device='cpu' checks a dtype on this CPU: pass dtype=, e.g. dtype=torch.float16")
    start = time.perf_counter()
    problems, ops, clone = check_cpu(obj, args, kwargs, dtype, call)
    problems = problems[:limit]
    rest = [p for p in problems if p.kind != "unsupported_dtype"]
    items: list[Fix] = []
    if rest:  # proven in ``dtype``: the ops without a kernel there are the next fix's (they stay in the re-run)
        more = fix_items(rest, torch.device("cpu"), dtype, dict(SOURCES), held(clone), _paths(clone)) or []
        left: list[Any] = []

        def rerun(fixes: list[Fix]) -> list[Any]:
            left[:] = [p for p in check_cpu(obj, args, kwargs, dtype, call, fixes)[0] if p.kind != "unsupported_dtype"]
            return left

        for _ in range(4):  # a run stops at the first line that asks for cuda: the re-run finds the next one
            more = proven(more, rerun)
            have = {(f.code, f.diff) for f in more}  # one code line for two calls: their diffs differ
            extra = [f for f in fix_items(left, torch.device("cpu"), dtype, dict(SOURCES), held(clone),
                                          _paths(clone)) or []
                     if (f.code, f.diff) not in have] if left and not all(f.proven for f in more) else []
            if not extra:
                break
            more = [replace(f, proven=False, tried="") for f in more] + extra
        items += more
    if any(p.kind == "unsupported_dtype" for p in problems):
        items.append(_other_dtype(obj, args, kwargs, dtype, call, problems))
    cpu = torch.device("cpu")
    return report(cpu, dtype, "cpu", DeviceProfile.for_device(cpu), tuple(problems), ops,
                            time.perf_counter() - start, None, (), 0, "\n".join(f.code for f in items) or None,
                            bool(args or kwargs or call is not None), None, expectation(cpu, dtype,
                            DeviceProfile.for_device(cpu), None), tuple(items))


def _paths(clone: Any) -> Callable[[Any], str | None]:
    """A module's path in the checked copy (a cast that read its dtype from a module's attribute is fixed there)."""
    paths = {id(m): p for p, m in clone.named_modules()} if isinstance(clone, torch.nn.Module) else {}
    return lambda m: paths.get(id(m))


def _other_dtype(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype,
                 call: Callable[[Any], Any] | None, problems: list[Problem]) -> Any:
    """The dtype to run in where the CPU has no kernel in ``dtype``, tried: the same size first, then float32."""
    from torchdoctor._virtual.prove import Fix

    ops = sorted({p.op or "" for p in problems if p.kind == "unsupported_dtype"})
    where = next(p.path for p in problems if p.kind == "unsupported_dtype")
    name = dtype_str(dtype)
    tried: list[str] = []
    if call is not None:  # the caller's own code casts the model: a re-run "in another dtype" would not be one
        return Fix(f"# cpu has no {name} kernel for {', '.join(ops[:3])} (in {where}): run that part in float32, or "
                   "cast the model where your code casts it to a dtype the cpu has kernels for", "note",
                   tried="not re-run: call= casts the model itself, so no re-run can put it in another dtype")
    for other in [d for d in (torch.bfloat16, torch.float16, torch.float32) if d != dtype]:
        left, _, _ = check_cpu(obj, args, kwargs, other, call)
        if not left:
            size = "; it has the same size" if other.itemsize == dtype.itemsize else ""
            return Fix(f"model.to(torch.{dtype_str(other)})  # cpu has no {name} kernel for {', '.join(ops[:3])} "
                       f"(in {where}){size}; pass the inputs in {dtype_str(other)} too", "path", other, proven=True,
                       tried=f"re-run in {dtype_str(other)}: no problem left")
        tried.append(f"{dtype_str(other)}: {left[0].message}")
    return Fix(f"# cpu has no {name} kernel for {', '.join(ops[:3])} (in {where}): run that part in float32", "note",
               tried=("re-run in " + "; ".join(tried))[:400])


def proven_at_op(checks: Checks) -> list[Any]:
    """The fixes of a run checked on the CPU in place (the pytest marker's ``@pytest.mark.simulate("cpu",
    dtype=...)``, whose test body cannot be run again): each named tensor that promoted an op is cast, and the fix
    is proven at that op: run again on its operands with the tensor cast, it computes in the dtype asked."""
    from torchdoctor._virtual.fixes import fix_items

    promoted = [p for p in checks.problems if p.kind == "dtype" and p.path in checks.at]
    items = fix_items(promoted, torch.device("cpu"), checks.dtype) or [] if promoted else []
    for f in items:
        for name, _ in f.sets:
            func, args, kwargs = checks.at.get(name, (None, (), {}))
            if func is None:
                continue
            bad = {i for i, v in dict.items(checks.names) if v[0] == name}
            fixed = tree_map(lambda t: t.to(checks.dtype) if isinstance(t, torch.Tensor) and id(t) in bad else t,
                             (args, kwargs))
            with torch.no_grad():
                outs = [t for t in tree_flatten(func(*fixed[0], **fixed[1]))[0] if isinstance(t, torch.Tensor)]
            f.at_op, f.proven = True, all(t.dtype == checks.dtype for t in outs if t.is_floating_point())
            f.tried = f"at the failing op {func}: with {name} cast, it " + (
                f"computes in {dtype_str(checks.dtype)}" if f.proven else f"still promotes out of {dtype_str(checks.dtype)}")
    return items

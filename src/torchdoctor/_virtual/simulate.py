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
from dataclasses import replace
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchdoctor._rules.presets import as_profile
from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._report.model import Target, summarize
from torchdoctor._placement import device_str, norm_device, parse_device, parse_dtype
from torchdoctor._virtual.copying import virtual_copy
from torchdoctor._virtual.simreport import SimulationReport, positional
from torchdoctor._virtual.tensor import Space, is_virtual
from torchdoctor._virtual.runtime import virtual_world
from torchdoctor._report.text import public_types
from torchdoctor._virtual.apart import moved, patched_into
from torchdoctor._virtual.remake import remade
from torchdoctor._virtual.atop import prove_at_ops
from torchdoctor._virtual.modcast import at_cast_lines, module_casts
from torchdoctor._virtual.hooked import under_hooks
from torchdoctor._virtual.ownplace import placed_by_hooks
from torchdoctor._virtual.fixes import fix_items
from torchdoctor._virtual.prove import NEW, Fix, applied_when_there, apply_fixes, before_move, fixed_inputs, held, \
    inputs_cast, judged_at_op, proven, recasts, switch_advice
from torchdoctor._virtual.makers import CastMakers, built_on, place_inputs as _place_inputs, placed_on as _placed_on
from torchdoctor._virtual.session import expectation, not_stored
from torchdoctor._virtual.hardware import ledger, over_memory
from torchdoctor._virtual.intread import storage_read
from torchdoctor._virtual.recorder import LIMIT, _Recorder, _Stop
from torchdoctor._virtual.quietmove import quiet_moves as _quiet_moves

__all__ = ["SimulationReport", "simulate"]

log = logging.getLogger("torchdoctor.simulate")
# what a device runtime call this simulator does not answer raises: a cannot-check, not a finding about the model
_NO_RUNTIME = ("not compiled with", "not linked with support", "Cannot access accelerator", "no CUDA GPUs",
               "Found no NVIDIA driver")

# -- the facade ----------------------------------------------------------------------------------------------------


def simulate(
    obj: Any,
    inputs: tuple[Any, ...] | dict[str, Any] | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    *,
    call: Callable[[Any], Any] | None = None,
    assume_device: str | torch.device | bool | None = None,
    profile: DeviceProfile | str | None = None,
    data: str | None = None,
    limit: int = LIMIT,
    _fixes: list[Fix] | None = None,
) -> SimulationReport:
    """Would ``target`` run on ``device`` (``cuda:1``, ``xpu``, ``mps``) in ``dtype``? Answered without the hardware.

    A copy of ``obj`` (an object or a ``Target``) is moved with ``.to(device, dtype)`` as a user would, then
    called on ``inputs`` (a tuple of positional or a dict of keyword arguments, placed on ``device``), or
    ``call(copy)`` does its own moving and calling. Without either: the move and a placement report. Autograd
    stays off for the forward (on for ``call``, a training step) and the user's objects are never modified. ``data="cpu"`` keeps real values (``.item()``,
    ``generate``); by default (``data=None``) the values are kept on meta, and a run that stops at a value read
    (``loss.item()`` in a training step) is run again with ``data="cpu"`` when the object's tensors hold data and
    fit in 2 GiB; ``assume_device`` treats meta tensors as holding data there — by default, a model whose
    parameters are all on meta (built on meta, weights not loaded) is taken as loaded on ``device`` and the report
    says so (``assume_device=False`` checks them as missing); ``profile`` describes the hardware (``positional``).

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

    inputs, device, dtype = positional(inputs, device, dtype)  # simulate(model, "cuda:1", torch.bfloat16)
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
    assume = parse_device(assume_device) if assume_device is not None and assume_device is not False \
        and assume_device is not True else None
    if call is not None and (args or kwargs):
        raise ValueError("give inputs or call, not both: call(copy) does its own moving and calling")
    if dev.type == "cpu":  # the CPU is here: a dtype is checked on it for real, with no virtual device
        from torchdoctor._virtual.cpudtype import simulate_cpu

        return simulate_cpu(obj, args, kwargs, dt, call, limit, SimulationReport)  # type: ignore[no-any-return]
    profile_given = profile is not None
    profile = as_profile(profile) or DeviceProfile.for_device(dev if is_virtual(dev) else "cuda")
    if is_virtual(dev):
        if profile.type != dev.type:
            raise ValueError(f"device {device_str(dev)} is not of the profile's type {profile.type!r}")
        dev = norm_device(dev)
        if (dev.index or 0) >= profile.count:
            raise ValueError(f"device {device_str(dev)} does not exist: the profile has {profile.count} "
                             f"{profile.type} device(s); pass profile=DeviceProfile(..., count=N)")
    start = time.perf_counter()
    auto, data = data is None, data or "meta"
    found = walk(obj)
    scripted = next((p or "the model" for p, m in found.modules if isinstance(m, torch.jit.ScriptModule)), None)
    if scripted is not None and call is None:  # its tensors live in TorchScript's C++ object: no virtual copy holds them
        raise TypeError(f"simulate cannot place {scripted}, a TorchScript module (torch.jit.trace / torch.jit.script), "
                        "on a virtual device: simulate the Python module before it is traced or scripted, or pass "
                        "call= with the code that traces it; scan(model, device) reads a TorchScript module as it is")
    assumed = None
    unloaded = not_loaded(found) if assume_device is None or assume_device is True else 0
    if unloaded:  # weights not loaded: check the structure as if they were
        assume = dev
        assumed = assumed_note(unloaded, dev)
    from torchdoctor._scan.policy import Policy

    comps = Policy(found, None, None, False).components if dt is not None and (args or kwargs) else []
    model_dt = next((c.dtype for c in reversed(comps) if c.dtype is not None), None)
    # inputs are cast only where simulate itself converts the model: a model already in ``dtype`` gets them as given
    in_dt = None if model_dt == dt else dt
    hooked = placed_by_hooks(found, dev) if call is None else None  # checked as its hooks place it (``ownplace``)
    rec = _Recorder(profile, dev, dt, limit, {e.path: e.role for e in found.entries})
    space = Space(data, profile.type, rec)
    listed = [(e.tensor, assume if assume is not None and e.tensor.device.type == "meta" else e.tensor.device, e.path)
              for e in found.entries if e.alias_of is None]
    placed: Any = None
    casts: Any = None  # the program's own module casts (``modcast``)
    recast = recasts(_fixes or [])  # a proof's re-run: the casts at the fixed lines write the fixed dtype
    uncopied: TypeError | None = None
    # fork_rng: random tensors made for a virtual device come from the CPU generator, which must not move on; a forward
    # runs with autograd off, the caller's code (a training step) with it; one world (~120 patches) for copy and run
    grad = torch.enable_grad() if call is not None else torch.no_grad()
    with torch.random.fork_rng(devices=[]), grad, virtual_world(space, profile, CastMakers(recast)), \
            rec.modules.tracking():
        try:
            with torch.no_grad():
                clone, memo = virtual_copy(obj, listed, space)
        except TypeError as exc:  # ComfyUI's model configs answer None for any attribute: deepcopy calls it
            log.info("simulate: %s; run in place and put back", exc)
            uncopied = exc
        if uncopied is None:
            led = ledger(space)
            if led is not None:  # what sits on the device already (weights assumed there) and the move keeps takes
                for t, where, _ in listed:  # memory too; what it casts counts once cast
                    if is_virtual(where) and (dt is None or call is not None or t.dtype == dt
                                              or not t.is_floating_point()):
                        led.add(memo.get(id(t)))
            rec.modules.paths = {id(memo[id(m)]): p for p, m in found.modules if id(m) in memo}
            rec.roots = [memo[id(m)] for _, m in found.roots if id(m) in memo]
            try:
                with remade(_fixes or []), module_casts(_fixes or []) as casts:  # fixed lines make their tensor so
                    if call is not None:
                        with applied_when_there(clone, _fixes or []), inputs_cast(clone, _fixes or []), \
                                moved(clone, _fixes or []):
                            call(clone)
                    else:  # hooks that place the layers per call: the program never moves the model whole
                        to_args = (() if hooked else (dev,)) + (() if dt is None else (dt,))
                        apply_fixes(clone, before_move(_fixes or []))  # a dtype the device cannot hold: cast first
                        with _quiet_moves():
                            if to_args and callable(getattr(type(clone), "to", None)):
                                clone.to(*to_args)  # as a user would: the object's own .to (a pipeline's, a model's)
                            elif to_args:
                                for _, m in found.roots:
                                    memo[id(m)].to(*to_args)
                        apply_fixes(clone, _fixes or [])
                        from torchdoctor._scan.scan import scan

                        placed = scan(clone, device=dev, dtype=None if args or kwargs else dt)
                        if args or kwargs:
                            clone(*(_place_inputs(space, a, dev, in_dt, f"input {i}", assume)
                                    for i, a in enumerate(args)),
                                  **{k: _place_inputs(space, v, dev, in_dt, f"kwarg {k}", assume)
                                     for k, v in kwargs.items()})
            except _Stop:
                pass
            except Exception as exc:
                text = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
                if any(s in str(exc) for s in _NO_RUNTIME):
                    with contextlib.suppress(_Stop):
                        rec.stop_unsupported(_api_name(exc), f"a device runtime call is not simulated: {text}")
                elif rec.problems:
                    rec.stopped = f"the run ended after the problems above: {text}"  # most likely a consequence
                elif not storage_read(exc, rec, _Stop) and not rec.escaped(exc):
                    raise
    if uncopied is not None:  # run on the object itself in a virtual session, then put everything back
        from torchdoctor._virtual.restore import put_back
        with put_back(found):
            return simulate_target(lambda: obj if not (args or kwargs) else Target(obj, args, kwargs), dev, dt,
                                   profile=profile, limit=limit, assume_device=assume_device, call=call,
                                   data=data, select=False)  # as on a copy: device 0 stays current
    rec.computed = space.computed  # type: ignore[attr-defined]  # read by culprits_first
    problems = rec.culprits_first(list(rec.problems), rec.roots)
    if placed is not None:
        # what the move left behind; with inputs, the forward's checks judge the rest
        problems.extend(left_behind(placed.problems, [*problems, *rec.overflow], bool(args or kwargs)))
    problems.extend(over_memory(space))
    problems = problems[:limit] + not_stored(len(rec.overflow) + max(len(problems) - limit, 0), limit)
    # virtual tensors have no storage to share: each canonical path counts once
    summary = summarize((info, None) for info in placed.tensors) if placed is not None else ()
    log.info("simulated %s on %s: %d op(s), %d problem(s)", type(obj).__name__, device_str(dev), space.ops,
             len(problems))
    if auto and _fixes is None and not unloaded and _needs_values(problems) and _small(found):
        # a value the program reads (`loss.item()`, `argmax().item()`): meta tensors have none, real ones do
        return simulate(Target(obj, args, kwargs) if args or kwargs else obj, device=device, dtype=dtype, call=call,
                        assume_device=assume_device, profile=profile if profile_given else None, data="cpu", limit=limit)
    items = (fix_items(problems, dev, dt, rec.sources, held(clone),  # (a walk of the copy: only with problems)
                       lambda m: "" if any(m is r for r in rec.roots) else rec.modules.path_of(m),
                       [*(a for a in rec.entry.outer.values() if a.module() is not clone), *patched_into(clone)],
                       rec.entry.made_args, cases=rec.cases.cases) or []) if problems else []
    items = under_hooks(at_cast_lines(items, casts if call is not None else None, clone), clone, dev,  # modcast,
                        [p.path for p in problems if p.kind == "device"], rec.cases.cases)  # hooked, bareuse
    if call is not None:  # the caller's code casts the model itself: a switch of dtype is made on its lines
        items = [switch_advice(f) if f.asks is not None else f for f in items]
    if _fixes is None and items:  # the fix is tried on a fresh copy before it is printed
        last: list[SimulationReport] = []

        def rerun(fixes: list[Fix]) -> tuple[Any, ...]:  # a switch of the dtype asked for: re-run asking the new one
            last[:] = [simulate(Target(obj, *fixed_inputs(args, kwargs, fixes)) if args or kwargs else obj, device=dev,
                                dtype=next((f.asks for f in fixes if f.asks is not None), dt), call=call,
                                assume_device=assume_device, profile=profile, data=data, limit=limit, _fixes=fixes)]
            return last[0].problems

        def at_op(fixes: list[Fix]) -> Any:  # as a block's: one verdict
            return prove_at_ops(fixes, rec.cases.cases, rec.rules, rec.profile, rec.entry.inputs)

        items = proven(items, rerun, at_op, problems)
        # the fix made a new failure upstream, or left one with another maker (a bf16 timestep still meets the
        # forward's fp32 frequencies): the re-run's own fix joins it, and both are tried together
        if last and any(NEW in f.tried or (f.rerun and not f.proven and "still found" in f.tried) for f in items):
            have = {f.code for f in items}
            more = [f for f in last[0].fixes if f.code not in have and not f.code.startswith("torchdoctor.move(")]
            items = proven(items + [replace(f, proven=False, tried="") for f in more], rerun, at_op, problems) \
                if more else items
    fix = "\n".join(f.code for f in items) or None
    return SimulationReport(dev, dt, data, profile,
                            tuple(problems), space.ops, time.perf_counter() - start, rec.stopped, summary,
                            rec.blamed, fix, bool(args or kwargs or call is not None), assumed,
                            expectation(dev, dt, profile, {"profile": "the profile= argument"} if profile_given
                                        else None), tuple(items))


def assumed_note(n: int, device: torch.device) -> str:
    """What a report says when the weights of a model built on meta were taken as loaded on ``device``."""
    where = device_str(device)
    return (f"weights not loaded: assumed on {where} (all {n} parameters are on meta, as in a model built on the meta "
            f"device: simulated as if loaded on {where}). To check them as missing: assume_device=False (command "
            "line: --assume-device off); to run for real, load them (from_pretrained, load_state_dict(sd, "
            "assign=True))")


def not_loaded(found: Any) -> int:
    """How many parameters a walked object holds when all are on meta (built on meta, not loaded), else 0."""
    params = [e for e in found.entries if e.role == "parameter" and e.alias_of is None]
    return len(params) if params and all(e.tensor.device.type == "meta" for e in params) else 0


def _api_name(exc: BaseException) -> str:
    """The innermost torch function in the traceback (``torch.cuda.foo``) or the exception's type."""
    name, tb = type(exc).__name__, exc.__traceback__
    while tb is not None:
        if "/torch/" in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
            name = f"{tb.tb_frame.f_globals.get('__name__', '?')}.{tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return name

public_types(SimulationReport)


def _needs_values(problems: list[Any]) -> bool:
    return any(p.kind == "unsupported_op" and "it needs tensor values" in p.message for p in problems)


def _small(found: Any) -> bool:
    """The object's tensors hold data (none on meta) and fit in 2 GiB: a run with real values copies them."""
    ts = [e.tensor for e in found.entries if e.alias_of is None]
    return not any(t.is_meta for t in ts) and sum(t.nbytes for t in ts) <= 2 << 30


def simulate_target(load: Callable[[], Any], device: str | torch.device, dtype: str | torch.dtype | None = None, *,
                    profile: DeviceProfile | str | None = None, limit: int = LIMIT,
                    assume_device: str | torch.device | bool | None = None,
                    sources: dict[str, str] | None = None,
                    call: Callable[[Any], Any] | None = None, data: str = "cpu",
                    select: bool = True) -> SimulationReport:
    """``simulate`` of a TARGET whose own code must run on the virtual devices: ``load()`` (importing the file and
    calling its factory) runs inside the virtual session, so a function that builds its model on ``cuda:N`` works
    on any machine; then the object is moved with its own ``.to`` (float8 and packed storage kept) and called on its
    inputs. Nothing is copied: the objects are the ones ``load`` made in the run, named by their paths, and
    ``assume_device`` means what it means in ``simulate`` (a model whose parameters are all on meta is taken as
    loaded on ``device``, said so). ``sources``: where device/dtype/profile came from, said in the report."""
    from torchdoctor._scan.scan import scan
    from torchdoctor._virtual import blockfix, session as sessions
    from torchdoctor._walk import walk

    start = time.perf_counter()
    dev, dt = parse_device(device), parse_dtype(dtype) if dtype is not None else None
    if dev.type == "cpu":  # a dtype checked on this CPU: the TARGET is built for real, as on the device it names
        from torchdoctor._virtual.cpudtype import simulate_cpu

        t = load()
        built = time.perf_counter() - start
        report = simulate_cpu(*((t.obj, tuple(t.args), dict(t.kwargs)) if isinstance(t, Target) else (t, (), {})),
                              dt, call, limit, SimulationReport)
        return replace(report, built_seconds=built)  # type: ignore[no-any-return]
    placed: Any = None
    forward = False
    assumed = None
    with sessions.virtual_devices(dev, dt, profile=profile, limit=limit, raise_on_exit=False, data=data,
                         select=select) as session:
        loading = time.perf_counter()
        target = load()
        built = time.perf_counter() - loading  # importing the TARGET's file and its factory: said apart
        obj, args, kwargs = (target.obj, tuple(target.args), dict(target.kwargs)) if isinstance(target, Target) \
            else (target, (), {})
        found = walk(obj)
        # the TARGET placed it, or hooks place its layers per call: checked as built, as given (``ownplace``)
        to = None if built_on(found, dev) or placed_by_hooks(found, dev) else session.device
        # the objects ``load`` built in this block are virtual already: relabelled in place, not copied (a copy
        # of them would keep their meta label: their class is a virtual one, which ``virtual_copy`` copies as is)
        unloaded = not_loaded(found) if assume_device is None or assume_device is True else 0
        assume = session.device if unloaded else parse_device(assume_device) \
            if isinstance(assume_device, (str, torch.device)) else None
        session.adopt(found, assume)
        if unloaded:
            assumed = assumed_note(unloaded, session.device)
        if call is not None:  # the caller's own moving and calling (simulate's call= on an object run in place)
            forward = True
            call(obj)
        elif callable(getattr(type(obj), "to", None)) and (to or dt) is not None:
            with _quiet_moves():
                obj.to(*(() if to is None else (to,)), *(() if dt is None else (dt,)))
        placed = scan(obj, device=session.device, dtype=None if args or kwargs else dt) if call is None else None
        if call is None and (args or kwargs):
            forward = True
            obj(*(_placed_on(a, to, dt, assume, f"input {i}") for i, a in enumerate(args)),
                **{k: _placed_on(v, to, dt, assume, f"kwarg {k}") for k, v in kwargs.items()})
    problems = list(session.problems)
    problems.extend(left_behind(placed.problems if placed is not None else (), problems, forward))
    stopped = session.stopped
    if len(problems) > limit:  # the session's own line of what it left out is the last one: counted again here
        more = [p for p in problems if p.kind == "truncated" and p.op == "limit"]
        kept = [p for p in problems if p not in more]
        left = sum(int(p.found.split()[0]) for p in more) + max(len(kept) - limit, 0)
        problems = kept[:limit] + not_stored(left, limit)
    summary = summarize((info, None) for info in placed.tensors) if placed is not None else ()
    items = blockfix.proven_fixes(session, problems, held(obj) if dt is not None else None) if problems else ()  # at the op
    if call is None and any(f.applied() and not judged_at_op(f) for f in items):  # met at a layer's entry, not at
        items = tuple(_rerun_fresh(load, list(items), dev, dt, session.profile, limit, assume_device, session.data))
    fix = "\n".join(f.code for f in items) or None
    return SimulationReport(session.device, dt, session.data, session.profile, tuple(problems), session.ops,
                            time.perf_counter() - start - built, stopped, summary, session.culprits, fix, forward,
                            assumed, expectation(session.device, dt, session.profile, sources), items, built)


def left_behind(placed: Sequence[Any], problems: Sequence[Any], forward: bool) -> list[Any]:
    """What the placement check after the move adds to the run's problems: each one not said already (by kind and
    path), none about a tensor the device cannot hold (the run's ``unsupported_dtype`` of that path is the cause: its
    float64 next to a float32 model says it again), and, when a forward ran, only tensors the move left on another
    device (the forward's checks judge the rest)."""
    seen = {(p.kind, p.path) for p in problems}
    refused = {p.path for p in problems if p.kind == "unsupported_dtype"}
    return [q for q in placed if (q.kind, q.path) not in seen and q.path not in refused and (not forward or (
        q.kind == "device" and q.role in ("parameter", "buffer", "quant_state")))]


def _rerun_fresh(load: Callable[[], Any], items: list[Fix], dev: torch.device, dt: torch.dtype | None, profile: Any,
                 limit: int, assume_device: Any, data: str) -> list[Fix]:
    """The fixes no failing op judged, proven as the API proves them (a re-run of a freshly built TARGET with them
    applied: one verdict for the CLI and ``simulate``); a TARGET that cannot be built again keeps its verdict."""
    try:
        fresh = load()
    except Exception as exc:  # built on the device itself: only a run can build it
        log.info("simulate: the TARGET could not be built again for the proof: %s", exc)
        return items

    def rerun(fixes: list[Fix]) -> Any:  # as simulate's own: the dtype a fix switches to, the inputs as it passes them
        again = Target(fresh.obj, *fixed_inputs(tuple(fresh.args), dict(fresh.kwargs), fixes)) \
            if isinstance(fresh, Target) else fresh
        return simulate(again, device=dev, dtype=next((f.asks for f in fixes if f.asks is not None), dt),
                        profile=profile, limit=limit, assume_device=assume_device, data=data, _fixes=fixes).problems

    return proven(items, rerun)

"""guard overhead: plain forward vs `explain` vs `strict` vs `fix`, on a GPT-2-small-shaped model and a tiny one.

GPT-2-small shape: transformers GPT2LMHeadModel, 12 layers, 768 wide, seq 128, batch 1, no_grad, random weights.
All variants run in a shuffled order in every round (interleaved). The tiny run adds a no-op TorchDispatchMode:
the floor any per-op checker pays before doing any work. Printed: medians of wall time and of process
CPU time, and the median of the per-round ratios to plain (robust to load drift on a shared machine). On the tiny
model (2 layers, 64 wide, one intra-op thread) the difference to plain is divided by the number of module calls /
aten ops per forward.
Targets (issue 14): `explain` <= 1.03x, `strict` <= 1.1x on the GPT-2-small shape; strict's extra CPU per aten op
<= 1.5x the no-op dispatch-mode floor on the tiny model.

The per-op figure is a ratio of two small differences, (strict - plain) / (noop - plain). Timed in blocks of 40
forwards per variant (the first estimator, ``blocks``), a load change on the shared machine that lands in one
variant's block moves it by tens of percent run to run; ``interleaved`` runs the three variants one forward at a
time in rotating order, so a load change lands on all three alike. ``python bench/guard.py estimators [RUNS]``
prints both, run after run, side by side (docs/guard-speed.md).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging

import torchdoctor
from torchdoctor._guard import fastpath, lean

logging.set_verbosity_error()
MODES = ("explain", "strict", "fix")


def build(n_layer: int, n_embd: int, n_head: int, vocab: int) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=1024,
                     bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    return GPT2LMHeadModel(cfg).eval()


class NoopMode(TorchDispatchMode):
    """The floor of any dispatch-mode checker: torch's own cost of routing every op through Python."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def variants(model: torch.nn.Module, ids: torch.Tensor, floor: bool = False) -> dict[str, Callable[[], Any]]:
    def plain() -> Any:
        with torch.no_grad():
            return model(input_ids=ids).logits

    def guarded(mode: str) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad(), torchdoctor.guard(model, mode=mode):
                return model(input_ids=ids).logits

        return run

    def noop_mode() -> Any:
        with torch.no_grad(), NoopMode():
            return model(input_ids=ids).logits

    return {"plain": plain, **{m: guarded(m) for m in MODES}, **({"noop_mode": noop_mode} if floor else {})}


def measure(fns: dict[str, Callable[[], Any]], rounds: int, warmup: int = 2) -> dict[str, dict[str, float]]:
    """Per variant: median wall time, median CPU time, median per-round wall and CPU ratio to plain."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for _ in range(rounds):
        random.shuffle(order)
        for key in order:
            c0, t0 = time.process_time(), time.perf_counter()
            fns[key]()
            wall[key].append(time.perf_counter() - t0)
            cpu[key].append(time.process_time() - c0)
    out = {}
    for k in fns:
        out[k] = {
            "wall": statistics.median(wall[k]),
            "cpu": statistics.median(cpu[k]),
            "ratio": statistics.median(a / b for a, b in zip(wall[k], wall["plain"])),
            "cpu_ratio": statistics.median(a / b for a, b in zip(cpu[k], cpu["plain"]) if b > 0),
            "cpu_extra": statistics.median(a - b for a, b in zip(cpu[k], cpu["plain"])),
        }
    return out


def counts(model: torch.nn.Module, ids: torch.Tensor) -> tuple[int, int]:
    """(module calls, aten ops) of one forward."""
    n = {"mod": 0, "op": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            n["op"] += 1
            return func(*args, **(kwargs or {}))

    def hook(*_: Any) -> None:
        n["mod"] += 1

    h = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        with torch.no_grad(), Count():
            model(input_ids=ids)
    finally:
        h.remove()
    return n["mod"], n["op"]


def report(name: str, med: dict[str, dict[str, float]]) -> None:
    base = med["plain"]
    print(f"{name}:")
    print(f"  plain    wall {base['wall'] * 1e3:8.2f} ms   cpu {base['cpu'] * 1e3:8.2f} ms")
    for m in [k for k in med if k != "plain"]:
        r = med[m]
        print(f"  {m:<8} wall {r['wall'] * 1e3:8.2f} ms   cpu {r['cpu'] * 1e3:8.2f} ms   "
              f"ratio of medians x{r['wall'] / base['wall']:.3f} (cpu x{r['cpu'] / base['cpu']:.3f})   "
              f"median per-round ratio x{r['ratio']:.3f} (cpu x{r['cpu_ratio']:.3f})")


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int, per_round: int = 40, warm: int = 5,
                clock: Callable[[], float] = time.process_time) -> dict[str, list[float]]:
    """Per variant, its mean time per call in each round (after ``warm`` untimed calls each). A round runs every
    variant ``per_round`` times, one call at a time, the variants in rotating order (each permutation in turn): a
    change of load on the machine lands on every variant alike, where blocks of calls per variant give it to
    whichever block ran through it."""
    keys = list(fns)
    for _ in range(warm):
        for fn in fns.values():
            fn()
    perms = list(itertools.permutations(keys))
    out: dict[str, list[float]] = {k: [] for k in keys}
    n = 0
    for _ in range(rounds):
        acc = dict.fromkeys(keys, 0.0)
        for _ in range(per_round):
            for key in perms[n % len(perms)]:
                t = clock()
                fns[key]()
                acc[key] += clock() - t
            n += 1
        for key in keys:
            out[key].append(acc[key] / per_round)
    return out


def blocks(fns: dict[str, Callable[[], Any]], rounds: int, per_round: int = 40,
           clock: Callable[[], float] = time.process_time) -> dict[str, list[float]]:
    """The estimator bench/table.py used until this session: per round, ``per_round`` calls of one variant, then of
    the next, the order reversed every other round. Kept to compare with ``interleaved``."""
    keys = list(fns)
    out: dict[str, list[float]] = {k: [] for k in keys}
    for i in range(rounds):
        for key in keys if i % 2 == 0 else keys[::-1]:
            t = clock()
            for _ in range(per_round):
                fns[key]()
            out[key].append((clock() - t) / per_round)
    return out


def per_op(times: dict[str, list[float]], ops: int, ours: str = "strict") -> tuple[list[float], list[float]]:
    """Per round: ``ours``' extra time per aten op over plain, and the empty dispatch mode's."""
    plain = times["plain"]
    return ([(s - p) / ops for s, p in zip(times[ours], plain)],
            [(x - p) / ops for x, p in zip(times["noop_mode"], plain)])


def tiny_setup(keys: tuple[str, ...] = ("strict", "plain", "noop_mode")
               ) -> tuple[dict[str, Callable[[], Any]], int, int]:
    """(the ``keys`` forwards of the tiny GPT-2, module calls and aten ops per forward), on one thread."""
    torch.set_num_threads(1)  # per-call Python cost; two intra-op threads only add barrier waits under load
    tiny = build(2, 64, 4, 256)
    tiny_ids = torch.randint(0, 50257, (1, 128), generator=torch.Generator().manual_seed(0))[:, :16] % 256
    mods, ops = counts(tiny, tiny_ids)
    fns = variants(tiny, tiny_ids, floor=True)
    fns = {k: fns[k] for k in keys}
    for _ in range(10):
        for fn in fns.values():
            fn()
    return fns, mods, ops


def estimators(runs: int = 6, rounds: int = 9) -> None:
    """Both per-op estimators, alternately, ``runs`` times each: how much does each move from run to run?"""
    fns, _, ops = tiny_setup()
    got: dict[str, list[float]] = {"blocks": [], "interleaved": []}
    for i in range(runs):
        for name in ("blocks", "interleaved") if i % 2 == 0 else ("interleaved", "blocks"):
            times = (blocks if name == "blocks" else interleaved)(fns, rounds)
            s, n = per_op(times, ops)
            ratios = [a / b for a, b in zip(s, n) if b > 0]
            got[name].append(statistics.median(ratios))
            print(f"  run {i + 1} {name:<11} x{got[name][-1]:.2f} ({min(ratios):.2f}-{max(ratios):.2f}, "
                  f"{len(ratios)})   per op: strict +{statistics.median(s) * 1e6:.1f} us, empty mode "
                  f"+{statistics.median(n) * 1e6:.1f} us", flush=True)
    for name, vals in got.items():
        print(f"{name:<11} median x{statistics.median(vals):.2f}, runs {min(vals):.2f}-{max(vals):.2f}, "
              f"stdev {statistics.pstdev(vals):.3f}")


def main(rounds: int = 30, tiny_rounds: int = 15) -> None:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, medians of interleaved shuffled rounds")
    ids = torch.randint(0, 50257, (1, 128), generator=torch.Generator().manual_seed(0))
    big = build(12, 768, 12, 50257)
    same = torch.equal(variants(big, ids)["plain"](), variants(big, ids)["strict"]())
    med = measure(variants(big, ids), rounds)
    report(f"gpt2-small shape (12x768, seq 128, batch 1, no_grad), {rounds} rounds", med)
    print(f"  strict output equal to plain bit for bit: {same}")
    fns, mods, ops = tiny_setup(("strict", "explain", "plain", "noop_mode"))
    times = interleaved(fns, tiny_rounds)
    s, n = per_op(times, ops)
    per = statistics.median(a / b for a, b in zip(s, n) if b > 0)
    print(f"tiny gpt2 (2x64, seq 16, 1 thread), {tiny_rounds} rounds of 40 forwards each, interleaved one by one:")
    for key, vals in times.items():
        print(f"  {key:<9} cpu {statistics.median(vals) * 1e3:8.3f} ms")
    hooks = statistics.median(e - p for e, p in zip(times["explain"], times["plain"])) / mods
    print(f"  {mods} module calls and {ops} aten ops per forward; extra cpu per aten op: strict "
          f"{statistics.median(s) * 1e6:.1f} us, an empty TorchDispatchMode {statistics.median(n) * 1e6:.1f} us; "
          f"explain per module call {hooks * 1e6:.1f} us")
    explain, strict = med["explain"]["ratio"], med["strict"]["ratio"]
    print(f"targets (median per-round wall ratio): explain x{explain:.3f} <= 1.03 "
          f"{'met' if explain <= 1.03 else 'NOT met'}; strict x{strict:.3f} <= 1.1 "
          f"{'met' if strict <= 1.1 else 'NOT met'}; "
          f"strict per aten op x{per:.2f} of the floor <= 1.5 {'met' if per <= 1.5 else 'NOT met'}")


class EmptyFunctionMode(TorchFunctionMode):
    """The floor of a torch-function-level checker: every torch call (not every aten op) routed through Python."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


class FunctionCheck(TorchFunctionMode):
    """A torch-function-level first stage: every torch call's tensor arguments compared (devices, floating dtypes),
    the cost a function-mode strict would pay before any rule ran."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if len(args) + len(kwargs) > 1:
            fastpath.odd(itertools.chain(args, kwargs.values()))
        return func(*args, **kwargs)


class SkipOneTensor(TorchDispatchMode):
    """A dispatch mode that returns at once from ops with at most one tensor operand and compares the rest's
    tensors (``fastpath.odd``): what skipping one-tensor ops saves when the Python hop itself is the cost."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if len(args) > 1 or kwargs:
            fastpath.odd(itertools.chain(args, kwargs.values()))
        return func(*args, **kwargs)


def _inside_only(gate: fastpath.Gate) -> None:
    """``Gate.sync`` with no mode around the model's code: what strict's per-op check outside modules costs."""
    want = bool(gate.active) or gate.sticky
    if want and not gate.on:
        gate.enter()
        gate.on = True
    elif gate.on and not want and gate.leave():
        gate.on = False


@contextlib.contextmanager
def inside_only(model: torch.nn.Module) -> Iterator[Any]:
    """strict's gate with nothing checked outside modules (a bench-only variant, not a mode of guard)."""
    sync = fastpath.Gate.sync
    fastpath.Gate.sync = _inside_only  # type: ignore[method-assign]
    try:
        with torchdoctor.guard(model, mode="strict") as g:
            yield g
    finally:
        fastpath.Gate.sync = sync  # type: ignore[method-assign]


@contextlib.contextmanager
def nothing_after_backward(model: torch.nn.Module) -> Iterator[Any]:
    """strict's gate as it was before ``_guard/aftergrad.py``: nothing after a backward checked (bench-only)."""
    fastpath.AFTER = False
    try:
        with torchdoctor.guard(model, mode="strict") as g:
            yield g
    finally:
        fastpath.AFTER = True


@contextlib.contextmanager
def per_op_around(model: torch.nn.Module) -> Iterator[Any]:
    """strict's gate with the dispatch mode on every op of the code around the model (before the first stage
    checked it call by call, ``_guard/aftergrad.py``; bench-only)."""
    fastpath.BY_CALL = False
    try:
        with torchdoctor.guard(model, mode="strict") as g:
            yield g
    finally:
        fastpath.BY_CALL = True


def _general(mod: torch.nn.Module, args: tuple[Any, ...], names: tuple[str, ...]) -> bool:
    """``fastpath._disagree`` without its short paths (containers, a layer on one plain tensor): the general loop."""
    own = itertools.chain(mod._parameters.values(), mod._buffers.values(), map(mod.__dict__.get, names))
    return fastpath._odd(itertools.chain(own, args), True)


@contextlib.contextmanager
def general_gate(model: torch.nn.Module) -> Iterator[Any]:
    """strict's gate with every module call compared by the general loop (before its short paths; bench-only)."""
    short = fastpath._disagree
    fastpath._disagree = _general  # type: ignore[assignment]
    try:
        with torchdoctor.guard(model, mode="strict") as g:
            yield g
    finally:
        fastpath._disagree = short  # type: ignore[assignment]


@contextlib.contextmanager
def own_pair(model: torch.nn.Module) -> Iterator[Any]:
    """strict's gate in a global hook pair of its own, beside the session's (before it ran inside the session's
    hooks: torch's hook loop ran twice per module call; bench-only)."""
    fastpath.CHAINED = False
    try:
        with torchdoctor.guard(model, mode="strict") as g:
            yield g
    finally:
        fastpath.CHAINED = True


@contextlib.contextmanager
def both_hooks(model: torch.nn.Module, mode: str = "explain") -> Iterator[Any]:
    """guard with its global pre and post hook on every forward (before no-grad forwards ran with no global post
    hook, ``_guard/lean.py``; bench-only)."""
    lean.LEAN = False
    try:
        with torchdoctor.guard(model, mode=mode) as g:
            yield g
    finally:
        lean.LEAN = True


@contextlib.contextmanager
def pre_kept(model: torch.nn.Module) -> Iterator[Any]:
    """explain with its global pre hook kept in no-grad forwards whose tensors all agree (before they ran with no
    global hook at all, ``lean.BARE``; bench-only)."""
    lean.BARE = False
    try:
        with torchdoctor.guard(model) as g:
            yield g
    finally:
        lean.BARE = True


@contextlib.contextmanager
def empty_hooks(post: bool = True) -> Iterator[None]:
    """An empty global forward pre hook (and post hook): torch's hooked module-call path, nothing of guard's."""
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    handles = [register_module_forward_pre_hook(lambda m, a: None)]
    if post:
        handles.append(register_module_forward_hook(lambda m, a, o: None))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def every_op(model: torch.nn.Module) -> Iterator[Any]:
    """strict as it was before the module-boundary gate: the dispatch mode on every op of the block."""
    fastpath.ENABLED = False
    try:
        with torchdoctor.guard(model, mode="strict") as g:
            yield g
    finally:
        fastpath.ENABLED = True


def census(fn: Callable[[], Any], model: torch.nn.Module) -> dict[str, int]:
    """What one call runs: aten ops, those with several tensor operands or a device argument (where placement can
    fail), those outside any module, torch-function calls, module calls, and the module calls the gated strict
    found suspect."""
    n = dict.fromkeys(("ops", "multi", "outside", "calls", "modules", "suspect", "after"), 0)
    depth = [0]

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            n["ops"] += 1
            n["outside"] += depth[0] == 0
            flat = [x for a in (*args, *kwargs.values()) for x in (a if isinstance(a, (list, tuple)) else (a,))]
            if sum(isinstance(x, torch.Tensor) for x in flat) > 1 or "device" in kwargs:
                n["multi"] += 1
            return func(*args, **kwargs)

    class Calls(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            n["calls"] += 1
            return func(*args, **(kwargs or {}))

    def hook(*_: Any) -> None:
        n["modules"] += 1
        depth[0] += 1

    def leave(*_: Any) -> None:
        depth[0] -= 1

    hs = [torch.nn.modules.module.register_module_forward_pre_hook(hook),
          torch.nn.modules.module.register_module_forward_hook(leave, always_call=True)]
    try:
        with Ops():
            fn()
        with Calls():
            fn()
    finally:
        for h in hs:
            h.remove()
    n["modules"] //= 2
    with torchdoctor.guard(model, mode="strict") as g:
        fn()
        gate = g._local.sessions[-1].dispatch.gate
        n["suspect"] = gate.suspects if gate is not None else -1
        n["after"] = gate.after.checked if gate is not None and gate.after is not None else 0
    return n


def fastest(ours: list[float], plain: list[float]) -> float:
    """The mean of the fastest quarter of ``ours`` over that of ``plain``. Load only ever adds time to a call that
    does the same work, so each variant's fastest calls are the ones the other programs disturbed least; unlike the
    per-round ratio this does not ask both calls of a round to be disturbed alike."""
    k = max(1, len(ours) // 4)
    return sum(sorted(ours)[:k]) / sum(sorted(plain)[:k])


def workloads(rounds: int = 5, only: str = "", pick: tuple[str, ...] = ()) -> None:
    """Issue 43 point 2: guard around ``generate()`` (GPT-2-small from config, 24 new tokens, greedy) and around a
    training step (seq 64, SGD), one thread, every mechanism in one process: explain (torch's own C++ kernel checks,
    an escaping error explained), strict with the module-boundary gate (``_guard/fastpath.py``), strict with the
    dispatch mode on every op (before the gate), the gate with no mode around the model's code (what the per-op check
    outside modules costs), an empty TorchDispatchMode, one that skips one-tensor ops, an empty TorchFunctionMode
    (the floors of a per-aten-op and of a per-torch-call checker) and a function mode that compares every call's
    tensors (a function-level first stage). Interleaved one call at a time, the order rotated each round; process
    CPU time (run it under ``nice``: the machine is shared); per variant the median of the per-round ratios to plain,
    with min-max, the quartiles and the number of rounds."""
    torch.set_num_threads(1)
    model = build(12, 768, 12, 50257)
    prompt = torch.randint(0, 50256, (1, 32), generator=torch.Generator().manual_seed(0))
    batch = torch.randint(0, 50256, (1, 64), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def gen() -> Any:
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)

    def step() -> Any:
        model.train()
        opt.zero_grad(set_to_none=True)
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
        model.eval()

    adamw = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ema = [p.detach().clone() for p in model.parameters()]

    def full_step() -> Any:  # what follows the backward is what strict's first stage looks at (_guard/aftergrad.py)
        model.train()
        adamw.zero_grad(set_to_none=True)
        model(input_ids=batch, labels=batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        adamw.step()
        with torch.no_grad():
            for e, p in zip(ema, model.parameters()):
                e.lerp_(p, 0.001)
        model.eval()

    def wrapped(fn: Callable[[], Any], ctx: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with ctx():
                return fn()
        return run

    print(f"torch {torch.__version__}, 1 thread, {rounds} rounds, process CPU time, interleaved one call at a time")
    print("| workload | mechanism | median call | ratio to plain (min-max; quartiles; rounds) | ratio of the fastest "
          "quarters | extra per aten op |")
    print("|---|---|---|---|---|---|")
    for name, fn in (("generate, 24 new tokens", gen), ("training step, seq 64, SGD", step),
                     ("training step, seq 64, AdamW + clip + EMA lerp_", full_step)):
        if only and not name.startswith(only):
            continue
        n = census(fn, model)
        fns = {"plain": fn, "explain": wrapped(fn, lambda: torchdoctor.guard(model, mode="explain")),
               "explain (both global hooks on every forward)": wrapped(fn, lambda: both_hooks(model)),
               "explain (global pre hook kept)": wrapped(fn, lambda: pre_kept(model)),
               "strict (gated, both global hooks on every forward)": wrapped(fn, lambda: both_hooks(model, "strict")),
               "empty global pre hook": wrapped(fn, lambda: empty_hooks(False)),
               "empty global hook pair": wrapped(fn, empty_hooks),
               "strict (gated)": wrapped(fn, lambda: torchdoctor.guard(model, mode="strict")),
               "strict (gated, own global hook pair)": wrapped(fn, lambda: own_pair(model)),
               "strict (gated, general loop per module call)": wrapped(fn, lambda: general_gate(model)),
               "strict (gated, nothing checked after the backward)": wrapped(fn, lambda: nothing_after_backward(model)),
               "strict (gated, dispatch mode on every op around the model)": wrapped(fn, lambda: per_op_around(model)),
               "strict (every op)": wrapped(fn, lambda: every_op(model)),
               "strict (gated, no mode outside modules)": wrapped(fn, lambda: inside_only(model)),
               "empty dispatch mode": wrapped(fn, NoopMode),
               "dispatch mode skipping one-tensor ops": wrapped(fn, SkipOneTensor),
               "empty function mode": wrapped(fn, EmptyFunctionMode),
               "function-mode compare": wrapped(fn, FunctionCheck)}
        keys = [k for k in fns if not pick or k == "plain" or any(w in k for w in pick)]
        fns = {k: fns[k] for k in keys}
        for f in fns.values():
            f()
        load = os.getloadavg()[0]
        times: dict[str, list[float]] = {k: [] for k in keys}
        for r in range(rounds):
            order = keys[r % len(keys):] + keys[:r % len(keys)]
            for key in order if r % 2 == 0 else order[::-1]:
                t = time.process_time()
                fns[key]()
                times[key].append(time.process_time() - t)
        for key in keys:
            ratios = [v / p for v, p in zip(times[key], times["plain"])]
            extra = statistics.median(v - p for v, p in zip(times[key], times["plain"])) / n["ops"]
            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
            print(f"| {name} | {key} | {statistics.median(times[key]) * 1e3:.0f} ms | x{statistics.median(ratios):.3f} "
                  f"({min(ratios):.3f}-{max(ratios):.3f}; quartiles {q[0]:.3f}-{q[2]:.3f}; {len(ratios)}) | "
                  f"x{fastest(times[key], times['plain']):.3f} | {extra * 1e6:+.1f} us |", flush=True)
        print(f"<!-- load average {load:.1f} -> {os.getloadavg()[0]:.1f} -->")
        print(f"<!-- {name}: {n['ops']} aten ops, {n['multi']} with several tensor operands or a device argument; "
              f"{n['outside']} outside any module; {n['calls']} torch-function calls; {n['modules']} module calls, "
              f"{n['suspect']} suspect under the gate; {n['after']} calls after the backward checked per op -->", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["estimators"]:
        estimators(*(int(a) for a in sys.argv[2:4]))
    elif sys.argv[1:2] == ["workloads"]:
        # python bench/guard.py workloads ROUNDS [WORKLOAD-PREFIX] [MECHANISM-WORDS,...] (plain is always timed)
        workloads(int(sys.argv[2]) if sys.argv[2:3] else 5, sys.argv[3] if sys.argv[3:4] else "",
                  tuple(w for w in sys.argv[4].split(",") if w) if sys.argv[4:5] else ())
    else:
        main(*(int(a) for a in sys.argv[1:3]))

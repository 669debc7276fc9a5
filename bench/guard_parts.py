"""guard strict around ``generate()``, part by part: what each piece of guard costs per call, timed alone (the
fastest of several repeats, thread CPU time), times how often one GPT-2-small ``generate()`` calls it.

The whole-call ratio (``bench/guard.py workloads``) is what the user sees, but on a shared machine its per-round
spread (±10-20 % at load 10) hides a few percent. The pieces below each run thousands of times in a tight loop,
and the fastest repeat of a loop is the one the machine disturbed least, so their sum is steady from run to run:
an estimate of guard's own CPU per ``generate()`` that load does not move much. Pieces:

- ``hooked call``: torch's module call with one global forward pre hook and one post hook that do nothing, minus the
  call with none (the hooked path of ``Module._call_impl``: what any global hook pays, explain included);
- ``session hooks``: guard's own pre and post hooks (the module stack), per module call;
- ``gate``: strict's module-boundary comparison (``_guard/fastpath.py``), per module call of a GPT-2 block;
- ``function-mode hop``: an empty ``TorchFunctionMode``, per torch call (the floor of a per-call first stage);
- ``first stage``: strict's first stage around the model (``_guard/aftergrad.py``), per torch call of the kind a
  generate loop makes between its forwards (beyond the hop).

``python bench/guard_parts.py [ROUNDS]`` prints each piece, the counts, the sum per ``generate()`` and that sum over
plain ``generate()``'s fastest call: explain = hooked call + session hooks; strict = explain + gate + hop + first
stage (the dispatch mode inside suspect modules is not counted: GPT-2's ``generate()`` has none).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch.overrides import TorchFunctionMode
from transformers.models.gpt2.modeling_gpt2 import GPT2Block

import torchdoctor
from torchdoctor._guard import fastpath
from torchdoctor._guard.aftergrad import AfterBackward

sys.path.insert(0, os.path.dirname(__file__))
from guard import build, census  # noqa: E402


def fastest(fn: Callable[[], Any], per: int, repeats: int = 7) -> float:
    """Microseconds per unit: the fastest of ``repeats`` runs of ``fn`` (which does ``per`` units)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best / per * 1e6


class Empty(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def parts(loops: int = 2000) -> dict[str, float]:
    torch.set_num_threads(1)
    block = GPT2Block(build(1, 64, 2, 1000).config).eval()
    x = torch.randn(1, 4, 64)
    mods = [(m, (x,)) for m in block.modules()]
    leaf = torch.nn.Identity()

    def calls() -> None:
        for _ in range(loops * 10):
            leaf(x)

    plain_call = fastest(calls, loops * 10)
    handles = [torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: None),
               torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None)]
    try:
        hooked = fastest(calls, loops * 10) - plain_call
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad(), torchdoctor.guard(block, mode="strict") as g:
        session = g._local.sessions[-1]
        gate_pre = session.chain[0]
        pre, post = session._hooks()
        session.chain[:] = [None, None, ()]  # the session's hooks alone

        inner = mods[1:]  # the block itself runs once around the loops: its calls are module calls inside a forward

        def hooks() -> None:
            for _ in range(loops):
                for m, a in inner:
                    pre(m, a)
                for m, a in reversed(inner):
                    post(m, a, {}, x)

        def gate() -> None:
            for _ in range(loops):
                for m, a in inner:
                    gate_pre(m, a)

        gate_state = session.dispatch.gate if session.dispatch is not None else None
        if gate_state is not None and gate_state.after is not None:  # inside a forward the first stage is off
            gate_state.after.disarm()
        pre(block, (x,))
        pre(block.attn, (x,))  # the gate's view: two modules deep, as every call inside a model is
        session_hooks = fastest(hooks, loops * len(inner))
        gate_cost = fastest(gate, loops * len(inner))
        post(block.attn, (x,), {}, x)
        post(block, (x,), {}, x)
    a, b, ids = torch.ones(4), torch.ones(4), torch.ones(1, 8, dtype=torch.long)

    def loop_calls() -> None:  # the calls of a generate loop's bookkeeping: one tensor, two that agree, a list
        for _ in range(loops):
            torch.add(a, b)
            a.view(2, 2)
            ids[:, -1:]
            a.sum()
            torch.cat([a, b], dim=-1)

    bare = fastest(loop_calls, loops * 5)
    with Empty():
        hop = fastest(loop_calls, loops * 5) - bare
    first = AfterBackward(lambda: None, lambda: True, lambda: False, fastpath._odd)
    first.ready = True
    with first:
        stage = fastest(loop_calls, loops * 5) - bare - hop
    return {"hooked call": hooked, "session hooks": session_hooks, "gate": gate_cost, "function-mode hop": hop,
            "first stage": stage}


def main(rounds: int = 3) -> None:
    torch.set_num_threads(1)
    model = build(12, 768, 12, 50257)
    prompt = torch.randint(0, 50256, (1, 32), generator=torch.Generator().manual_seed(0))

    def gen() -> Any:
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)

    n = census(gen, model)
    outside = torch_calls_outside(gen)
    plain = min(fastest(gen, 1, 1) for _ in range(rounds)) / 1e3  # ms
    load = os.getloadavg()[0]
    for r in range(rounds):
        p = parts()
        ms = {"hooked call": p["hooked call"] * n["modules"], "session hooks": p["session hooks"] * n["modules"],
              "gate": p["gate"] * n["modules"], "function-mode hop": p["function-mode hop"] * outside,
              "first stage": p["first stage"] * outside}
        explain = ms["hooked call"] + ms["session hooks"]
        strict = sum(ms.values())
        print(f"round {r}: " + "; ".join(f"{k} {p[k]:.2f} us -> {v / 1e3:.1f} ms" for k, v in ms.items()))
        print(f"  explain {explain / 1e3:.1f} ms = x{1 + explain / 1e3 / plain:.3f}; strict {strict / 1e3:.1f} ms = "
              f"x{1 + strict / 1e3 / plain:.3f} of plain generate() (fastest {plain:.0f} ms)", flush=True)
    print(f"generate(): {n['modules']} module calls, {outside} torch calls outside any module, {n['ops']} aten ops; "
          f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}")


def torch_calls_outside(fn: Callable[[], Any]) -> int:
    """Torch-function calls made outside any module call: what strict's first stage sees."""
    depth, n = [0], [0]

    class Count(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            n[0] += depth[0] == 0
            return func(*args, **(kwargs or {}))

    def enter(*_: Any) -> None:
        depth[0] += 1

    def leave(*_: Any) -> None:
        depth[0] -= 1

    hs = [torch.nn.modules.module.register_module_forward_pre_hook(enter),
          torch.nn.modules.module.register_module_forward_hook(leave, always_call=True)]
    try:
        with Count():
            fn()
    finally:
        for h in hs:
            h.remove()
    return n[0]


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))

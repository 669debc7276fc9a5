"""simulate with and without the one-op path (``_virtual/whole.py``: ``F.linear`` / ``F.scaled_dot_product_attention``
as one aten op), against a plain meta forward and FakeTensorMode, on the real-width shapes of ``bench/shapes.py``.

    python bench/simulate_whole.py llama:1 llama:4 flux:1 sdxl:4 [--rounds 7]

Each shape is built once; every round runs, in a rotating order, simulate (one-op path on), simulate (off), a plain
meta forward, a second plain meta forward (the anchor against itself: the noise floor of this machine now) and
FakeTensorMode on fake cpu, each call after a full collection, timed in process CPU time. The two simulate variants
are asserted to give the same findings first. Prints per-round-ratio medians with their min-max.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # bench/trace.py shadows stdlib trace
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import torchdoctor  # noqa: E402
from torchdoctor._virtual import whole  # noqa: E402


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", os.path.join(_HERE, f"{name}.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ratio(a: list[float], b: list[float]) -> str:
    r = [x / y for x, y in zip(a, b) if y > 0]
    return f"x{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"


def variants(name: str, scale: int) -> dict[str, Callable[[], Any]]:
    """The five calls of a round on ``name`` at ``scale`` (built once)."""
    shapes, depth = _load("shapes"), _load("depth")
    model, inputs = shapes.BUILDERS[name](scale)
    meta_in = shapes.meta_inputs(inputs)

    def sim(on: bool) -> Callable[[], Any]:
        def run() -> Any:
            whole.ENABLED = on
            try:
                rep = torchdoctor.simulate(model, inputs, device="cuda:1", dtype="bfloat16", assume_device="cpu")
            finally:
                whole.ENABLED = True
            assert rep.ok, rep
            return rep
        return run

    def meta() -> None:
        with torch.no_grad():
            model(**meta_in)

    return {"on": sim(True), "off": sim(False), "meta": meta, "meta2": meta,
            "fake": lambda: depth.fake_forward(model, inputs)}


def rounds(calls: dict[str, Callable[[], Any]], n: int) -> dict[str, list[float]]:
    names = list(calls)
    for f in calls.values():
        f()
    t: dict[str, list[float]] = {k: [] for k in names}
    for i in range(n):
        for j in range(len(names)):
            k = names[(i + j) % len(names)]
            gc.collect()
            c = time.process_time()
            calls[k]()
            t[k].append(time.process_time() - c)
    return t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["llama:1", "llama:4", "flux:1", "sdxl:4"],
                    help="name:scale, name one of flux, sdxl, llama; scale 1, 2, 4 ... (flux:2 is 4+8 blocks)")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, load average {os.getloadavg()[0]:.1f}, {args.rounds} rounds per shape",
          flush=True)
    for arg in args.shapes:
        name, _, scale = arg.partition(":")
        if name not in ("flux", "sdxl", "llama") or not scale.isdigit() or int(scale) < 1:
            ap.error(f"{arg}: expected name:scale with name flux, sdxl or llama and a scale of 1 or more")
        calls = variants(name, int(scale))
        on, off = calls["on"](), calls["off"]()
        assert (on.ok, on.problems) == (off.ok, off.problems), (on, off)
        t = rounds(calls, args.rounds)
        med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
        print(f"{arg}: ops {on.ops} (off {off.ops}); ms on {med['on']:.0f}, off {med['off']:.0f}, meta "
              f"{med['meta']:.0f}, fake {med['fake']:.0f} | on/meta {ratio(t['on'], t['meta'])}, off/meta "
              f"{ratio(t['off'], t['meta'])}, on/fake {ratio(t['on'], t['fake'])}, off/fake "
              f"{ratio(t['off'], t['fake'])}, on/off {ratio(t['on'], t['off'])}, meta/meta "
              f"{ratio(t['meta2'], t['meta'])}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Simulation cost on realistic shapes: Llama-3-8B and 70B built on meta, 128 tokens, virtual cuda:1.

Run: ``python bench/simulate.py [8b|70b|both|layers|cli [ROUNDS [l8,l70,l8t,l70t]]]``. Each size runs in a fresh subprocess, so peak RSS is per
size. Prints the wall time of ``torchdoctor.simulate`` (median of 5 after a first call, interleaved with a plain
forward of the same meta model as the baseline), the number of aten ops checked, and the process's peak RSS.
Targets (issue 5): 8B < 2 s, 70B < 10 s, peak RSS < 1 GB. ``layers`` runs the 8B shape with 8 and with 32 layers
and prints the cost of one more layer for both (issue 28: the cost stays linear in layers; the table of meta-kernel
outputs, kept for the process since issue 43, makes every layer after the first cheaper, and every call after the
first in a process: ``first_s`` is the cold table). ``cli`` compares the command line's simulate of a model built on
meta with the API's, whole processes interleaved (issue 42 point 9: within 1.2x).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

SHAPES = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64),
}
TOKENS = 128


def one(size: str, layers: int | None = None) -> dict[str, object]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import torchdoctor

    shape = dict(SHAPES[size], **({"num_hidden_layers": layers} if layers else {}))
    cfg = LlamaConfig(vocab_size=128256, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
                      **shape)
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).eval()
    build = time.perf_counter() - t0
    ids = torch.randint(0, 128256, (1, TOKENS))
    times, plain, report = [], [], None
    first = time.perf_counter()
    for i in range(6):  # interleaved with the baseline: a plain forward of the meta model (no checks, no copy)
        t0 = time.perf_counter()
        report = torchdoctor.simulate(model, {"input_ids": ids}, device="cuda:1", assume_device="cpu")
        if i:
            times.append(time.perf_counter() - t0)
        else:
            first = time.perf_counter() - t0
        t0 = time.perf_counter()
        with torch.no_grad():
            model(input_ids=ids.to("meta"))
        plain.append(time.perf_counter() - t0)
    assert report is not None and report.ok, report
    return {
        "size": size,
        "params": sum(p.numel() for p in model.parameters()),
        "build_s": round(build, 3),
        "simulate_s": round(statistics.median(times), 3),
        "simulate_min_s": round(min(times), 3),
        "first_s": round(first, 3),
        "plain_meta_forward_s": round(statistics.median(plain), 3),
        "ops": report.ops,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _child(size: str, *extra: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--one", size, *extra], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def layers() -> None:
    rows = {n: _child("8b", str(n)) for n in (8, 32)}
    for key, what in (("simulate_s", "simulate"), ("plain_meta_forward_s", "plain meta forward")):
        a, b = float(rows[8][key]), float(rows[32][key])
        print(f"{what}: 8 layers {a:.3f} s, 32 layers {b:.3f} s, {(b - a) / 24 * 1e3:.1f} ms per layer")


_APP = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM

def _build(hidden, inter, layers, heads):
    cfg = LlamaConfig(vocab_size=128256, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=8)
    with torch.device("meta"):  # weights never loaded
        return LlamaForCausalLM(cfg)

def l8():
    return _build(4096, 14336, 8, 32)

def l70():
    return _build(8192, 28672, 80, 64)

def _with_input(model):
    import torchdoctor
    return torchdoctor.Target(model, kwargs={"input_ids": torch.randint(0, 128256, (1, 16))})

def l8t():
    return _with_input(l8())

def l70t():
    return _with_input(l70())
"""
_API = ("import json, sys, time, torchdoctor; sys.path.insert(0, '.'); import app; t0 = time.perf_counter(); "
        "t = getattr(app, sys.argv[1])(); t = t if isinstance(t, torchdoctor.Target) else torchdoctor.Target(t); "
        "built = time.perf_counter() - t0; "
        "r = torchdoctor.simulate(t.obj, t.kwargs or t.args or None, device='cuda:1'); "
        "print(json.dumps({'ok': r.ok, 'ops': r.ops, 'problems': [p.kind for p in r.problems], "
        "'seconds': r.seconds, 'built_seconds': built}))")


def _step(docs: list[dict[str, Any]], key: str) -> str:
    return f"{statistics.median(float(d[key] or 0) for d in docs):.2f} s"


def _timed(argv: list[str], cwd: str) -> tuple[float, float, dict[str, Any]]:
    """Wall and CPU seconds (this process's children: the CLI's TARGET child included) of one whole command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                         env=dict(os.environ, HF_HUB_OFFLINE="1", TORCHDOCTOR_PROGRESS="0"))
    wall = time.perf_counter() - t0
    if out.returncode not in (0, 1):  # 1: problems found (a 70B in float32 is over an H100's memory)
        raise SystemExit(f"{' '.join(argv[:4])} ... exited with {out.returncode}:\n{out.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    text = out.stdout.strip()
    return wall, cpu, json.loads(text[text.index("{"):])  # the CLI's --json is indented, the API's one line


def cli(rounds: int = 3, only: str = "l8,l70,l8t,l70t") -> None:
    """``torchdoctor simulate app.py:NAME --device cuda:1`` against ``torchdoctor.simulate(app.NAME(), device=
    "cuda:1")``, each a whole fresh process as a user runs it, interleaved (the order flips each round): the Llama-3-8B
    width with 8 layers and the 80-layer 70B shape, both built on meta, as a bare model (placement only) and as a
    ``Target`` with 16 tokens (a forward). Medians of wall and CPU seconds."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "app.py"), "w", encoding="utf-8") as fh:
            fh.write(_APP)
        for name, what in (("l8", "8-layer Llama-3-8B width"), ("l70", "80-layer Llama-3-70B shape"),
                           ("l8t", "8-layer Llama-3-8B width, a 16-token forward"),
                           ("l70t", "80-layer Llama-3-70B shape, a 16-token forward")):
            if name not in only.split(","):
                continue
            runs: dict[str, list[tuple[float, float]]] = {"api": [], "cli": []}
            ops: dict[str, Any] = {}
            docs: dict[str, list[dict[str, Any]]] = {"api": [], "cli": []}
            argv = {"api": [sys.executable, "-c", _API, name],
                    "cli": [sys.executable, "-m", "torchdoctor", "simulate", f"app.py:{name}", "--device", "cuda:1",
                            "--json", "-q"]}
            for i in range(rounds):
                for key in (("api", "cli") if i % 2 == 0 else ("cli", "api")):
                    wall, cpu, doc = _timed(argv[key], folder)
                    runs[key].append((wall, cpu))
                    docs[key].append(doc)
                    ops[key] = (doc.get("ops"), sorted({p if isinstance(p, str) else p["kind"] for p in doc["problems"]}))
            # the same answer both ways (a 70B in float32 is over an H100's memory); the CLI's op count also holds
            # the TARGET's own ops (its factory runs on the virtual devices)
            assert ops["api"][1] == ops["cli"][1], ops
            med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
            print(f"{name} ({what}, on meta), {rounds} interleaved rounds, whole process: API {med['api'][0]:.1f} s wall"
                  f" / {med['api'][1]:.1f} s CPU, CLI {med['cli'][0]:.1f} s wall / {med['cli'][1]:.1f} s CPU: CLI/API "
                  f"x{med['cli'][0] / med['api'][0]:.2f} wall, x{med['cli'][1] / med['api'][1]:.2f} CPU; (ops, problem kinds) "
                  f"API {ops['api']}, CLI {ops['cli']}; "
                  f"per round (wall api/cli): " + ", ".join(f"{a[0]:.1f}/{c[0]:.1f}" for a, c in zip(runs["api"], runs["cli"])))
            print(f"  steps (medians): TARGET built API {_step(docs['api'], 'built_seconds')} / CLI "
                  f"{_step(docs['cli'], 'built_seconds')}; simulated API {_step(docs['api'], 'seconds')} / CLI "
                  f"{_step(docs['cli'], 'seconds')}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "cli":
        cli(int(sys.argv[2]) if len(sys.argv) > 2 else 3, *sys.argv[3:4])
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)))
        return
    which = sys.argv[1] if len(sys.argv) > 1 else "both"
    if which == "layers":
        layers()
        return
    sizes = list(SHAPES) if which == "both" else [which]
    for size in sizes:
        row = _child(size)
        ratio = row["simulate_s"] / row["plain_meta_forward_s"]
        print(f"Llama-3-{size.upper()}-shaped ({row['params'] / 1e9:.2f} B params on meta), {TOKENS} tokens, virtual "
              f"cuda:1: simulate {row['simulate_s']} s median (min {row['simulate_min_s']} s, first call "
              f"{row['first_s']} s), {row['ops']} ops checked; plain meta forward {row['plain_meta_forward_s']} s "
              f"(x{ratio:.2f}); peak RSS {row['peak_rss_mb']} MB")


if __name__ == "__main__":
    main()

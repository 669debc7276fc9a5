"""Throughput of ``torchdoctor.explain`` on a large synthetic log, and on adversarial text.

``python bench/explain.py --issue43 [MB] [rounds]`` prints only issue 43 point 5's two rates (a typical app log, a
log made only of error texts), measured interleaved with the grep-like baseline in one process.
``python bench/explain.py --errors [rounds] [MB ...]`` prints explain on three logs made only of error texts (repeated
exactly, alike with varying line numbers and shapes, alike with a time stamp on every line) at 4 and 16 MB against
the grep-like pass on the same text.
``--stages [MB]``: where explain's time goes on the app log and those logs (reading, normalising, diagnoses).
``python bench/explain.py --growth [MB] [rounds]`` prints explain's growth from 1x to 4x the input on both logs
against the grep-like pass's (issue 43 point 6).
``python bench/explain.py --accuracy`` prints the held-out figures of issue 29 per category and source kind instead;
``--golden`` rewrites ``tests/explain/golden_50mb.json``, the diagnoses of the 50 MB log that
``tests/explain/test_speed_findings.py`` holds every change to (only when the tables change on purpose).

Prints MB/s for: a 50 MB training/inference log with a few hundred real errors in it (as a str, and streamed from a
file through the CLI path), a log a tenth that size made only of real error texts, and strings built to trip regex
engines (runs of "(", ":", spaces, repeated anchors). Target (issue 28): >= 80 MB/s in process on the log, linear on
adversarial input. The machine is shared: the grep-like baseline, run interleaved, shows how busy it was.
"""

from __future__ import annotations

import os
import pathlib
import random
import re
import statistics
import sys
import tempfile
import time

from torchdoctor._explain import api as _explain
from torchdoctor._explain.api import explain

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "explain" / "fixtures"
NOISE = [
    "Epoch 3/10:  41%|████      | 412/1000 [02:13<03:10,  3.09it/s, loss=0.4121, lr=2.0e-05]",
    '  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1553, in _wrapped_call_impl',
    "    return self._call_impl(*args, **kwargs)",
    "2025-01-26T17:16:01.147679 - model weight dtype torch.bfloat16, manual cast: None",
    "INFO:root:Loading checkpoint shards: 100%|████████| 2/2 [00:28<00:00, 14.45s/it] device=cuda:0",
    "\x1b[32m[rank0]\x1b[0m step 1200 tokens/s 18233.2 mem 21.3GiB (expected all good)",
    "WARNING: some weights of the model checkpoint were not used when initializing the model",
    "Requested to load FluxClipModel_ ... loaded completely 9.5367431640625e+25 4213.80517578125 True",
]


def synthetic_log(size: int, errors: int = 300, seed: int = 0) -> str:
    rng = random.Random(seed)
    bodies = [p.read_text(encoding="utf-8").partition("\n---\n")[2] for p in sorted(FIXTURES.glob("*.txt"))]
    parts: list[str] = []
    total = 0
    every = max(1, size // (errors * 100))
    i = 0
    while total < size:
        line = bodies[rng.randrange(len(bodies))] if i % every == 0 and i else NOISE[rng.randrange(len(NOISE))]
        parts.append(line)
        total += len(line) + 1
        i += 1
    return "\n".join(parts)[:size]


def error_log(size: int, seed: int = 0) -> str:
    """A log made only of real error texts (the fixtures' bodies one after another, drawn at random): every few
    hundred characters an anchor, the worst case for the per-hit work that a typical log, mostly noise, hides."""
    rng = random.Random(seed)
    bodies = [p.read_text(encoding="utf-8").partition("\n---\n")[2] for p in sorted(FIXTURES.glob("*.txt"))]
    parts: list[str] = []
    total = 0
    while total < size:
        body = bodies[rng.randrange(len(bodies))]
        parts.append(body)
        total += len(body) + 1
    return "\n".join(parts)[:size]


_LINE_NO = re.compile(r"(line )(\d+)")
_SHAPE = re.compile(r"\d+x\d+")


def alike_log(size: int, seed: int = 0, stamps: bool = False) -> str:
    """A log made only of real error texts that are alike but not equal, as a failing job's log is: the frames'
    line numbers and any ``NxM`` shapes differ from one repeat to the next, and (``stamps``) every line carries
    its own time stamp, as ComfyUI's log does. No paragraph repeats exactly, so nothing is read once and replayed."""
    rng = random.Random(seed)
    bodies = [p.read_text(encoding="utf-8").partition("\n---\n")[2] for p in sorted(FIXTURES.glob("*.txt"))]
    parts: list[str] = []
    total, t = 0, 0.0
    while total < size:
        body = _LINE_NO.sub(lambda m: m.group(1) + str(rng.randrange(1, 3000)), bodies[rng.randrange(len(bodies))])
        body = _SHAPE.sub(lambda m: f"{rng.randrange(1, 4096)}x{rng.randrange(1, 4096)}", body)
        if stamps:
            t += rng.random()
            body = "\n".join(f"2025-05-28T10:{int(t // 60) % 60:02d}:{t % 60:09.6f} - {ln}" for ln in body.split("\n"))
        parts.append(body)
        total += len(body) + 1
    return "\n".join(parts)[:size]


def error_rates(sizes: tuple[int, ...], rounds: int) -> None:
    """explain on the three logs made only of error texts (repeated exactly, alike, alike with time stamps) at each
    size, against the grep-like pass on the same text, interleaved in one process (process CPU time, medians)."""
    kinds = {"repeated": lambda n: error_log(n), "alike": lambda n: alike_log(n),
             "alike+stamps": lambda n: alike_log(n, stamps=True)}
    texts = {(k, n): make(n) for k, make in kinds.items() for n in sizes}
    times: dict[tuple[str, str, int], list[float]] = {}
    for r in range(rounds):
        for key in sorted(texts, reverse=bool(r % 2)):
            for name, fn in (("explain", explain), ("grep", grep_baseline)):
                t = time.process_time()
                fn(texts[key])
                times.setdefault((name, *key), []).append(time.process_time() - t)
    for key in sorted(texts):
        ex, gr = statistics.median(times[("explain", *key)]), statistics.median(times[("grep", *key)])
        mb = len(texts[key]) / 1e6
        print(f"error texts ({key[0]}), {mb:5.1f} MB: explain {mb / ex:6.1f} MB/s ({ex:.3f} s), grep-like pass "
              f"{mb / gr:6.1f} MB/s; explain/grep time x{ex / gr:.1f} (median of {rounds})")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")


_BAR = "\u2588"


def app_log(size: int, seed: int = 0) -> str:
    """A typical app log (issue 43, point 5): what ComfyUI or kohya's sd-scripts write while they work. Every line is
    its own (time stamps, tqdm counters redrawn with carriage returns, loss and memory figures), unlike
    ``synthetic_log``'s eight noise lines, so nothing is read once and counted many times; a real error text (a
    fixture) every 100-300 KB, as a queue of prompts or a training run hits one now and then."""
    rng = random.Random(seed)
    bodies = [p.read_text(encoding="utf-8").partition("\n---\n")[2] for p in sorted(FIXTURES.glob("*.txt"))]
    parts: list[str] = []
    total, next_error, t = 0, rng.randrange(100_000, 300_000), 0.0
    while total < size:
        t += rng.random()
        stamp = f"2025-05-28T{int(t // 3600) % 24:02d}:{int(t // 60) % 60:02d}:{t % 60:09.6f}"
        kind = rng.randrange(10)
        if total >= next_error:
            line = bodies[rng.randrange(len(bodies))]
            next_error = total + rng.randrange(100_000, 300_000)
        elif kind < 5:  # a progress bar redrawn in place: a dozen states in one line, joined by \r
            steps = rng.choice((20, 25, 30, 1000))
            n = rng.randrange(0, steps - 1)
            states = []
            for i in range(n, min(steps, n + 12)):
                done = int(20 * i / steps)
                states.append(f"{100 * i // steps:3d}%|{_BAR * done}{' ' * (20 - done)}| {i}/{steps} "
                              f"[{int(t) // 60:02d}:{int(t) % 60:02d}<00:{rng.randrange(60):02d}, "
                              f"{rng.uniform(0.5, 9):.2f}it/s, loss={rng.uniform(0.01, 0.9):.4f}]")
            line = "\r".join(states)
        elif kind < 7:
            line = (f"{stamp} - Requested to load {rng.choice(('SDXL', 'Flux', 'AutoencodingEngine', 'WanTEModel'))}"
                    f"\n{stamp} - loaded completely {rng.uniform(0, 24000):.4f} {rng.uniform(100, 12000):.4f} True")
        elif kind < 9:
            line = (f"steps: {rng.randrange(10_000)} epoch {rng.randrange(30)} avr_loss={rng.uniform(0, 1):.5f} "
                    f"lr={rng.uniform(1e-6, 1e-4):.2e} mem {rng.uniform(2, 23):.1f}GiB device=cuda:0")
        else:
            line = f"{stamp} - Prompt executed in {rng.uniform(0.5, 300):.2f} seconds"
        parts.append(line)
        total += len(line) + 1
    return "\n".join(parts)[:size]


def issue43(size: int, rounds: int) -> tuple[float, float, float]:
    """Issue 43 point 5, measured interleaved in one process (process CPU time, median of ``rounds``): explain on
    a typical app log (``app_log``) and on a log made only of real error texts (``error_log``), and the grep-like
    baseline on the app log (how busy the machine was). Returns MB/s: app log, error texts, baseline."""
    app, errors = app_log(size), error_log(max(1, size // 5))
    times: dict[str, list[float]] = {"app": [], "errors": [], "grep": []}
    for _ in range(rounds):
        for name, fn, text in (("grep", grep_baseline, app), ("app", explain, app), ("errors", explain, errors)):
            t = time.process_time()
            fn(text)
            times[name].append(time.process_time() - t)
    app_mbs = len(app) / 1e6 / statistics.median(times["app"])
    err_mbs = len(errors) / 1e6 / statistics.median(times["errors"])
    base = len(app) / 1e6 / statistics.median(times["grep"])
    print(f"issue 43 point 5 ({rounds} interleaved rounds): typical app log {app_mbs:.1f} MB/s (target >= 200), "
          f"error texts only {err_mbs:.1f} MB/s (target >= 60); grep-like baseline {base:.1f} MB/s "
          f"(explain takes {base / app_mbs:.2f}x and {base / err_mbs:.1f}x its time); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    return app_mbs, err_mbs, base


def growth(size: int, rounds: int) -> dict[str, float]:
    """Issue 43 point 6: explain's time at 4x the input over its time at 1x, on the typical app log and on the log
    made only of error texts, against the grep-like pass's growth on the same texts (interleaved rounds, process
    CPU time, medians). Linear growth reads ~4.0 and a ratio to grep's growth of ~1.0; a log of errors repeats a
    few hundred distinct errors, each diagnosed once, so its growth may read under 4."""
    texts = {("app", 1): app_log(size), ("app", 4): app_log(4 * size),
             ("errors", 1): error_log(max(1, size // 5)), ("errors", 4): error_log(max(1, 4 * size // 5))}
    times: dict[tuple[str, str, int], list[float]] = {}
    for r in range(rounds):
        order = sorted(texts, reverse=bool(r % 2))
        for key in order:
            for name, fn in (("explain", explain), ("grep", grep_baseline)):
                t = time.process_time()
                fn(texts[key])
                times.setdefault((name, *key), []).append(time.process_time() - t)
    out: dict[str, float] = {}
    for kind in ("app", "errors"):
        med = {(n, s): statistics.median(times[(n, kind, s)]) for n in ("explain", "grep") for s in (1, 4)}
        g_ex, g_grep = med[("explain", 4)] / med[("explain", 1)], med[("grep", 4)] / med[("grep", 1)]
        out[kind] = g_ex / g_grep
        print(f"issue 43 point 6, explain on the {kind} log ({len(texts[(kind, 1)]) / 1e6:.1f} -> "
              f"{len(texts[(kind, 4)]) / 1e6:.1f} MB, {rounds} interleaved rounds): time x{g_ex:.2f} at 4x "
              f"(grep-like pass x{g_grep:.2f}); growth over grep's x{g_ex / g_grep:.2f} (goal <= 1.1)")
    return out


def stages(size: int) -> None:
    """Where explain's time goes, CPU time: reading (``Scanner.read``: passes, lines, hits, replays), and within it
    the first reading of each distinct paragraph of a log dense with errors (``chunks._record``: what a replay
    cannot spare), then the diagnoses (one per distinct error, the rest of what a log of errors costs once)."""
    from torchdoctor._explain import api, chunks, scanner
    spent: dict[str, float] = {}
    stages_ = ((scanner.Scanner, "read", "reading"), (chunks, "_record", "of it first readings"),
               (scanner, "normalise", "normalising"), (api, "_diagnose", "diagnoses"))
    order = [label for _, _, label in stages_]
    for owner, name, label in stages_:
        def wrapper(*args, _fn=getattr(owner, name), _label=label, **kwargs):  # type: ignore[no-untyped-def]
            t = time.process_time()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.process_time() - t
        setattr(owner, name, wrapper)
    for label, text in (("app log", app_log(size)), ("error texts", error_log(size)), ("alike", alike_log(size)),
                        ("alike+stamps", alike_log(size, stamps=True))):
        explain(text)  # warm: each text's memos start empty anyway
        t, _ = time.process_time(), spent.clear()
        n, total = len(explain(text)), time.process_time() - t
        print(f"{label:<13} {len(text) / 1e6:5.1f} MB {total * 1e3:5.0f} ms ({len(text) / 1e6 / total:5.1f} MB/s, {n} "
              f"diagnoses): " + ", ".join(f"{k} {spent[k] * 1e3:.0f} ms" for k in order if k in spent)
              + f"; load average {os.getloadavg()[0]:.1f}")


def rate(label: str, text_len: int, fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    mbs = text_len / 1e6 / dt
    print(f"{label:<44} {text_len / 1e6:7.1f} MB {dt:7.2f} s {mbs:8.1f} MB/s  diagnoses={len(out)}")
    return mbs


def grep_baseline(text: str) -> list[str]:
    """The cheapest useful pass over a log in Python: the lines that mention an error (what `grep Error` does)."""
    return [ln for ln in text.split("\n") if "Error" in ln]


def per_anchor_passes(text: str) -> int:
    """What the scanner did before the one-pass prefilter: a lower-cased copy, then one str.find pass per anchor."""
    from torchdoctor._explain.scanner import _anchor_table

    low, n = text.lower(), 0
    for anchor in _anchor_table()[0].anchors:
        p = low.find(anchor)
        while p != -1:
            n += 1
            nl = low.find("\n", p, p + 2000)
            p = low.find(anchor, nl + 1 if nl != -1 else p + 2000)
    return n


def interleaved(log: str, rounds: int) -> tuple[float, float, float]:
    """Median CPU seconds of explain, of the grep baseline and of the old per-anchor passes alone, run alternately
    so machine noise hits all alike."""
    ex: list[float] = []
    base: list[float] = []
    old: list[float] = []
    for _ in range(rounds):
        for fn, out in ((grep_baseline, base), (explain, ex), (per_anchor_passes, old)):
            t = time.process_time()
            fn(log)
            out.append(time.process_time() - t)
    return statistics.median(ex), statistics.median(base), statistics.median(old)


def _kind(source: str, body: str) -> str:
    """The kind of a text's source, by keywords (rough: an app's log quoted in a GitHub issue counts as the app)."""
    low = body.lower() + " " + source.lower()
    if source.startswith(("http://", "https://")):
        return "forum/blog page"
    if any("\u4e00" <= ch <= "\u9fff" for ch in body):
        return "Chinese paste"
    if "comfy" in low:
        return "ComfyUI log"
    if any(w in low for w in ("sd.next", "automatic", "stable-diffusion-webui", "forge", "a1111")):
        return "SD.Next/A1111/Forge"
    if "invoke" in low:
        return "InvokeAI"
    return "GitHub issue"


def accuracy() -> int:
    """Held-out figures of issue 29, per category and per source kind (the texts are never tuned on)."""
    from collections import defaultdict

    held = sorted((FIXTURES.parent / "holdout").glob("*.txt"))
    rows: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    kinds: dict[str, list[bool]] = defaultdict(list)
    for path in held:
        head, _, body = path.read_text(encoding="utf-8").partition("\n---\n")
        meta = dict(line[2:].partition(": ")[::2] for line in head.splitlines())
        found = explain(body)
        ranked = [found[0].category] + [a.category for a in found[0].alternatives] if found else []
        one, two = ranked[:1] == [meta["category"]], meta["category"] in ranked[:2]
        rows[meta["category"]].append((one, two))
        kinds[_kind(meta["source"], body)].append(one)
        if not one:
            print(f"  miss: {path.name}: {ranked[:2]}")
    n = sum(len(v) for v in rows.values())
    print(f"held-out {n} texts: top-1 {sum(o for v in rows.values() for o, _ in v) / n:.1%}, "
          f"top-2 {sum(t for v in rows.values() for _, t in v) / n:.1%}")
    for cat, v in sorted(rows.items()):
        print(f"  {cat:<28} n={len(v):3d} top-1 {sum(o for o, _ in v) / len(v):6.1%} top-2 {sum(t for _, t in v) / len(v):6.1%}")
    for kind, k in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        print(f"  {kind:<28} n={len(k):3d} top-1 {sum(k) / len(k):6.1%}")
    return 0


def golden() -> int:
    """Write the diagnoses of the 50 MB log (category, signature, count, what happened) for the findings test."""
    import json

    rows = sorted([d.category, d.signature, d.count, d.what_happened] for d in explain(synthetic_log(50_000_000)))
    path = FIXTURES.parent / "golden_50mb.json"
    path.write_text(json.dumps(rows, indent=0), encoding="utf-8")
    print(f"{len(rows)} diagnoses written to {path}")
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--accuracy"]:
        return accuracy()
    if sys.argv[1:2] == ["--golden"]:
        return golden()
    if sys.argv[1:2] == ["--issue43"]:  # only the two rates of issue 43 point 5: [size in MB] [rounds]
        size = int(float(sys.argv[2]) * 1e6) if len(sys.argv) > 2 else 20_000_000
        explain("warm up")
        issue43(size, int(sys.argv[3]) if len(sys.argv) > 3 else 5)
        return 0
    if sys.argv[1:2] == ["--errors"]:  # the error-only logs at 4 and 16 MB (or the sizes given): [rounds] [MB ...]
        explain("warm up")
        rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
        error_rates(tuple(int(float(a) * 1e6) for a in sys.argv[3:]) or (4_000_000, 16_000_000), rounds)
        return 0
    if sys.argv[1:2] == ["--stages"]:  # where the time goes: [size in MB]
        stages(int(float(sys.argv[2]) * 1e6) if len(sys.argv) > 2 else 8_000_000)
        return 0
    if sys.argv[1:2] == ["--growth"]:  # issue 43 point 6: [size in MB at 1x] [rounds]
        explain("warm up")
        growth(int(float(sys.argv[2]) * 1e6) if len(sys.argv) > 2 else 5_000_000,
               int(sys.argv[3]) if len(sys.argv) > 3 else 5)
        return 0
    size = int(float(sys.argv[1]) * 1e6) if len(sys.argv) > 1 else 50_000_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    log = synthetic_log(size)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}")
    explain("warm up")
    ex, base, old = interleaved(log, rounds)
    best = len(log) / 1e6 / ex
    print(f"synthetic log: explain {best:.1f} MB/s (CPU time), grep-like baseline {len(log) / 1e6 / base:.1f} MB/s, "
          f"explain/baseline time ratio {ex / base:.2f}; the old per-anchor passes alone "
          f"{len(log) / 1e6 / old:.1f} MB/s (median of {rounds} interleaved rounds)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "train.log")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(log)

        def from_file():  # type: ignore[no-untyped-def]
            with open(path, encoding="utf-8", errors="replace", newline=None) as fh:
                return _explain.explain_stream(fh)

        rate("synthetic log (streamed from file)", len(log), from_file)
    errors = error_log(max(1, size // 10))
    times = []
    for _ in range(rounds):
        t = time.process_time()
        found = explain(errors)
        times.append(time.process_time() - t)
    err_rate = len(errors) / 1e6 / statistics.median(times)
    print(f"log of error texts only: explain {err_rate:.1f} MB/s (CPU time, median of {rounds}), "
          f"{len(errors) / 1e6:.1f} MB, diagnoses={len(found)} (issue 43 target >= 60 MB/s)")
    issue43(max(1, size // 2), rounds)
    n = 5_000_000
    for label, text in [
        ("adversarial: '(' * 5M", "(" * n),
        ("adversarial: ':' * 5M", ":" * n),
        ("adversarial: ' ' * 5M", " " * n),
        ("adversarial: 'Input type (' repeated", ("Input type (" * (n // 12))),
        ("adversarial: anchor lines repeated", ("Expected all tensors to be on the same device, but found at least "
                                                "two devices, cuda:0 and \n") * (n // 80)),
        ("adversarial: 'must have the same dtype' no spaces", ("a" * 200 + " and must have the same dtype") * (n // 230)),
    ]:
        rate(label, len(text), lambda t=text: explain(t))  # type: ignore[misc]
    target = 80.0
    print(f"log throughput {best:.1f} MB/s (target >= {target:.0f} MB/s on an idle machine): "
          f"{'OK' if best >= target else 'BELOW TARGET (see the load average and the baseline ratio)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build and forward times of every test-zoo entry (tests/support/zoo.py), and the cost of the read-only fingerprint.

Run: .venv/bin/python bench/zoo_build.py   (prints a markdown table; best of 7, CPU, no_grad)
Best-of rather than median: the machine is shared, and a median of a 1 ms forward still picks up other jobs.
The first build of each family also pays the library import; that one-off cost is printed separately.
"""

from __future__ import annotations

import os
import sys
import time

for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "DIFFUSERS_OFFLINE"):
    os.environ.setdefault(var, "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))

import torch  # noqa: E402

import helpers  # noqa: E402
import zoo  # noqa: E402

REPEATS = 7


def best_ms(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


def main() -> None:
    cold = time.perf_counter()
    for name in zoo.NAMES:  # pays every import once
        zoo.build(name)
    print(f"first pass over all {len(zoo.NAMES)} entries (imports included): {time.perf_counter() - cold:.1f} s\n")
    print("| entry | kind | params | build fp32 ms | fwd fp32 ms | build bf16 ms | fwd bf16 ms | fingerprint bf16 ms |")
    print("|---|---|---|---|---|---|---|---|")
    total = {"build": 0.0, "fwd": 0.0}
    for name in zoo.NAMES:
        row = []
        for dtype in (torch.float32, torch.bfloat16):
            build_ms = best_ms(lambda: zoo.build(name, dtype))
            built = zoo.build(name, dtype)
            with torch.no_grad():
                fwd_ms = best_ms(built.run)
            row += [build_ms, fwd_ms]
            total["build"] += build_ms
            total["fwd"] += fwd_ms
        fp_ms = best_ms(lambda: helpers.fingerprint(built.obj))
        modules = [m for m in getattr(built.obj, "components", {}).values() if isinstance(m, torch.nn.Module)]
        params = sum(p.numel() for m in (modules or [built.obj]) for p in m.parameters())
        print(f"| {name} | {built.kind} | {params:,} | " + " | ".join(f"{v:.1f}" for v in row) + f" | {fp_ms:.1f} |")
    print(f"\nwhole zoo, fp32 + bf16, warm: build {total['build'] / 1000:.2f} s, forward {total['fwd'] / 1000:.2f} s")


if __name__ == "__main__":
    main()

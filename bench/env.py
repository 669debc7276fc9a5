"""env / devices speed: what `torchdoctor env` costs apart from `import torch`.

Prints medians (interleaved rounds, torch already imported) of: collect_facts() and its parts, run_rules on the
collected facts, the device choice (live and from facts), env_report() end to end, and the capability probe
(first call per device, then cached). Target (issue 7): collect_facts() well under a second apart from import torch.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROUNDS = 15


def import_torch_seconds() -> float:
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout) for _ in range(3)]
    return statistics.median(runs)


def cli_seconds() -> float:
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "torchdoctor", "env", "--json"], capture_output=True, check=False)
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def main() -> None:
    cold = import_torch_seconds()
    cli = cli_seconds()
    import torch

    from torchdoctor._env import devices as _devices
    from torchdoctor._env import report as _env
    from torchdoctor._env import facts as _env_facts
    from torchdoctor._env.rules import registry as _env_rules

    facts = _env.collect_facts()
    cases: dict[str, Callable[[], object]] = {
        "collect_facts()": _env.collect_facts,
        "  installed distributions": _env_facts._packages,
        "  device inventory": lambda: _env_facts._inventory("/", [], False),
        "run_rules(facts)": lambda: _env_rules.run_rules(facts),
        "choose_device() (live)": _devices.choose_device,
        "choose_device(facts=...)": lambda: _devices.choose_device(facts=facts),
        "env_report() (capabilities cached)": _env.env_report,
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(ROUNDS):
        for name, fn in cases.items():  # interleaved, so drift hits every case alike
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    _devices._CACHE.clear()
    t = time.perf_counter()
    caps = _devices.capabilities("cpu")
    first_probe = time.perf_counter() - t
    t = time.perf_counter()
    _devices.capabilities("cpu")
    cached = time.perf_counter() - t

    print(f"torch {torch.__version__}, {ROUNDS} interleaved rounds, medians; {len(facts['packages'])} distributions installed")
    print(f"import torch (fresh interpreter, median of 3): {cold * 1000:.0f} ms")
    print(f"`python -m torchdoctor env --json` end to end (fresh, median of 3): {cli * 1000:.0f} ms")
    for name, runs in times.items():
        print(f"{name:<36} {statistics.median(runs) * 1000:8.2f} ms")
    n_ops = sum(len(row) for row in caps["dtypes"].values())
    print(f"{'capabilities(cpu), first probe':<36} {first_probe * 1000:8.2f} ms ({n_ops} small ops)")
    print(f"{'capabilities(cpu), cached':<36} {cached * 1000:8.2f} ms")
    ratio = statistics.median(times["collect_facts()"]) / cold
    print(f"collect_facts() / import torch: {ratio:.3f}")


if __name__ == "__main__":
    main()

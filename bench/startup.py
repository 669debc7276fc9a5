"""What ``torchdoctor run`` and an empty ``virtual_devices`` block add to a program's start (issue 43 point 4: < 50 ms).

    python bench/startup.py [--rounds N] [--cold] [--top K] [--json]

Five fresh processes per round, interleaved (a round runs each once, in a rotated order, so load that comes and
goes falls on every command alike):

- ``python app.py`` where ``app.py`` is ``import torch`` (the anchor: a program that uses torch);
- ``python -m torchdoctor run app.py`` (the same program, watched), and with ``--no-trace`` (what the trace's
  import and patches cost);
- ``python block.py``: ``import torch; import torchdoctor; with torchdoctor.virtual_devices("cuda:1"): pass``;
- ``python -c "import torch; import torchdoctor"`` (the package's own import).

Each is timed by its process CPU time (user + system, from ``resource.getrusage(RUSAGE_CHILDREN)``) and wall
time; the table gives each command's median and minimum and the median of the per-round differences to the
anchor. The start itself is also read inside each process, where other processes' load cannot reach it: the
program prints ``time.process_time()`` once ``import torch`` is done (``app.py``), and the block prints the CPU
time of ``import torchdoctor`` plus the empty block; "start" is that number, "start - anchor" its median per-round
difference to ``python app.py``'s (what ``run`` adds before the program's first line). Then ``python -X importtime`` of ``run`` and of the block: the modules beyond ``import torch``'s, each
with its minimum self time over the rounds (under load a median is mostly other processes' time slices) and the
module that imported it. ``--cold``: every process compiles what it imports (a fresh ``PYTHONPYCACHEPREFIX`` per
process), as a checkout or a wheel installed without bytecode starts the first time; otherwise bytecode is cached
(one warm-up run first).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # bench/trace.py shadows stdlib trace

APP = "import sys, time\nimport torch\nsys.stderr.write(f'TD_START {time.process_time()}\\n')\n"
BLOCK = ("import sys, time\nimport torch\nt0 = time.process_time()\nimport torchdoctor\n"
         "with torchdoctor.virtual_devices(\"cuda:1\"):\n    pass\n"
         "sys.stderr.write(f'TD_START {time.process_time() - t0}\\n')\n")
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def _commands(folder: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {"python app.py": [py, str(folder / "app.py")],
            "torchdoctor run app.py": [py, "-m", "torchdoctor", "run", str(folder / "app.py")],
            "run --no-trace app.py": [py, "-m", "torchdoctor", "run", "--no-trace", str(folder / "app.py")],
            "virtual_devices block": [py, str(folder / "block.py")],
            "import torchdoctor": [py, "-c", "import torch; import torchdoctor"]}


def _env(cold: bool, prefix: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    if not cold:  # a shell with PYTHONDONTWRITEBYTECODE=1 would make every "cached" process compile everything
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="td-pyc-") if cold else prefix
    return env


def _timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """(process CPU seconds, wall seconds, stderr) of one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, proc.stderr


def _importtime(text: str) -> dict[str, tuple[int, str]]:
    """module -> (self microseconds, the module that imported it) from ``-X importtime`` output."""
    out: dict[str, tuple[int, str]] = {}
    stack: list[tuple[int, str]] = []  # (depth, module) of the imports still open, innermost last
    rows = [(int(m.group(1)), len(m.group(3)), m.group(4)) for m in map(_LINE.match, text.splitlines()) if m]
    # importtime prints a module when its import ends: its children come before it, one level deeper
    for self_us, depth, name in reversed(rows):
        while stack and stack[-1][0] >= depth:
            stack.pop()
        out[name] = (self_us, stack[-1][1] if stack else "")
        stack.append((depth, name))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cold", action="store_true", help="compile every import in every process (no bytecode)")
    ap.add_argument("--top", type=int, default=15, help="modules to list per command")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-modules", action="store_true", help="skip the -X importtime listing (the timed rounds only)")
    args = ap.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="td-startup-"))
    (folder / "app.py").write_text(APP, encoding="utf-8")
    (folder / "block.py").write_text(BLOCK, encoding="utf-8")
    prefix = tempfile.mkdtemp(prefix="td-pyc-")
    cmds = _commands(folder)
    names = list(cmds)
    if not args.cold:
        for cmd in cmds.values():  # bytecode written once, then reused
            _timed(cmd, _env(False, prefix), folder)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    start: dict[str, list[float]] = {n: [] for n in names}  # CPU seconds read inside the process (TD_START)
    for r in range(args.rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            c, w, err = _timed(cmds[n], _env(args.cold, prefix), folder)
            cpu[n].append(c)
            wall[n].append(w)
            got = re.findall(r"TD_START ([0-9.]+)", err)
            if got:
                start[n].append(float(got[0]))
    anchor = names[0]
    rows = []
    for n in names:
        diffs = [a - b for a, b in zip(cpu[n], cpu[anchor])]
        row = {"command": n, "cpu_median_s": statistics.median(cpu[n]), "cpu_min_s": min(cpu[n]),
               "wall_median_s": statistics.median(wall[n]),
               "cpu_minus_anchor_median_ms": 1000 * statistics.median(diffs)}
        if start[n]:
            row["start_median_ms"] = 1000 * statistics.median(start[n])
            if n == "virtual_devices block":  # read after `import torch`: the block's own cost already
                row["start_minus_anchor_median_ms"] = row["start_median_ms"]
            elif start[anchor] and len(start[n]) == len(start[anchor]):
                row["start_minus_anchor_median_ms"] = 1000 * statistics.median(
                    [a - b for a, b in zip(start[n], start[anchor])])
        rows.append(row)
    # what each imports beyond `import torch`, minimum self time over the rounds
    modules: dict[str, dict[str, tuple[int, str]]] = {}
    for n in () if args.no_modules else ("torchdoctor run app.py", "virtual_devices block"):
        seen: dict[str, tuple[int, str]] = {}
        for _ in range(args.rounds):
            base = _importtime(_timed([sys.executable, "-X", "importtime", "-c", "import torch"],
                                      _env(args.cold, prefix), folder)[2])
            got = _importtime(_timed([sys.executable, "-X", "importtime", *cmds[n][1:]], _env(args.cold, prefix),
                                     folder)[2])
            for mod, (us, parent) in got.items():
                if mod not in base:
                    seen[mod] = (min(us, seen[mod][0]) if mod in seen else us, parent)
        modules[n] = seen
    if args.json:
        print(json.dumps({"rounds": args.rounds, "cold": args.cold, "rows": rows,
                          "modules": {n: {m: list(v) for m, v in d.items()} for n, d in modules.items()}}, indent=1))
        return 0
    print(f"{args.rounds} interleaved rounds, {'no bytecode (cold)' if args.cold else 'bytecode cached'}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'command':26} {'cpu median':>11} {'cpu min':>9} {'wall median':>12} {'cpu - anchor':>13} "
          f"{'start - anchor (in-process)':>28}")
    for row in rows:
        added = row.get("start_minus_anchor_median_ms")
        print(f"{row['command']:26} {row['cpu_median_s']:10.3f}s {row['cpu_min_s']:8.3f}s "
              f"{row['wall_median_s']:11.3f}s {row['cpu_minus_anchor_median_ms']:10.0f} ms "
              f"{'' if added is None else f'{added:25.1f} ms'}")
    for n, seen in modules.items():
        total = sum(us for us, _ in seen.values()) / 1000
        print(f"\n{n}: {len(seen)} modules beyond `import torch`, minimum self times sum to {total:.1f} ms")
        for mod, (us, parent) in sorted(seen.items(), key=lambda kv: -kv[1][0])[:args.top]:
            print(f"  {us / 1000:7.1f} ms  {mod}  (from {parent or '-'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

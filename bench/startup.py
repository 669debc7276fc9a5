"""What ``torchdoctor run`` and an empty ``virtual_devices`` block add to a program's start (issue 43 point 4: < 50 ms).

    python bench/startup.py [--rounds N] [--cold] [--top K] [--json]

Five fresh processes per round, interleaved (a round runs each once, in a rotated order, so load that comes and
goes falls on every command alike):

- ``python app.py`` where ``app.py`` is ``import torch`` (the anchor: a program that uses torch);
- ``python -m torchdoctor run app.py`` (the same program, watched), and with ``--no-trace`` (what the trace's
  import and patches cost);
- ``python block.py``: ``import torch; import torchdoctor; with torchdoctor.virtual_devices("cuda:1"): pass``;
- ``python -c "import torch; import torchdoctor"`` (the package's own import);
- ``python app.py`` again (``app.py (again)``: the anchor against itself, the noise floor of a per-round difference).

``--after-torch``: three commands only, each reading its start once ``import torch`` is done in its own process
(torch, then ``runpy`` runs ``torchdoctor run app.py`` or ``app.py``; the block as above), so the number is what
torchdoctor adds before the program's first line without the noise of a whole ``import torch``. With ``--model``
(or ``--only-model``) too: the model programs, started once torch and its DTensor module are imported (what
transformers, diffusers and peft import themselves), "start" read at their last line: what a block and
``run --device`` cost beyond torch's floor.

``--model`` adds a second set, a program that builds a 3-layer MLP and runs it once (``model.py``, the anchor of
these rows): the same program with the forward in a ``virtual_devices("cuda:1")`` block (``model block``), run as
``torchdoctor run --device cuda:1 model.py`` (``run --device model.py``), and ``floor.py``: the plain program plus
one op on a 10-line ``__torch_dispatch__`` wrapper subclass, no torchdoctor. torch's first dispatch to any such
subclass asks whether it is a DTensor, which imports ``torch.distributed.tensor`` (and sympy through it) once per
process: what a block running a model pays beyond the floor is torchdoctor's own. For these programs "start" is the
CPU time at their last line.

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
# torch imported first, then the CPU time read, then ``python -m torchdoctor run app.py`` / ``python app.py`` as
# runpy runs them: "start" is then what runs before the program's first line, apart from `import torch` (the
# largest and noisiest part of a start, which `run` imports for the program anyway)
AFTER_TORCH = ("import sys, time, runpy\nimport torch\nsys.stderr.write(f'TD_T0 {time.process_time()}\\n')\n"
               "app = sys.argv[1]\n")
# the same once torch's DTensor module is imported too (what transformers, diffusers and peft import themselves):
# what a block or `run --device` adds beyond torch's first subclass dispatch
AFTER_FLOOR = AFTER_TORCH.replace("import torch\n", "import torch, torch.distributed.tensor\n")
RUN_DEVICE_AFTER = AFTER_FLOOR + ("sys.argv = ['torchdoctor', 'run', '--device', 'cuda:1', app]\n"
                                  "runpy.run_module('torchdoctor', run_name='__main__', alter_sys=True)\n")
MODEL_AFTER = AFTER_FLOOR + "sys.argv = [app]\nrunpy.run_path(app, run_name='__main__')\n"
RUN_AFTER = AFTER_TORCH + ("sys.argv = ['torchdoctor', 'run', app]\n"
                           "runpy.run_module('torchdoctor', run_name='__main__', alter_sys=True)\n")
APP_AFTER = AFTER_TORCH + "sys.argv = [app]\nrunpy.run_path(app, run_name='__main__')\n"
MODEL_BODY = ("m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))\n"
              "x = torch.randn(4, 32)\n")
MODEL = ("import sys, time\nimport torch\n" + MODEL_BODY + "dev = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
         "y = m.to(dev)(x.to(dev)).sum()\nsys.stderr.write(f'TD_START {time.process_time()}\\n')\n")
MODEL_BLOCK = ("import sys, time\nimport torch\n" + MODEL_BODY + "import torchdoctor\n"
               "with torchdoctor.virtual_devices(\"cuda:1\"):\n    y = m.to('cuda:1')(x.to('cuda:1')).sum()\n"
               "sys.stderr.write(f'TD_START {time.process_time()}\\n')\n")
FLOOR = ("import sys, time\nimport torch\n" + MODEL_BODY + "y = m(x).sum()\n"
         "class W(torch.Tensor):\n"
         "    @staticmethod\n"
         "    def __new__(cls, e):\n"
         "        return torch.Tensor._make_wrapper_subclass(cls, e.shape, dtype=e.dtype, device=e.device)\n"
         "    @classmethod\n"
         "    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):\n"
         "        return func(*[torch.zeros(a.shape) if isinstance(a, W) else a for a in args])\n"
         "z = W(x) + 1\nsys.stderr.write(f'TD_START {time.process_time()}\\n')\n")
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def _commands(folder: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {"python app.py": [py, str(folder / "app.py")],
            "torchdoctor run app.py": [py, "-m", "torchdoctor", "run", str(folder / "app.py")],
            "run --no-trace app.py": [py, "-m", "torchdoctor", "run", "--no-trace", str(folder / "app.py")],
            "virtual_devices block": [py, str(folder / "block.py")],
            "import torchdoctor": [py, "-c", "import torch; import torchdoctor"],
            "app.py (again)": [py, str(folder / "app.py")]}


def _after_torch_commands(folder: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {"app.py, after torch": [py, "-c", APP_AFTER, str(folder / "app.py")],
            "run app.py, after torch": [py, "-c", RUN_AFTER, str(folder / "app.py")],
            "virtual_devices block": [py, str(folder / "block.py")]}


def _model_after_commands(folder: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {"model.py, after floor": [py, "-c", MODEL_AFTER, str(folder / "model.py")],
            "model block, after floor": [py, "-c", MODEL_AFTER, str(folder / "model_block.py")],
            "run --device, after floor": [py, "-c", RUN_DEVICE_AFTER, str(folder / "model.py")]}


def _model_commands(folder: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {"python model.py": [py, str(folder / "model.py")],
            "model block": [py, str(folder / "model_block.py")],
            "run --device model.py": [py, "-m", "torchdoctor", "run", "--device", "cuda:1", str(folder / "model.py")],
            "floor (subclass op)": [py, str(folder / "floor.py")],
            "model.py (again)": [py, str(folder / "model.py")]}


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


def _quartiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[2]


def _rounds(cmds: dict[str, list[str]], rounds: int, cold: bool, prefix: str, folder: Path,
            relative: tuple[str, ...] = ()) -> list[dict[str, object]]:
    """Each command once a round, in a rotated order; rows against the first. ``relative``: commands whose start
    is read after ``import torch`` (their own cost already)."""
    names = list(cmds)
    if not cold:
        for cmd in cmds.values():  # bytecode written once, then reused
            _timed(cmd, _env(False, prefix), folder)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    start: dict[str, list[float]] = {n: [] for n in names}  # CPU seconds read inside the process (TD_START)
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            c, w, err = _timed(cmds[n], _env(cold, prefix), folder)
            cpu[n].append(c)
            wall[n].append(w)
            got = re.findall(r"TD_START ([0-9.]+)", err)
            t0 = re.findall(r"TD_T0 ([0-9.]+)", err)
            if got:
                start[n].append(float(got[0]) - (float(t0[0]) if t0 else 0.0))
    anchor = names[0]
    rows: list[dict[str, object]] = []
    for n in names:
        diffs = [a - b for a, b in zip(cpu[n], cpu[anchor])]
        row: dict[str, object] = {"command": n, "cpu_median_s": statistics.median(cpu[n]), "cpu_min_s": min(cpu[n]),
                                  "wall_median_s": statistics.median(wall[n]),
                                  "cpu_minus_anchor_median_ms": 1000 * statistics.median(diffs)}
        if start[n]:
            row["start_median_ms"] = 1000 * statistics.median(start[n])
            added = [1000 * x for x in start[n]] if n in relative else \
                [1000 * (a - b) for a, b in zip(start[n], start[anchor])] \
                if start[anchor] and len(start[n]) == len(start[anchor]) else []
            if added:
                row["start_minus_anchor_median_ms"] = statistics.median(added)
                row["start_minus_anchor_quartiles_ms"] = _quartiles(added)
        rows.append(row)
    return rows


def _print_rows(rows: list[dict[str, object]]) -> None:
    print(f"{'command':26} {'cpu median':>11} {'cpu min':>9} {'wall median':>12} {'cpu - anchor':>13} "
          f"{'start - anchor (in-process)':>28} {'quartiles':>17}")
    for row in rows:
        added = row.get("start_minus_anchor_median_ms")
        q = row.get("start_minus_anchor_quartiles_ms")
        print(f"{row['command']:26} {row['cpu_median_s']:10.3f}s {row['cpu_min_s']:8.3f}s "
              f"{row['wall_median_s']:11.3f}s {row['cpu_minus_anchor_median_ms']:10.0f} ms "
              f"{'' if added is None else f'{added:25.1f} ms'}"
              f"{'' if not q else f'  {q[0]:6.1f} .. {q[1]:6.1f}'}")  # type: ignore[index]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cold", action="store_true", help="compile every import in every process (no bytecode)")
    ap.add_argument("--top", type=int, default=15, help="modules to list per command")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-modules", action="store_true", help="skip the -X importtime listing (the timed rounds only)")
    ap.add_argument("--model", action="store_true", help="also the rows of a program that runs a model")
    ap.add_argument("--only-model", action="store_true", help="only the rows of a program that runs a model")
    ap.add_argument("--after-torch", action="store_true",
                    help="only what runs before the program's first line once torch is imported (run, the block)")
    args = ap.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="td-startup-"))
    for name, text in (("app.py", APP), ("block.py", BLOCK), ("model.py", MODEL), ("model_block.py", MODEL_BLOCK),
                       ("floor.py", FLOOR)):
        (folder / name).write_text(text, encoding="utf-8")
    prefix = tempfile.mkdtemp(prefix="td-pyc-")
    cmds = _commands(folder)
    load = [os.getloadavg()[0]]
    after = args.after_torch
    rows = [] if args.only_model else _rounds(_after_torch_commands(folder) if after else cmds, args.rounds,
                                               args.cold, prefix, folder,
                                               ("virtual_devices block", "app.py, after torch",
                                                "run app.py, after torch"))
    model_rows = _rounds(_model_after_commands(folder) if after else _model_commands(folder), args.rounds,
                         args.cold, prefix, folder) if args.model or args.only_model else []
    load.append(os.getloadavg()[0])
    # what each imports beyond `import torch`, minimum self time over the rounds
    modules: dict[str, dict[str, tuple[int, str]]] = {}
    for n in () if args.no_modules or args.only_model or after else ("torchdoctor run app.py", "virtual_devices block"):
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
        print(json.dumps({"rounds": args.rounds, "cold": args.cold, "load": load, "rows": rows,
                          "model_rows": model_rows,
                          "modules": {n: {m: list(v) for m, v in d.items()} for n, d in modules.items()}}, indent=1))
        return 0
    print(f"{args.rounds} interleaved rounds, {'no bytecode (cold)' if args.cold else 'bytecode cached'}, "
          f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end")
    if rows:
        _print_rows(rows)
    if model_rows:
        print("\na program that runs a model (start: CPU time at its last line)")
        _print_rows(model_rows)
    for n, seen in modules.items():
        total = sum(us for us, _ in seen.values()) / 1000
        print(f"\n{n}: {len(seen)} modules beyond `import torch`, minimum self times sum to {total:.1f} ms")
        for mod, (us, parent) in sorted(seen.items(), key=lambda kv: -kv[1][0])[:args.top]:
            print(f"  {us / 1000:7.1f} ms  {mod}  (from {parent or '-'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

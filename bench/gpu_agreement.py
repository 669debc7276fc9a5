"""Agreement with real hardware: does what the virtual devices predict match what a real CUDA GPU does?

Run on a machine with a GPU, from a checkout (no install; torch >= 2.4, transformers, peft, accelerate):

    PYTHONPATH=src python bench/gpu_agreement.py --out DIR

Every case of the zoo (``gpu_agreement_cases.py``, ``gpu_agreement_models.py``) runs for real on ``cuda:0`` and is
predicted by ``simulate(..., "cuda:0", profile="h200")`` and ``virtual_devices``; guard (explain, strict, fix), scan,
move and trace run on the real model, explain on the real error, and guard's cost is timed on the real forward.
``DIR/gpu_agreement.json`` and ``DIR/gpu_agreement.md`` hold the side-by-side table. Exit 1 on any disagreement:

- ``missed``: the hardware raised where a prediction said ok;
- ``unjustified``: a prediction named a problem the hardware ran through, and the case gives no policy reason;
- ``culprit``: simulate named another tensor first than the one really off;
- ``guard_silent``: a real placement error that guard (explain mode) neither explained nor annotated;
- ``broken``: a tool raised instead of answering; ``machines``: simulate answered otherwise than on the CPU-only
  machine (``--compare-with`` that run's JSON).

``--device cpu-check`` needs no GPU: the real step runs on the CPU where that means something, the predictions
are judged against each case's declared hardware outcome, and every tool runs; ``--plant KIND`` adds a case whose
declared outcome is wrong on purpose, so the run must exit 1 (the suite's proof that the comparison bites).
See docs/gpu-agreement.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")

TARGET = "cuda:0"
PLANTS = ("missed", "unjustified", "culprit")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_agreement.json and gpu_agreement.md")
    ap.add_argument("--device", default=TARGET, help="cuda:N (the real run) or cpu-check (no GPU: the machinery)")
    ap.add_argument("--quick", action="store_true", help="only the cases marked quick (the suite's subset)")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--plant", choices=PLANTS, help="add a case whose declared outcome is wrong: must exit 1")
    ap.add_argument("--repeats", type=int, default=None, help="paired timings per case (default 20 on a GPU, 3 off)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="stop starting cases after this many seconds; the rest are listed as not run (exit 1)")
    ap.add_argument("--compare-with", default=None, help="a cpu-check run's JSON: its predictions must match these")
    return ap.parse_args(argv)


def usage(msg: str) -> int:
    print(f"gpu_agreement: {msg}", file=sys.stderr)
    return 2


def environment(device: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           "python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "device": device}
    for name in ("transformers", "peft", "accelerate"):
        try:  # read from the installed metadata: importing transformers only to print its version costs seconds
            env[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # said; the cases that need it then report broken
            env[name] = "missing"
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            env["driver"] = f"unknown ({type(exc).__name__})"
    return env


def select(args: argparse.Namespace) -> list[Any]:
    import gpu_agreement_cases as cases
    import gpu_agreement_models  # noqa: F401  (registers the model cases)

    chosen = [c for c in cases.CASES if not args.quick or c.quick]
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        known = {c.name: c for c in cases.CASES}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(usage(f"no case named {', '.join(unknown)}; known: {', '.join(known)}"))
        chosen = [known[n] for n in names]
    if args.plant:
        chosen.append(cases.PLANTED[f"planted_{args.plant}"])
    return chosen


def culprit_named(sim: dict[str, Any], culprit: str) -> bool:
    """simulate puts the culprits first: the declared culprit must be among them (or the first problem)."""
    first = sim.get("problems", [])[:max(1, sim.get("culprits", 0))]
    return any(p["path"] == culprit or culprit in p["tensors"] for p in first)


def really_off(case: Any, truth: dict[str, Any], device: str) -> bool:
    at = truth.get("culprit_at")
    if not at or at.get("device") is None:
        return False
    if case.kind == "device":
        import torch

        return torch.device(at["device"]) != torch.device(device)
    return True


def judge(case: Any, row: dict[str, Any], hardware: bool) -> list[str]:
    """The disagreements of one case. Off the GPU the declared outcome stands in for the hardware's."""
    raised = row["real"]["raises"] if hardware else case.expect == "raises"
    out: list[str] = []
    for tool in ("simulate", "virtual_devices"):
        pred = row[tool]
        if "broken" in pred:
            out.append(f"broken: {tool} raised {pred['broken']} at {pred['at']}")
        elif pred.get("raised") and not (
                row["real"]["raises"] and row["real"]["error"].split(":")[0] == pred["raised"].split(":")[0]
                or not hardware and raised and pred["problems"]):
            # the virtual runtime records placement problems and goes on: an exception out of the user's code is
            # the runtime failing the program, unless the real run raised the same (a check torch makes in Python,
            # as nn.LSTM's, raises on every device) or, off the GPU, the case is declared to raise and the run
            # named its problem first
            out.append(f"broken: the program raised {pred['raised']} under {tool}")
        elif raised and pred["ok"]:
            out.append(f"missed: the hardware raised, {tool} said ok")
        elif not raised and not pred["ok"] and not case.expected_policy_only:
            named = pred["problems"][0]["path"] if pred["problems"] else pred.get("raised")
            out.append(f"unjustified: {tool} named {named}, the hardware ran and the case gives no policy reason")
    sim = row["simulate"]
    if raised and case.culprit and "broken" not in sim and not sim["ok"]:
        off = really_off(case, row["real"], row["device"]) if hardware else True
        if off and not culprit_named(sim, case.culprit):
            out.append(f"culprit: {case.culprit} was off, simulate named {sim['problems'][0]['path']} first")
    ran_raised = row["real"]["raises"]
    if ran_raised and case.kind in ("device", "dtype"):
        g = row["guard"]["explain"]
        if "broken" not in g and g.get("raised") != "PlacementError" and not g.get("noted"):
            out.append(f"guard_silent: the real {case.kind} error was not explained ({g.get('headline')})")
    for name in ("strict", "fix"):
        if "broken" in row["guard"][name]:
            out.append(f"broken: guard {name} raised {row['guard'][name]['broken']}")
    for name in ("move", "trace", "overhead", "explain"):
        if isinstance(row.get(name), dict) and "broken" in row[name]:
            out.append(f"broken: {name} raised {row[name]['broken']} at {row[name]['at']}")
    return out


def one(case: Any, device: str, hardware: bool, repeats: int) -> dict[str, Any]:
    import gpu_agreement_tools as tools

    t0 = time.perf_counter()
    row: dict[str, Any] = {"case": case.name, "mechanism": case.mechanism, "expect": case.expect,
                           "kind": case.kind, "culprit": case.culprit,
                           "expected_policy_only": case.expected_policy_only,
                           "device": device}
    if not hardware and case.cpu_real:
        row["real"] = {"raises": False, "error": None, "not_run": case.cpu_real}
        real_obj = None
    else:
        row["real"], (real_obj, _) = tools.real(case, device)
    exc = row["real"].pop("exception", None)
    row["explain"] = tools.explained({"exception": exc}) if exc is not None else None
    row["simulate"] = tools.simulated(case, TARGET)
    row["virtual_devices"] = tools.virtual(case, TARGET)
    runnable = hardware or not case.cpu_real
    row["guard"] = {m: (tools.guarded(case, device, m) if runnable else {"not_run": case.cpu_real})
                    for m in ("explain", "strict", "fix")}
    row["scan"] = tools.scanned(real_obj, device) if real_obj is not None else None
    row["move"] = tools.moved(case, device) if runnable else None
    row["trace"] = tools.traced(case, device) if runnable else None
    row["overhead"] = tools.overhead(case, device, repeats) if runnable and not row["real"]["raises"] else None
    if hardware and row["real"]["raises"] != (case.expect == "raises"):
        row["note"] = f"the case expected the hardware to {case.expect}; the hardware is the judge"
    row["disagreements"] = judge(case, row, hardware)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def compare_machines(rows: list[dict[str, Any]], path: str) -> None:
    """The same predictions on the CPU-only machine and here: a virtual run must not depend on the host."""
    with open(path, encoding="utf-8") as fh:
        other = {r["case"]: r for r in json.load(fh)["cases"]}
    for row in rows:
        for tool in ("simulate", "virtual_devices"):
            there = other.get(row["case"], {}).get(tool)
            here = row.get(tool)
            if there is None or here is None or "broken" in here or "broken" in there:
                continue
            a = (there["ok"], [p["path"] for p in there["problems"][:1]])
            b = (here["ok"], [p["path"] for p in here["problems"][:1]])
            if a != b:
                row["disagreements"].append(f"machines: {tool} said {a} on the CPU-only machine, {b} here")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:  # `make bench-all` runs every script in bench/ bare: say how to run this one, and do nothing
        print("gpu_agreement: nothing run; give --out DIR (on a GPU machine) or --device cpu-check --out DIR")
        return 0
    args = parse(argv)
    if args.repeats is not None and args.repeats < 1:
        return usage(f"--repeats must be 1 or more, not {args.repeats}")
    if args.compare_with and not os.path.isfile(args.compare_with):
        return usage(f"--compare-with {args.compare_with}: no such file (give a cpu-check run's gpu_agreement.json)")
    hardware = args.device != "cpu-check"
    import torch

    if hardware:
        if not args.device.startswith("cuda"):
            return usage(f"--device must be cuda:N or cpu-check, not {args.device!r}")
        if not torch.cuda.is_available():
            return usage(f"--device {args.device}: this machine has no CUDA GPU; use --device cpu-check to check "
                         "the script's own machinery")
    device = args.device if hardware else "cpu"
    repeats = args.repeats or (20 if hardware else 3)
    chosen = select(args)
    os.makedirs(args.out, exist_ok=True)
    from gpu_agreement_table import markdown

    start = time.perf_counter()
    rows = []
    for case in chosen:
        if time.perf_counter() - start > args.budget_s:  # the device command has a hard limit: say what was left
            rows.append({"case": case.name, "mechanism": case.mechanism,
                         "expected_policy_only": case.expected_policy_only,
                         "not_run": f"--budget-s {args.budget_s:g} spent", "disagreements": ["not run: out of time"]})
            print(f"{case.name:28s} not run: --budget-s {args.budget_s:g} spent", flush=True)
            continue
        try:
            row = one(case, device, hardware, repeats)
        except Exception as exc:  # a case that cannot even be built here (an older peft, say) fails alone
            row = {"case": case.name, "mechanism": case.mechanism,
                   "expected_policy_only": case.expected_policy_only,
                   "not_run": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
                   "disagreements": [f"broken: the case raised {type(exc).__name__} outside every tool"],
                   "seconds": 0.0}
        rows.append(row)
        flag = "AGREES" if not row["disagreements"] else "DISAGREES: " + "; ".join(row["disagreements"])
        print(f"{case.name:28s} {row['seconds']:6.2f}s {flag}", flush=True)
    if args.compare_with:
        compare_machines(rows, args.compare_with)
    result = {"mode": "hardware" if hardware else "cpu-check", "env": environment(device if hardware else "cpu"),
              "seconds": round(time.perf_counter() - start, 1), "cases": rows,
              "disagreements": sum(bool(r["disagreements"]) for r in rows)}
    with open(os.path.join(args.out, "gpu_agreement.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1, default=str)
    with open(os.path.join(args.out, "gpu_agreement.md"), "w", encoding="utf-8") as fh:
        fh.write(markdown(result))
    print(f"{len(rows)} cases, {result['disagreements']} disagreeing, {result['seconds']} s; "
          f"written to {args.out}")
    return 1 if result["disagreements"] else 0


if __name__ == "__main__":
    sys.exit(main())

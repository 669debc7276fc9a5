"""torchdoctor's checkpoint scan beside the three established pickle scanners, on one generated corpus.

    python bench/scanners.py [--anchors-bin DIR] [--details] [--keep DIR]

The anchors are picklescan 1.0.5, modelscan 0.8.8 and fickling 0.1.12 (all on PyPI). This script installs
nothing: it runs each one found on PATH or in ``--anchors-bin`` (for instance a throwaway venv made with
``python -m venv /tmp/anchors && /tmp/anchors/bin/pip install picklescan==1.0.5 modelscan==0.8.8
fickling==0.1.12 typing_extensions``) and skips the others. The corpus is ``tests/checkpoint/corpus.py``:
payloads that run code when loaded (each would create a marker file), hostile files that run none, and
benign files as transformers, diffusers, peft, accelerate and torch write them (a whole pickled GPT-2, a
TorchScript archive among them). The payloads include the container families of ``tests/checkpoint/containers.py``:
torch < 0.4 tar checkpoints (v7 without the ustar magic, ustar, payload in ``storages``, inside a model folder,
a ``storages`` member that is a symlink: refused by name, "refused by name"), zips with duplicate members, names
that differ in case, a local name that differs from the directory's, a pickle followed by trailing data, storage
blobs nested three deep, a legacy stream whose byte 8 is ``{`` and a DCP folder whose non-tensor value runs code. Every tool runs as a whole
process per file, as a pre-commit hook would; the marker must never appear.

Verdicts: ``dangerous`` (picklescan: a dangerous global; modelscan: an issue; fickling: "unsafe";
torchdoctor: exit 1 naming a global that can run code), ``suspicious`` (picklescan's suspicious-only),
``problems`` (torchdoctor exit 1 for anything else), ``clean``, ``skipped`` (modelscan: no file it reads),
``refused`` (torchdoctor exit 2), ``error`` (a crash, a traceback or a timeout). Not part of ``make test``: the corpus and torchdoctor's verdicts are tested in
``tests/checkpoint/test_corpus.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "checkpoint"))
import corpus  # noqa: E402  (the test suite's corpus generator)

TIMEOUT = 120.0


def _run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int | None, str, float]:
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return None, "timeout", time.perf_counter() - start
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start


def _files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    return sorted(str(p) for p in Path(path).rglob("*") if p.is_file() and p.suffix in (".bin", ".pt", ".pth",
                                                                                       ".pkl", ".ckpt", ".metadata"))


def picklescan(exe: str) -> Callable[[str], tuple[str, float]]:
    def scan(path: str) -> tuple[str, float]:
        code, out, secs = _run([exe, "-p", path])
        if code is None or "Traceback" in out:
            return "error", secs
        dangerous = _count(out, "Dangerous globals:")
        if dangerous:
            return "dangerous", secs
        return ("suspicious" if _count(out, "Suspicious globals:") else "clean"), secs

    return scan


def _count(text: str, label: str) -> int:
    for line in text.splitlines():
        if line.strip().startswith(label):
            try:
                return int(line.split(":", 1)[1].strip())
            except ValueError:
                return 0
    return 0


def modelscan(exe: str) -> Callable[[str], tuple[str, float]]:
    def scan(path: str) -> tuple[str, float]:
        code, out, secs = _run([exe, "-p", path])
        if code is None or "Traceback" in out:
            return "error", secs
        # modelscan's exit codes: 0 no issue, 1 issues, 2 error, 3 no file it supports (skipped)
        return {0: "clean", 1: "dangerous", 3: "skipped"}.get(code, "error"), secs

    return scan


def fickling(exe: str) -> Callable[[str], tuple[str, float]]:
    def scan(path: str) -> tuple[str, float]:
        verdicts, total = [], 0.0
        for f in _files(path) or [path]:
            code, out, secs = _run([exe, "--check-safety", f])
            total += secs
            if code is None or "Traceback" in out:
                verdicts.append("error")
            else:  # fickling's exit codes: 0 clean, 1 unsafe, 2 error
                verdicts.append({0: "clean", 1: "dangerous"}.get(code, "error"))
        worst = "dangerous" if "dangerous" in verdicts else "error" if "error" in verdicts else "clean"
        return worst, total

    return scan


def torchdoctor(path: str) -> tuple[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    code, out, secs = _run([sys.executable, "-m", "torchdoctor", "scan", path], env=env)
    if code is None or "Traceback" in out:
        return "error", secs
    if code == 1:
        return ("dangerous" if "can run code" in out else "problems"), secs
    return {0: "clean", 2: "refused"}.get(code, "error"), secs


def _tools(bin_dir: str | None) -> dict[str, Callable[[str], tuple[str, float]]]:
    tools: dict[str, Callable[[str], tuple[str, float]]] = {}
    for name, make in (("picklescan", picklescan), ("modelscan", modelscan), ("fickling", fickling)):
        exe = shutil.which(name, path=bin_dir) if bin_dir else shutil.which(name)
        if exe:
            tools[name] = make(exe)
        else:
            print(f"{name}: not installed, skipped", file=sys.stderr)
    tools["torchdoctor"] = torchdoctor
    return tools


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--anchors-bin", help="directory holding picklescan, modelscan, fickling (default: PATH)")
    ap.add_argument("--details", action="store_true", help="one line per file and tool")
    ap.add_argument("--keep", help="build the corpus here and keep it")
    args = ap.parse_args(argv)
    root = Path(args.keep or tempfile.mkdtemp(prefix="td-scanners-"))
    marker = root / "PWNED"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cases = corpus.build(root, str(marker))
    tools = _tools(args.anchors_bin)
    results: dict[str, dict[str, tuple[str, float]]] = {}
    for case in cases:
        results[case.name] = {name: scan(case.path) for name, scan in tools.items()}
        if args.details:
            cells = "  ".join(f"{t}={v}" for t, (v, _) in results[case.name].items())
            print(f"{case.kind:<8} {case.name:<36} {cells}")
    ran = marker.exists()
    kinds = {k: [c for c in cases if c.kind == k] for k in ("payload", "hostile", "benign")}
    print(f"\ncorpus: {len(kinds['payload'])} payloads, {len(kinds['hostile'])} hostile files, "
          f"{len(kinds['benign'])} benign files; a payload ran: {'YES' if ran else 'no'}")
    head = ("tool", "payloads flagged", "suspicious only", "refused by name", "missed/error", "benign false alarms",
            "hostile: clean (ok)", "median s/file")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name in tools:
        pv = [results[c.name][name][0] for c in kinds["payload"]]
        bv = [results[c.name][name][0] for c in kinds["benign"]]
        hv = [results[c.name][name][0] for c in kinds["hostile"]]
        secs = statistics.median(r[name][1] for r in results.values())
        row = (name, f"{pv.count('dangerous')}/{len(pv)}", str(pv.count("suspicious")), str(pv.count("refused")),
               str(sum(v not in ("dangerous", "suspicious", "refused") for v in pv)), f"{bv.count('dangerous')}/{len(bv)}",
               f"{hv.count('clean')}/{len(hv)}", f"{secs:.2f}")
        print("| " + " | ".join(row) + " |")
    missed = [c.name for c in cases if c.kind != "benign" and results[c.name]["torchdoctor"][0] not in
              ("dangerous", "refused") and any(v == "dangerous" for t, (v, _) in results[c.name].items()
                                              if t != "torchdoctor")]
    alarms = {t: [c.name for c in kinds["benign"] if results[c.name][t][0] == "dangerous"] for t in tools}
    print(f"\npayloads or hostile files an anchor calls dangerous that torchdoctor neither flags nor refuses: "
          f"{missed or 'none'}")
    print("benign files called dangerous: " + "; ".join(f"{t}: {', '.join(v) or 'none'}" for t, v in alarms.items()))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if ran or missed or alarms["torchdoctor"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``explain`` before and after a change, in one process: every answer compared, and the speed side by side.

    python bench/explain_ab.py answers [--rev REV] [--corpus CORPUS.pkl]   # every diagnosis, old against new
    python bench/explain_ab.py speed [--rev REV] [ROUNDS] [MB]             # issue 43 point 5, old / new / grep
    ... [--mine a.py,b.py]   # the old side: only these modules as REV has them, the rest as the working tree's

The old side is ``src/torchdoctor/_explain`` as commit ``REV`` (default ``HEAD``) has it, read with ``git show``
and imported beside the working tree's as ``torchdoctor._explain_ab`` (explain imports nothing of torchdoctor's
but its own modules and two report helpers, so both sides keep their own tables). ``answers`` runs both sides on
every text ``bench/explain_dump.py`` reads (the recorded suite texts with ``--corpus``, every fixture and held-out
text, the bench logs) and prints each text whose diagnoses differ, whole (``to_dict()``), with exit status 1;
``speed`` times old, new and the grep-like pass interleaved on the typical app log and the log made only of error
texts (process CPU time, medians, the load average beside them). ``--mine`` puts one engineer's change alone on
trial while others edit other modules of ``_explain`` in the same tree: the old side takes the named modules from
``REV`` and every other module from the working tree.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from types import ModuleType
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != ROOT / "bench"]
_PKG = "src/torchdoctor/_explain"


def _load(name: str, path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def old_explain(rev: str, into: pathlib.Path, mine: frozenset[str] | None = None) -> ModuleType:
    """``torchdoctor._explain_ab.api``: explain's modules as ``rev`` has them (only those in ``mine`` when given,
    the others as the working tree has them), under a name of their own."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}:{_PKG}"], check=True,
                           capture_output=True, text=True).stdout.split()
    if mine is not None:
        names = sorted(set(names) | {p.name for p in (ROOT / _PKG).glob("*.py")})
    folder = into / "_explain_ab"
    folder.mkdir()
    for name in names:
        if name.endswith(".py") and (mine is None or name in mine or (ROOT / _PKG / name).exists()):
            if mine is not None and name not in mine:
                text = (ROOT / _PKG / name).read_text()
            else:
                text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{_PKG}/{name}"], check=True,
                                      capture_output=True, text=True).stdout
            (folder / name).write_text(re.sub(r"\btorchdoctor\._explain\b", "torchdoctor._explain_ab", text))
    import torchdoctor

    spec = importlib.util.spec_from_file_location("torchdoctor._explain_ab", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules["torchdoctor._explain_ab"] = package
    spec.loader.exec_module(package)
    torchdoctor._explain_ab = package  # type: ignore[attr-defined]
    return importlib.import_module("torchdoctor._explain_ab.api")


def _answer(api: Any, text: str, limit: int | None) -> str:
    try:
        return json.dumps([d.to_dict() for d in api._explain_blocks(api._blocks(text), limit)], sort_keys=True)
    except Exception as exc:  # the pipeline's own failure, which explain hides behind an empty report
        return f"ERROR {type(exc).__name__}"


def answers(old: Any, new: Any, corpus: str | None, rev: str) -> int:
    dump = _load("_bench_explain_dump", ROOT / "bench" / "explain_dump.py")
    n = differ = 0
    for text, limit in dump.texts(corpus):
        a, b = _answer(old, text, limit), _answer(new, text, limit)
        n += 1
        if a != b:
            differ += 1
            if differ <= 5:
                print(f"--- text {n} ({len(text)} characters, limit {limit}) differs:\n{text[:600]!r}\nold: {a[:2000]}"
                      f"\nnew: {b[:2000]}")
    print(f"{n} texts, {differ} with different diagnoses ({rev} against the working tree)")
    return 1 if differ else 0


def speed(old: Any, new: Any, rounds: int, size: int) -> int:
    bench = _load("_bench_explain", ROOT / "bench" / "explain.py")
    texts = {"app log": bench.app_log(size), "error texts": bench.error_log(max(1, size // 5))}
    sides = {"old": old.explain, "new": new.explain, "grep": bench.grep_baseline}
    for fn in sides.values():
        fn("warm up")
    times: dict[tuple[str, str], list[float]] = {}
    load = [os.getloadavg()[0]]
    for r in range(rounds):
        order = list(sides.items())
        order = order[r % 3:] + order[: r % 3]
        for label, text in texts.items():
            for side, fn in order:
                t = time.process_time()
                fn(text)
                times.setdefault((label, side), []).append(time.process_time() - t)
        load.append(os.getloadavg()[0])
    for label, text in texts.items():
        mb = len(text) / 1e6
        med = {side: statistics.median(times[(label, side)]) for side in sides}
        pairs = sorted(n / o for n, o in zip(times[(label, "new")], times[(label, "old")]))
        print(f"{label} ({mb:.1f} MB, {rounds} rounds): old {mb / med['old']:6.1f} MB/s, new {mb / med['new']:6.1f}"
              f" MB/s, grep-like {mb / med['grep']:6.1f} MB/s; new/old per round x{statistics.median(pairs):.3f} "
              f"({pairs[0]:.3f}-{pairs[-1]:.3f})")
    print(f"load average {min(load):.1f}-{max(load):.1f} on {os.cpu_count()} cpus")
    return 0


def main() -> int:
    args = sys.argv[1:]
    if not args or args[0] not in ("answers", "speed"):
        print(__doc__)
        return 2
    rev = args[args.index("--rev") + 1] if "--rev" in args else "HEAD"
    corpus = args[args.index("--corpus") + 1] if "--corpus" in args else None
    mine = frozenset(args[args.index("--mine") + 1].split(",")) if "--mine" in args else None
    rest = [a for i, a in enumerate(args[1:], 1) if not a.startswith("--") and not args[i - 1].startswith("--")]
    from torchdoctor._explain import api as new

    with tempfile.TemporaryDirectory() as tmp:
        old = old_explain(rev, pathlib.Path(tmp), mine)
        if args[0] == "answers":
            return answers(old, new, corpus, rev)
        return speed(old, new, int(rest[0]) if rest else 9, int(float(rest[1]) * 1e6) if len(rest) > 1 else 20_000_000)


if __name__ == "__main__":
    sys.exit(main())

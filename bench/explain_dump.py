"""Every diagnosis ``explain`` gives on the texts its tests and benchmarks read, one JSON line per text, and their
sha256: what a speed change to ``torchdoctor._explain`` must keep byte for byte.

    python bench/explain_dump.py --record CORPUS.pkl          # run tests/explain once, keep the texts it passes
    python bench/explain_dump.py OUT.jsonl --corpus CORPUS.pkl  # the diagnoses of those texts and the rest
    python bench/explain_dump.py OUT.jsonl --no-tests          # fixtures, held-out texts and bench logs only

Record once, then dump before and after a change and compare the two files (``cmp``): the suite's property tests
draw new texts on every run, so the texts are kept, not drawn again. The texts: every string the tests/explain suite
hands to explain's pipeline (recorded in process while the suite runs, with its ``limit``), every fixture and
held-out body, and the bench logs (``bench/explain.py``: app, error, alike and time-stamped logs at 1 and 4 MB, and
more seeds at 2 MB). An input on which the pipeline raises is written as ``ERROR <type>`` (``explain`` itself
answers an empty report there).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import pathlib
import pickle
import sys
from collections.abc import Iterable, Iterator
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
# the script's folder holds explain.py, which would shadow the tests' own ``explain`` package
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != ROOT / "bench"]


def _bench() -> Any:
    """bench/explain.py (its logs), under a name of its own: the tests import ``explain`` as their package."""
    spec = importlib.util.spec_from_file_location("_bench_explain", ROOT / "bench" / "explain.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Recorder:
    """A pytest plugin: each text (and limit) that reaches ``api._explain_blocks`` while the suite runs."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int | None], None] = {}
        self._orig: Any = None

    def pytest_sessionstart(self, session: Any) -> None:
        from torchdoctor._explain import api

        self._orig = api._explain_blocks

        def record(blocks: Iterable[str], limit: int | None) -> list[Any]:
            blocks = list(blocks)
            self.seen.setdefault(("".join(blocks), limit), None)
            return self._orig(blocks, limit)
        api._explain_blocks = record

    def pytest_sessionfinish(self, session: Any) -> None:
        from torchdoctor._explain import api

        api._explain_blocks = self._orig


def record(path: str) -> None:
    import pytest

    rec = _Recorder()
    pytest.main(["-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-n", "0", str(ROOT / "tests" / "explain")],
                plugins=[rec])
    with open(path, "wb") as fh:
        pickle.dump(sorted(rec.seen, key=lambda k: (len(k[0]), k[0], -1 if k[1] is None else k[1])), fh)
    print(f"{len(rec.seen)} texts recorded in {path}")


def texts(corpus: str | None) -> Iterator[tuple[str, int | None]]:
    if corpus:
        with open(corpus, "rb") as fh:
            yield from pickle.load(fh)
    bench = _bench()
    for p in sorted(bench.FIXTURES.glob("*.txt")) + sorted((bench.FIXTURES.parent / "holdout").glob("*.txt")):
        yield p.read_text(encoding="utf-8").partition("\n---\n")[2], None
    for n in (1_000_000, 4_000_000):
        for text in (bench.app_log(n), bench.error_log(n), bench.alike_log(n), bench.alike_log(n, stamps=True),
                     bench.synthetic_log(n)):
            yield text, None
    for seed in (1, 2):
        yield bench.error_log(2_000_000, seed=seed), None
    for seed in (3, 4):
        yield bench.alike_log(2_000_000, seed=seed, stamps=bool(seed % 2)), None


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    if sys.argv[1] == "--record":
        record(sys.argv[2])
        return 0
    corpus = sys.argv[sys.argv.index("--corpus") + 1] if "--corpus" in sys.argv else None
    digest, n = hashlib.sha256(), 0
    from torchdoctor._explain import api

    with open(sys.argv[1], "w", encoding="utf-8") as out:
        for text, limit in texts(corpus):
            try:
                found = api._explain_blocks(api._blocks(text), limit)
                line = json.dumps([d.to_dict() for d in found], sort_keys=True) + "\n"
            except Exception as exc:  # the pipeline's own failure, which explain hides behind an empty report
                line = f"ERROR {type(exc).__name__}\n"
            out.write(line)
            digest.update(line.encode())
            n += 1
    print(f"{n} texts, sha256 {digest.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

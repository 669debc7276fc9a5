"""What the pytest plugin costs when it is off (issue 9: "adds no measurable time when off").

A generated suite of trivial tests runs in fresh ``pytest`` processes, with the plugin loaded (its entry point,
option ``off``) and with ``-p no:torchdoctor``, interleaved, medians; then the per-test cost of the plugin's
``pytest_runtest_call`` wrapper, measured in-process on its own.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

ROUNDS = 9
TESTS = 2000


def _suite(root: str) -> str:
    path = os.path.join(root, "test_many.py")
    with open(path, "w") as f:
        f.write("import pytest\n\n@pytest.mark.parametrize('i', range(%d))\ndef test_trivial(i):\n    assert i >= 0\n"
                % TESTS)
    return path


def _run(suite: str, *extra: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *extra,
                    suite], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   cwd=os.path.dirname(suite))
    return time.perf_counter() - start


def _hook_cost(n: int = 200_000) -> float:
    """µs per test that the off-mode ``pytest_runtest_call`` wrapper adds (driving the generator by hand)."""
    import pytest

    from torchdoctor import _pytest_plugin as plugin

    class Item:
        def __init__(self) -> None:
            self.config = type("C", (), {"stash": pytest.Stash()})()
            self.config.stash[plugin._KEY] = "off"
            self.stash = pytest.Stash()

        def get_closest_marker(self, name: str) -> None:
            return None

    item: Item = Item()
    hook = plugin.pytest_runtest_call
    start = time.perf_counter()
    for _ in range(n):
        gen = hook(item)  # type: ignore[arg-type]
        next(gen)
        try:
            gen.send(None)
        except StopIteration:
            pass
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        suite = _suite(root)
        _run(suite)  # warm the file system and bytecode caches
        on: list[float] = []
        off: list[float] = []
        for i in range(ROUNDS):
            for variant in (("plugin",), ("none",))[:: 1 if i % 2 == 0 else -1]:
                if variant[0] == "plugin":
                    on.append(_run(suite))
                else:
                    off.append(_run(suite, "-p", "no:torchdoctor"))
    pairs = [a / b for a, b in zip(on, off)]
    print(f"{TESTS} trivial tests per run, {ROUNDS} interleaved rounds, fresh pytest processes, medians")
    print(f"  without the plugin (-p no:torchdoctor)  {statistics.median(off):.3f} s")
    print(f"  with the plugin, --torchdoctor=off       {statistics.median(on):.3f} s  "
          f"ratio {statistics.median(on) / statistics.median(off):.3f} (paired median {statistics.median(pairs):.3f})")
    print(f"  pytest_runtest_call wrapper when off: {_hook_cost():.2f} us per test")


if __name__ == "__main__":
    main()

"""pytest plugin: keep placement right in a test suite, on CPU-only CI (registered through ``pytest11``).

- ``--torchdoctor=off|explain|strict`` wraps every test in ``torchdoctor.guard`` with that mode (default off);
- fixture ``placement_guard``: a guard around the test, mode set by ``@pytest.mark.placement_guard(mode=...)``;
- marker ``@pytest.mark.simulate(device="cuda:1", dtype="bfloat16", profile=...)``: the test body runs on
  virtual devices, so ``model.to("cuda:1")`` works on a CPU runner and placement problems fail the test;
- a failing test shows the ``PlacementError`` (module path, tensors, fix), not a wall of internals.

Nothing heavy is imported at collection: torch and torchdoctor load only when a test needs them.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

_MODES = ("off", "explain", "strict")
_KEY = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchdoctor", "device and dtype placement checks (torchdoctor)")
    group.addoption("--torchdoctor", action="store", default="off", choices=_MODES, dest="torchdoctor",
                    help="wrap every test in torchdoctor.guard with this mode (default: off)")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_KEY] = config.getoption("torchdoctor", "off") or "off"
    config.addinivalue_line("markers", "placement_guard(mode='explain'): mode of the placement_guard fixture "
                            "(explain, strict, fix, warn)")
    config.addinivalue_line("markers", "simulate(device='cuda:1', dtype=None, profile=None, count=None): run the "
                            "test body on torchdoctor's virtual devices; placement problems fail the test")


def pytest_report_header(config: pytest.Config) -> str:
    mode = config.stash.get(_KEY, "off")
    if mode == "off":
        return "torchdoctor: off (--torchdoctor=explain|strict guards every test)"
    return f"torchdoctor: every test runs under guard(mode={mode!r})"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    mode = item.config.stash.get(_KEY, "off")
    marker = item.get_closest_marker("simulate")
    if mode == "off" and marker is None:
        return (yield)
    import contextlib

    with contextlib.ExitStack() as stack:
        if marker is not None:
            stack.enter_context(_simulated(item, marker))
        if mode != "off":
            from torchdoctor._guard import guard

            stack.enter_context(guard(mode=mode))
        return (yield)


def _simulated(item: pytest.Item, marker: pytest.Mark) -> Any:
    from torchdoctor._simulate import virtual_devices

    kwargs = dict(marker.kwargs)
    if marker.args:
        kwargs.setdefault("device", marker.args[0])
    if "device" not in kwargs:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.simulate needs device=, e.g. device='cuda:1'")
    return virtual_devices(**kwargs)


@pytest.fixture()
def placement_guard(request: pytest.FixtureRequest) -> Generator[Any, None, None]:
    """A ``torchdoctor.guard`` around the test (mode from ``@pytest.mark.placement_guard(mode=...)``); yields it,
    so ``placement_guard.fixes`` / ``.problems`` can be asserted."""
    from torchdoctor._guard import guard

    marker = request.node.get_closest_marker("placement_guard")
    mode = "explain"
    if marker is not None:
        mode = marker.kwargs.get("mode", marker.args[0] if marker.args else "explain")
    with guard(mode=mode) as g:
        yield g


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    excinfo = call.excinfo
    if excinfo is None or report.passed or not _is_placement_error(excinfo.value):
        return report
    try:
        # the user's frames only, and no chained torch internals: the PlacementError says it all
        tb = excinfo.traceback.filter(lambda entry: not _internal(str(entry.path)))
        excinfo.traceback = tb if len(tb) else excinfo.traceback[:1]
        report.longrepr = excinfo.getrepr(style="short", chain=False, funcargs=False, showlocals=False)
    except Exception:  # STYLE 6: a diagnostic must not break the program it watches
        pass
    return report


def _is_placement_error(exc: BaseException) -> bool:
    return type(exc).__name__ == "PlacementError" and type(exc).__module__ == "torchdoctor"


def _internal(path: str) -> bool:
    p = path.replace("\\", "/")
    return "/torchdoctor/" in p and "/tests/" not in p or "/site-packages/" in p or "/torch/" in p


def pytest_assertrepr_compare(config: pytest.Config, op: str, left: Any, right: Any) -> list[str] | None:
    """``assert scan(model) == []``-style comparisons of a ScanReport explain themselves by path."""
    report = left if type(left).__name__ == "ScanReport" else right if type(right).__name__ == "ScanReport" else None
    if report is None or op != "==":
        return None
    lines = [f"placement report: {len(report.problems)} problem(s)"]
    for p in report.problems[:40]:
        lines.append(f"  {p.path}: found {p.found}, expected {p.expected} ({p.kind}, {p.role})")
    return lines

"""pytest plugin: keep placement right in a test suite, on CPU-only CI (registered through ``pytest11``).

- ``--torchdoctor=off|explain|strict|fix|warn`` wraps every test in ``torchdoctor.guard`` with that mode; without
  the option the ini value ``torchdoctor_mode`` decides, then ``mode`` of ``[tool.torchdoctor]`` in
  pyproject.toml, else off;
- fixture ``placement_guard``: a guard around the test, mode set by ``@pytest.mark.placement_guard(mode=...)``;
- marker ``@pytest.mark.simulate(device="cuda:1", dtype="bfloat16", profile=...)``: the test body runs on
  virtual devices, so ``model.to("cuda:1")`` works on a CPU runner and placement problems fail the test;
  fixture ``simulated_device`` is the marker's device;
- ``torchdoctor.assert_placement(obj, device=, dtype=)`` fails with the paths found and expected;
- a failing test shows the ``PlacementError`` (module path, tensors, fix), not a wall of internals.

Nothing heavy is imported at collection: torch and torchdoctor load only when a test needs them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import pytest

_MODES = ("off", "explain", "strict", "fix", "warn")  # every guard mode
_KEY = pytest.StashKey[str]()
_WHY = pytest.StashKey[str]()
_FIXTURE_GUARD = pytest.StashKey[Any]()
_STACKS = pytest.StashKey[Any]()  # (kind, path) -> the call stack when a simulate problem was recorded
_FRAME = pytest.StashKey[Any]()  # {"frame": the test function's frame}, caught as it starts (simulate marker)
_SIM_KEYS = ("device", "dtype", "profile", "count", "data", "limit")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchdoctor", "device and dtype placement checks (torchdoctor)")
    group.addoption("--torchdoctor", action="store", default=None, choices=_MODES, dest="torchdoctor",
                    help="wrap every test in torchdoctor.guard with this mode (default: the ini value "
                         "torchdoctor_mode, else [tool.torchdoctor] mode, else off)")
    parser.addini("torchdoctor_mode", "guard mode for every test: off, explain, strict, fix or warn", default="")


def _mode(config: pytest.Config) -> tuple[str, str]:
    """(mode, where it came from): the option, then the ini value, then ``[tool.torchdoctor]``."""
    option = config.getoption("torchdoctor", None)
    if option:
        return str(option), "--torchdoctor"
    ini = str(config.getini("torchdoctor_mode") or "").strip()
    if ini:
        if ini not in _MODES:
            raise pytest.UsageError(f"ini option torchdoctor_mode = {ini!r}: expected one of {', '.join(_MODES)}")
        return ini, "ini torchdoctor_mode"
    from torchdoctor._cli.common import UsageError
    from torchdoctor._cli.config import read_config

    try:
        path, table = read_config(str(config.rootpath))
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    if "mode" in table:
        return str(table["mode"]), f"[tool.torchdoctor] in {path}"
    return "off", ""


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_KEY], config.stash[_WHY] = _mode(config)
    config.addinivalue_line("markers", "placement_guard(mode='explain'): mode of the placement_guard fixture "
                            "(explain, strict, fix, warn)")
    # pytest splits a marker line at its first ':', so the signature holds none (device='cuda:1' printed as 'cuda: 1')
    config.addinivalue_line("markers", "simulate(device, dtype=None, profile=None, count=None, data='cpu'): run the "
                            "test body on torchdoctor's virtual devices, e.g. @pytest.mark.simulate(device='cuda:1', "
                            "dtype='bfloat16'); placement problems fail the test")


def pytest_report_header(config: pytest.Config) -> str:
    mode = config.stash.get(_KEY, "off")
    why = config.stash.get(_WHY, "")
    if mode == "off":
        return "torchdoctor: off (--torchdoctor=explain|strict|fix|warn guards every test)" + (f", from {why}"
                                                                                              if why else "")
    return f"torchdoctor: every test runs under guard(mode={mode!r})" + (f", from {why}" if why != "--torchdoctor"
                                                                          else "")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    mode = item.config.stash.get(_KEY, "off")
    marker = item.get_closest_marker("simulate")
    own = item.stash.get(_FIXTURE_GUARD, None)
    if mode == "off" and marker is None and own is None:
        return (yield)
    with contextlib.ExitStack() as stack:
        if marker is not None:  # simulate checks every op with guard's strict rules already
            stack.enter_context(_simulated(item, marker))
            item.stash[_FRAME] = stack.enter_context(_test_frame(item))
        elif own is not None:  # entered here, not in the fixture, so the test's own error passes through it
            stack.enter_context(own)
        else:
            from torchdoctor._guard.api import guard

            stack.enter_context(guard(mode=mode))
        return (yield)


@contextlib.contextmanager
def _test_frame(item: pytest.Item) -> Generator[dict[str, Any], None, None]:
    """The test function's frame, caught by a profile function that removes itself when the test's own code starts:
    simulate's error is raised after the test returned, where no frame of the test is on its traceback, and the fix
    is written with the names the test holds (``net.out``, not ``model.out``). Nothing when a profiler is set."""
    import sys

    code = getattr(getattr(item, "obj", None), "__code__", None)
    got: dict[str, Any] = {}
    if code is None or sys.getprofile() is not None:
        yield got
        return

    def catch(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is code:
            got["frame"] = frame
            sys.setprofile(None)
    sys.setprofile(catch)
    try:
        yield got
    finally:
        if sys.getprofile() is catch:
            sys.setprofile(None)


def _marker_kwargs(item: pytest.Item, marker: pytest.Mark) -> dict[str, Any]:
    kwargs = dict(marker.kwargs)
    if marker.args:
        kwargs.setdefault("device", marker.args[0])
    unknown = sorted(set(kwargs) - set(_SIM_KEYS))
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.simulate got unknown argument(s) {unknown}; "
                                f"it takes {', '.join(_SIM_KEYS)}")
    if "device" not in kwargs:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.simulate needs device=, e.g. device='cuda:1'")
    return kwargs


@contextlib.contextmanager
def _simulated(item: pytest.Item, marker: pytest.Mark) -> Generator[Any, None, None]:
    from torchdoctor._virtual.session import expectation, virtual_devices

    kwargs = _marker_kwargs(item, marker)
    given = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if k in ("device", "dtype", "profile"))
    where = f"@pytest.mark.simulate({given})"  # the error says where its expectation came from
    if str(kwargs["device"]).strip().lower() == "cpu":  # the CPU is here: the dtype is checked on it for real
        with _on_cpu(item, kwargs.get("dtype"), where):
            yield None
        return
    # the test body is checked for code that means the first GPU by a bare "cuda": device 0 stays current
    kwargs.setdefault("select", False)
    session: Any = None
    try:
        with virtual_devices(kwargs.pop("device"), kwargs.pop("dtype", None), **kwargs) as session:
            session.whence = expectation(session.device, session.dtype, session.profile,
                                         {k: where for k in ("device", "dtype", "profile") if k in marker.kwargs
                                          or (k == "device" and marker.args)})
            yield session
    except Exception as exc:
        # the error is raised on the block's exit, where no frame of the test is left: the call stacks the
        # session kept when each problem was recorded let the report point at the lines that failed
        if session is not None and _is_placement_error(exc):
            item.stash[_STACKS] = dict(session.stacks)
            if session.problems:  # a fix at a line upstream of the failure: the test re-run with it, as simulate does
                from torchdoctor._run.rerun import rerun_error

                again = rerun_error(item, session, kwargs.get("data", "cpu"))
                if again is not None:
                    raise again from exc.__cause__
        raise


@contextlib.contextmanager
def _on_cpu(item: pytest.Item, dtype: Any, where: str) -> Generator[None, None, None]:
    """``@pytest.mark.simulate("cpu", dtype="float16")``: the test body runs on this CPU under the check
    ``simulate(device="cpu", dtype=...)`` runs: an op with no kernel in the dtype, or one an operand of a wider
    floating dtype promotes out of it, is a problem (the run goes on past each); they fail the test together."""
    import torch

    from torchdoctor import PlacementError
    from torchdoctor._placement import dtype_str, parse_dtype
    from torchdoctor._virtual.cpudtype import Calls, Checks

    if dtype is None:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.simulate('cpu') checks a dtype on this CPU: add "
                                "dtype=, e.g. @pytest.mark.simulate('cpu', dtype='float16')")
    try:
        dt = parse_dtype(dtype)
    except ValueError as exc:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.simulate: {exc}") from None
    stack: list[Any] = []  # the modules running now, so a problem names the one it was met in

    def leave(m: Any, a: Any, o: Any) -> None:  # returns None: the output stays the module's own
        if stack:
            stack.pop()

    pre = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: stack.append(m))
    post = torch.nn.modules.module.register_module_forward_hook(leave)
    paths: dict[int, str] = {}
    checks = Checks(dt, _Names(stack, paths), stack, paths)
    checks.problems = recorded = _Stacked()
    try:
        with checks, Calls(checks):
            yield
    finally:
        pre.remove()
        post.remove()
    if checks.problems:
        item.stash[_STACKS] = recorded.stacks  # the lines that failed, for the report (raised where none is)
        rows = [f"  {p}" for p in checks.problems[:40]]
        head = f"{len(checks.problems)} dtype problem(s) on cpu in {dtype_str(dt)}:"
        from torchdoctor._virtual.cpudtype import proven_at_op
        from torchdoctor._virtual.prove import fix_text

        fixes = fix_text(proven_at_op(checks))  # each cast proven at the op it promoted, as the device markers say
        raise PlacementError("\n".join([head, *rows, f"expected: cpu {dtype_str(dt)} (dtype from {where})", *fixes]),
                             problems=tuple(checks.problems))


class _Names(dict):  # type: ignore[type-arg]
    """The marker's test builds its own model: the tensors of the outermost module running when an op is checked
    are named by their paths in it (``scale``, ``lin.weight``), as ``simulate`` names its copy's; ``paths`` gets
    its modules' paths. Walked once per model, at its first op that asks."""

    def __init__(self, stack: list[Any], paths: dict[int, str]) -> None:
        super().__init__()
        self.stack, self.paths = stack, paths
        self.walked: set[int] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        if key not in self and self.stack and id(self.stack[0]) not in self.walked:
            from torchdoctor._walk import walk

            root = self.stack[0]
            self.walked.add(id(root))
            found = walk(root)
            for e in found.entries:
                self.setdefault(id(e.tensor), (e.path, e.role))
            for path, m in found.modules:
                self.paths.setdefault(id(m), path)
        return super().get(key, default)


class _Stacked(list):  # type: ignore[type-arg]
    """Problems as recorded, each kind and path with the call stack it was first met on (outermost first)."""

    def __init__(self) -> None:
        super().__init__()
        self.stacks: dict[tuple[str, str], list[tuple[str, int, str]]] = {}

    def append(self, p: Any) -> None:
        import sys

        if (p.kind, p.path) not in self.stacks:
            from torchdoctor._report.text import call_stack

            self.stacks[(p.kind, p.path)] = call_stack(sys._getframe(1))
        super().append(p)


@pytest.fixture()
def simulated_device(request: pytest.FixtureRequest) -> Any:
    """The ``torch.device`` of the test's ``@pytest.mark.simulate`` marker (``cuda`` means ``cuda:0``)."""
    marker = request.node.get_closest_marker("simulate")
    if marker is None:
        raise pytest.UsageError(f"{request.node.nodeid}: the simulated_device fixture needs "
                                "@pytest.mark.simulate(device=...) on the test")
    import torch

    device = torch.device(_marker_kwargs(request.node, marker)["device"])
    return torch.device(device.type, device.index or 0)


@pytest.fixture()
def placement_guard(request: pytest.FixtureRequest) -> Generator[Any, None, None]:
    """A ``torchdoctor.guard`` around the test body (mode from ``@pytest.mark.placement_guard(mode=...)``);
    yields it, so ``placement_guard.fixes`` / ``.problems`` can be asserted after the code under test ran."""
    from torchdoctor._guard.api import guard

    marker = request.node.get_closest_marker("placement_guard")
    mode = "explain"
    if marker is not None:
        mode = marker.kwargs.get("mode", marker.args[0] if marker.args else "explain")
    try:
        g = guard(mode=mode)
    except ValueError as exc:
        raise pytest.UsageError(f"{request.node.nodeid}: @pytest.mark.placement_guard: {exc}") from None
    request.node.stash[_FIXTURE_GUARD] = g
    yield g
    del request.node.stash[_FIXTURE_GUARD]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    excinfo, held = call.excinfo, _held(item)  # the test's frame let go, failed or not
    if excinfo is None or report.passed or not (_is_placement_error(excinfo.value) or _from_assert_placement(excinfo)):
        return report
    try:
        from torchdoctor._report.testfailure import named_as_in_test, short

        named_as_in_test(excinfo.value, item)
        _named_as_held(excinfo.value, held)
        report.longrepr = short(excinfo, item, item.stash.get(_STACKS, {}) or {})
    except Exception:  # a diagnostic must not break the program it watches
        pass
    return report


def _held(item: pytest.Item) -> dict[str, Any] | None:
    """The names the test's frame held as it ended (its globals, then its locals), caught by ``_test_frame``; the
    frame is let go here."""
    got: dict[str, Any] = item.stash.get(_FRAME, {})
    frame = got.pop("frame", None)
    return {**frame.f_globals, **frame.f_locals} if frame is not None else None


def _named_as_held(exc: BaseException, names: dict[str, Any] | None) -> None:
    """The fix of simulate's error written with the names the test held (``named_as_in_test`` reads them from a
    traceback, which holds no frame of the test when the error is raised after it returned)."""
    message = str(exc.args[0]) if exc.args else ""
    if not names or "Fix:" not in message:
        return
    from torchdoctor._run.names import held_code

    head, sep, fix = message.partition("Fix:")
    exc.args = (head + sep + held_code(fix, names), *exc.args[1:])
    if isinstance(getattr(exc, "fix", None), str):
        exc.fix = held_code(exc.fix, names)  # type: ignore[attr-defined]


def _is_placement_error(exc: BaseException) -> bool:
    return type(exc).__name__ == "PlacementError" and type(exc).__module__ == "torchdoctor"


def _from_assert_placement(excinfo: pytest.ExceptionInfo[BaseException]) -> bool:
    """An AssertionError raised by ``torchdoctor.assert_placement``: shown at the test's line, without its frame."""
    if not isinstance(excinfo.value, AssertionError):
        return False
    tb = excinfo.tb
    while tb.tb_next is not None:
        tb = tb.tb_next
    from torchdoctor._report.testfailure import internal

    return tb.tb_frame.f_code.co_name == "assert_placement" and internal(tb.tb_frame.f_code.co_filename)


def pytest_assertrepr_compare(config: pytest.Config, op: str, left: Any, right: Any) -> list[str] | None:
    """``assert scan(model) == []``-style comparisons of a ScanReport explain themselves by path."""
    report = left if type(left).__name__ == "ScanReport" else right if type(right).__name__ == "ScanReport" else None
    if report is None or op != "==":
        return None
    lines = [f"placement report: {len(report.problems)} problem(s)"]
    for p in report.problems[:40]:
        lines.append(f"  {p.path}: found {p.found}, expected {p.expected} ({p.kind}, {p.role})")
    return lines

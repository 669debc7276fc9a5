"""What a failing test shows, from one shared ``pytest --torchdoctor=strict`` run of several small suites (each
pytest run starts torch afresh: one run serves every check here).

- a failing ``@pytest.mark.simulate`` test (virtual device, or a dtype on this CPU) and a ``--torchdoctor=strict``
  failure on a silent promotion point at the test's call line, the lines between, and the failing line of the
  forward, as pytest's own traceback does (issue 42 point 7), with ``E`` lines under the last;
- the marker names a plain attribute by its path (``scale``), as ``simulate`` does, and says where its
  expectation came from; its fix is proven at the op (issue 41 point 1);
- the short summary line reads like pytest's own; ``assert_placement``'s frame is hidden;
- a marked test on the CPU with no dtype is a usage error that says what to add; clean tests pass under strict.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from pathlib import Path

import pytest

SUITES = {
    "test_cpu.py": """
import pytest, torch
from torch import nn


class Upcast(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.ones(4)  # float32: promotes a float16 forward

    def forward(self, x):
        return self.lin(x) * self.scale  # CPU-FORWARD


@pytest.mark.simulate("cpu", dtype="float16")
def test_upcast():
    m = Upcast().to(torch.float16)
    m(torch.ones(1, 4, dtype=torch.float16))  # CPU-CALL


@pytest.mark.simulate("cpu", dtype="float16")
def test_fine():
    m = nn.Linear(4, 4).to(torch.float16)
    assert m(torch.ones(1, 4, dtype=torch.float16)).dtype == torch.float16


@pytest.mark.simulate("cpu")
def test_no_dtype():
    pass
""",
    "test_forward.py": """
import pytest, torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.mask = torch.ones(4)  # a plain attribute: Module.to never moves it

    def forward(self, x):
        h = self.lin(x)
        return h * self.mask  # SIM-FORWARD


@pytest.mark.simulate(device="cuda:1")
def test_sim_forward():
    model = Net().to("cuda:1")
    x = torch.ones(1, 4, device="cuda:1")
    model(x)  # SIM-CALL
""",
    "test_promotes.py": """
import pytest, torch
from torch import nn

class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.ones(4)

    def forward(self, x):
        return self.lin(x) * self.scale  # PROMOTES-FORWARD

@pytest.mark.simulate(device="cuda:0", dtype="bfloat16", profile="t4")
def test_promotes():
    m = Scaled().to("cuda:0", torch.bfloat16)
    m.scale = m.scale.to("cuda:0")
    m(torch.ones(2, 4, device="cuda:0", dtype=torch.bfloat16))
""",
    "test_strict.py": """
import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.full((4,), 0.5)

    def forward(self, x):
        return self.lin(x) * self.scale  # STRICT-FORWARD


def run(model):
    return model(torch.ones(2, 4, dtype=torch.bfloat16))  # STRICT-HELPER


def test_strict_promotes():
    model = Scaled().to(torch.bfloat16)
    model.scale = torch.full((4,), 0.5)  # float32 again: the forward computes in float32 from here
    out = run(model)  # STRICT-CALL
    assert out.dtype == torch.float32  # passes without the plugin: a silent promotion


def test_strict_clean():
    model = Scaled().to(torch.bfloat16)
    model.scale = model.scale.to(torch.bfloat16)
    assert run(model).dtype == torch.bfloat16
""",
    "test_broken.py": """
import torch

def build(broken):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4)).to(torch.bfloat16)
    if broken:
        model[0].bias.data = model[0].bias.data.float()
    return model

def test_clean():
    assert build(False)(torch.ones(2, 4, dtype=torch.bfloat16)).dtype == torch.bfloat16

def test_broken():
    build(True)(torch.ones(2, 4, dtype=torch.bfloat16))
""",
    "test_suite.py": """
import pytest, torch
from torch import nn
import torchdoctor

@pytest.mark.simulate(device="cuda:1")
def test_sim():
    m = nn.Sequential(nn.Linear(4, 4))
    m.extra = [nn.Linear(4, 4)]
    m.to("cuda:1")
    m.extra[0](m(torch.ones(1, 4, device="cuda:1")))

def test_assert():
    torchdoctor.assert_placement(nn.Linear(2, 2), dtype=torch.bfloat16)
""",
}


def _line(name: str, tag: str) -> int:
    return 1 + next(i for i, text in enumerate(SUITES[name].lstrip("\n").splitlines()) if f"# {tag}" in text)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("suites")
    for name, source in SUITES.items():
        (folder / name).write_text(source.lstrip("\n"), encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-W", "ignore", "-rf", "--torchdoctor=strict", "--rootdir", str(folder),
                           str(folder)], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    return proc.stdout + proc.stderr


def _section(out: str, test: str) -> list[str]:
    """The lines of one test's failure section (pytest's ``____ test ____`` header up to the next header)."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("_") and f" {test} " in ln)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("___", "===="))), len(lines))
    return lines[start + 1:end]


def _is(line: str, pattern: str) -> bool:
    return line == pattern or fnmatch.fnmatch(line, pattern)  # equal: a line with [..] that fnmatch reads as a class


def _in_order(lines: list[str], patterns: list[str]) -> None:
    """Each pattern matches a line, in this order, each on the line right after the previous one's."""
    first = next((i for i, ln in enumerate(lines) if _is(ln, patterns[0])), None)
    assert first is not None, (patterns[0], lines)
    for k, pattern in enumerate(patterns[1:], 1):
        assert first + k < len(lines) and _is(lines[first + k], pattern), (pattern, lines)


def test_outcomes(shared: str) -> None:
    summary = shared.splitlines()[-1]
    assert "8 failed, 3 passed" in summary, shared
    assert "torchdoctor: every test runs under guard(mode='strict')" in shared


def test_cpu_marker_points_at_the_call_and_the_forward_and_names_the_attribute(shared: str) -> None:
    lines = _section(shared, "test_upcast")
    _in_order(lines, [
        f"test_cpu.py:{_line('test_cpu.py', 'CPU-CALL')}: in test_upcast",
        "    m(torch.ones(1, 4, dtype=torch.float16))  # CPU-CALL",
        f"test_cpu.py:{_line('test_cpu.py', 'CPU-FORWARD')}: in forward",
        "    return self.lin(x) * self.scale  # CPU-FORWARD",
        "E   torchdoctor.PlacementError: 1 dtype problem(s) on cpu in float16:",
        "E     dtype    scale: scale float32?4? promotes aten.mul.Tensor out of float16 into float32*(in <root>, Upcast)",
        "E   expected: cpu float16 (dtype from @pytest.mark.simulate(*dtype='float16'*))",
        "E   Fix:",
        "E       m.scale.data = m.scale.data.to(torch.float16)",  # the test holds the model as `m`
        "E       # fix proven (at the failing op aten.mul.Tensor*",
    ])
    assert not any("def test_upcast" in ln for ln in lines)  # not the def line: the lines that ran
    assert any(fnmatch.fnmatch(ln, "*test_no_dtype*@pytest.mark.simulate('cpu') checks a dtype on this CPU: add "
                                   "dtype=*") for ln in shared.splitlines())


def test_strict_option_points_at_the_call_the_helper_and_the_forward(shared: str) -> None:
    lines = _section(shared, "test_strict_promotes")
    _in_order(lines, [
        f"test_strict.py:{_line('test_strict.py', 'STRICT-CALL')}: in test_strict_promotes",
        "    out = run(model)  # STRICT-CALL",
    ])
    at = [ln for ln in lines if ln.startswith("test_strict.py:")]
    assert at == [f"test_strict.py:{_line('test_strict.py', tag)}: in {func}" for tag, func in (
        ("STRICT-CALL", "test_strict_promotes"), ("STRICT-HELPER", "run"), ("STRICT-FORWARD", "forward"))], lines
    errors = [ln for ln in lines if ln.startswith("E ")]
    assert errors[0].startswith("E   torchdoctor.PlacementError: dtype problem in `<root>` (Scaled) at "
                                "aten.mul.Tensor: arg 1 (other) is float32 and promotes"), errors
    assert any("culprit scale" in ln for ln in errors) and any("model.scale" in ln for ln in errors)
    assert lines.index(next(ln for ln in lines if ln.startswith("E "))) > lines.index(at[-1])


def test_virtual_marker_points_at_the_call_line_then_the_forward_line(shared: str) -> None:
    lines = _section(shared, "test_sim_forward")
    _in_order(lines, [
        f"test_forward.py:{_line('test_forward.py', 'SIM-CALL')}: in test_sim_forward",
        "    model(x)  # SIM-CALL",
        f"test_forward.py:{_line('test_forward.py', 'SIM-FORWARD')}: in forward",
        "    return h * self.mask  # SIM-FORWARD",
        "E   torchdoctor.PlacementError: 1 placement problem(s) on virtual cuda:1*",
        "E     device mask f32?4?@cpu is on cpu *",  # fnmatch: [4] would be a class
    ])
    assert not any("session.py" in ln or "runtime.py" in ln for ln in lines)  # no frame of the simulator


def test_marker_says_where_its_expectation_came_from_and_proves_its_fix(shared: str) -> None:
    lines = _section(shared, "test_promotes")
    where = "@pytest.mark.simulate(device='cuda:0', dtype='bfloat16', profile='t4')"
    _in_order(lines, [f"E   *expected: cuda:0 bfloat16 on NVIDIA T4 16GB (device from {where}; dtype from "
                      f"{where}; profile from {where})"])
    text = "\n".join(lines)
    assert "surfaced at aten.mul.Tensor: scale f32[4]@cuda:0 is float32 while aten.mul.Tensor computes in " \
           "bfloat16 and promotes it to float32 silently" in text
    assert "m.scale.data = m.scale.data.to(torch.bfloat16)" in text and "model.scale" not in text
    line = _line("test_promotes.py", "PROMOTES-FORWARD")
    assert f"# fix proven (at the failing op aten.mul.Tensor at test_promotes.py:{line}: " in text
    assert "fix unproven" not in text


def test_summaries_read_like_pytest_and_assert_placement_is_hidden(shared: str) -> None:
    _in_order(_section(shared, "test_sim"), [
        "test_suite.py:10: in test_sim",
        '    m.extra[0](m(torch.ones(1, 4, device="cuda:1")))',
        "E   torchdoctor.PlacementError: * placement problem(s) on virtual cuda:1*",
    ])
    lines = _section(shared, "test_assert")
    _in_order(lines, [
        "test_suite.py:13: in test_assert",
        "    torchdoctor.assert_placement(nn.Linear(2, 2), dtype=torch.bfloat16)",
        "E   AssertionError: placement is not dtype=bfloat16: 2 problem(s)",
    ])
    assert not any("def assert_placement" in ln or "_scan/scan.py" in ln for ln in lines)
    summary = shared.split("short test summary info", 1)[1].splitlines()
    for test in ("test_sim", "test_upcast", "test_strict_promotes"):
        row = next(ln for ln in summary if f"::{test} " in ln)
        assert " - torchdoctor.PlacementError: " in row and " E " not in row, row


def test_strict_option_names_a_real_error_by_path(shared: str) -> None:
    text = "\n".join(_section(shared, "test_broken"))
    assert "PlacementError" in text and "0.bias" in text and "float32" in text, text
    assert "site-packages/torch" not in text  # the error, not a wall of internals

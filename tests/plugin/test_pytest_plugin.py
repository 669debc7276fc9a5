"""The pytest plugin, driven by ``pytester``: for each option, fixture and marker a passing and a failing suite,
the failing ones failing for the right reason with the tensor path in the output."""

from __future__ import annotations

import os
import sys

import pytest

pytest_plugins = ["pytester"]

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where support/ lives

# A bf16 Linear whose bias was left in float32: real CPU kernels refuse it, guard names the path.
BROKEN_LINEAR = """
import torch
def build(broken):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4)).to(torch.bfloat16)
    if broken:
        model[0].bias.data = model[0].bias.data.float()
    return model
"""


def _run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    # a subprocess, as a user runs it: an in-process run would drop the torch modules it imported afterwards
    # (pytester restores sys.modules), and importing torch's extensions twice in one process crashes it
    pytester.makepyfile(test_suite=source)
    return pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", *args, timeout=600)


def test_header_says_what_is_on(pytester: pytest.Pytester) -> None:
    # (the header of a --torchdoctor=strict run is checked in test_plugin_shared.py's shared run)
    result = _run(pytester, "def test_ok():\n    pass\n")
    result.stdout.fnmatch_lines(["torchdoctor: off*"])


def test_bad_option_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "def test_ok():\n    pass\n", "--torchdoctor=loud")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*invalid choice: 'loud'*"])


@pytest.mark.parametrize("mode", ["explain"])  # strict: the same suite in test_plugin_shared.py's shared run
def test_option_passing_and_failing_suites(pytester: pytest.Pytester, mode: str) -> None:
    source = BROKEN_LINEAR + """
def test_clean():
    assert build(False)(torch.ones(2, 4, dtype=torch.bfloat16)).dtype == torch.bfloat16

def test_broken():
    build(True)(torch.ones(2, 4, dtype=torch.bfloat16))
"""
    result = _run(pytester, source, f"--torchdoctor={mode}")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "PlacementError" in out and "0.bias" in out and "float32" in out, out
    assert "site-packages/torch" not in out  # the error, not a wall of internals


def test_option_off_leaves_errors_alone(pytester: pytest.Pytester) -> None:
    source = BROKEN_LINEAR + """
def test_broken():
    build(True)(torch.ones(2, 4, dtype=torch.bfloat16))
"""
    result = _run(pytester, source)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "RuntimeError" in out and "PlacementError" not in out


def test_strict_option_catches_a_silent_meta_weight(pytester: pytest.Pytester) -> None:
    """On CPU a meta weight in a Linear returns garbage without an error: strict names it."""
    source = """
import torch
def build(broken):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    if broken:
        model[2].weight = torch.nn.Parameter(model[2].weight.to("meta"))
    return model

def test_clean():
    build(False)(torch.ones(1, 4))

def test_meta_weight():
    build(True)(torch.ones(1, 4))
"""
    assert _run(pytester, source).ret == pytest.ExitCode.OK  # without the plugin: silent garbage, "passes"
    result = _run(pytester, source, "--torchdoctor=strict")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*PlacementError*", "*2.weight*"])


def test_placement_guard_fixture_modes(pytester: pytest.Pytester) -> None:
    source = BROKEN_LINEAR + """
import pytest

@pytest.mark.placement_guard(mode="fix")
def test_fix_mode_runs_and_records(placement_guard):
    out = build(True)(torch.ones(2, 4, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
    assert [f.path for f in placement_guard.fixes] == ["0.bias"]

def test_default_mode_is_explain(placement_guard):
    assert placement_guard.mode == "explain"
    build(False)(torch.ones(2, 4, dtype=torch.bfloat16))

def test_explain_names_the_path(placement_guard):
    build(True)(torch.ones(2, 4, dtype=torch.bfloat16))
"""
    result = _run(pytester, source)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_explain_names_the_path*", "*PlacementError*"])
    assert "0.bias" in result.stdout.str()


def test_assert_placement_lists_paths_found_and_expected(pytester: pytest.Pytester) -> None:
    source = """
import torch, torchdoctor

def test_clean():
    torchdoctor.assert_placement(torch.nn.Linear(2, 2), device="cpu", dtype=torch.float32)

def test_left_behind():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)).to(torch.bfloat16)
    model[1].weight.data = model[1].weight.data.float()
    torchdoctor.assert_placement(model, dtype="bfloat16")

def test_report_compare():
    model = torch.nn.Linear(2, 2)
    model.scale = torch.ones(2, dtype=torch.float64)  # a plain attribute Module.to never casts
    model.to(torch.bfloat16)
    assert torchdoctor.scan(model, dtype=torch.bfloat16) == []
"""
    result = _run(pytester, source)
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "1.weight: found float32, expected bfloat16" in out, out
    assert "scale: found float64, expected bfloat16" in out, out


LORA_UNET = f"""
import sys
sys.path.insert(0, {TESTS!r})
import pytest, torch
from support import zoo

def unet_inputs(device):
    inputs = zoo.build("unet", torch.bfloat16).inputs
    return {{k: v.to(device) for k, v in inputs.items()}}
"""


def test_simulate_marker_lora_unet_on_cuda1(pytester: pytest.Pytester) -> None:
    source = LORA_UNET + """
@pytest.mark.simulate(device="cuda:1", dtype="bfloat16")
def test_moved_and_run(simulated_device):
    assert torch.cuda.is_available() and torch.cuda.device_count() == 2
    unet = zoo.lora_unet(torch.bfloat16, via="peft").to("cuda:1")
    out = unet(**unet_inputs(simulated_device)).sample
    assert out.device == torch.device("cuda:1") and out.dtype == torch.bfloat16

@pytest.mark.simulate(device="cuda:1", dtype="bfloat16")
def test_one_adapter_left_on_cpu():
    unet = zoo.lora_unet(torch.bfloat16, via="peft").to("cuda:1")
    name = next(n for n, _ in unet.named_modules() if n.endswith("attn1.to_q.lora_A.default"))
    unet.get_submodule(name).to("cpu")
    unet(**unet_inputs("cuda:1"))
"""
    result = _run(pytester, source)
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "attn1.to_q.lora_A.default.weight f32[4,4]@cpu (taken to cpu by `.to()` at test_suite.py:" in out, out
    assert "is on cpu when" in out
    assert "cuda:1" in out and "Fix:" in out
    assert "_virtual" not in out  # no simulator internals in the failure


def test_simulate_marker_small_suites(pytester: pytest.Pytester) -> None:
    source = """
import pytest, torch

pytestmark = pytest.mark.simulate("xpu")

def test_module_level_marker():
    assert torch.xpu.is_available() if hasattr(torch, "xpu") else True
    layer = torch.nn.Linear(4, 2).to("xpu")
    assert layer(torch.ones(3, 4, device="xpu")).device.type == "xpu"

@pytest.mark.simulate(device="mps")
def test_float64_on_mps():
    torch.nn.Linear(4, 2).to(torch.float64).to("mps")

@pytest.mark.simulate(device="cuda:1")
def test_bare_cuda_tensor_meets_cuda1_weights():
    layer = torch.nn.Linear(4, 2).to("cuda:1")
    layer(torch.ones(3, 4).cuda())   # .cuda() means cuda:0, the current device
"""
    result = _run(pytester, source)
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "unsupported_dtype" in out and "float64" in out, out
    assert "is on cuda:0 while" in out, out


def test_simulate_marker_needs_a_device_and_known_arguments(pytester: pytest.Pytester) -> None:
    source = """
import pytest

@pytest.mark.simulate(dtype="bfloat16")
def test_no_device():
    pass

@pytest.mark.simulate(device="cuda:1", colour="red")
def test_unknown():
    pass
"""
    result = _run(pytester, source)
    out = result.stdout.str() + result.stderr.str()
    assert "needs device=" in out and "unknown argument(s) ['colour']" in out, out
    assert result.ret != pytest.ExitCode.OK


def test_nothing_heavy_at_collection_and_nothing_left_behind(pytester: pytest.Pytester) -> None:
    """With the plugin loaded (entry point) and off, collection imports neither torch nor torchdoctor's verbs."""
    pytester.makepyfile(test_light="""
import sys

def test_first():
    heavy = [m for m in ("torch", "transformers", "rich", "torchdoctor._guard.api") if m in sys.modules]
    assert heavy == []
""")
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["torchdoctor: off*"])


def test_simulation_leaves_no_global_state(pytester: pytest.Pytester) -> None:
    source = """
import pytest, torch

@pytest.mark.simulate(device="cuda:1")
def test_inside():
    assert torch.cuda.is_available()

def test_after():
    assert not torch.cuda.is_available()
    assert torch.ones(1).device.type == "cpu"
"""
    _run(pytester, source, "-p", "no:randomly").assert_outcomes(passed=2)


@pytest.mark.simulate(device="cuda:1", dtype="bfloat16")
def test_this_suite_runs_under_the_marker_too(simulated_device: object) -> None:
    import torch

    layer = torch.nn.Linear(8, 8).to(simulated_device, torch.bfloat16)
    out = layer(torch.ones(2, 8, device="cuda:1", dtype=torch.bfloat16))
    assert out.device == torch.device("cuda:1") and sys.modules["torchdoctor._virtual.session"]


BROKEN_SUITE = BROKEN_LINEAR + """
def test_broken():
    out = build(True)(torch.ones(2, 4, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
"""


@pytest.mark.parametrize(("mode", "outcome"), [("fix", "passed"), ("warn", "passed"), ("strict", "failed")])
def test_ini_option_sets_the_mode(pytester: pytest.Pytester, mode: str, outcome: str) -> None:
    pytester.makeini(f"[pytest]\ntorchdoctor_mode = {mode}\n")
    result = _run(pytester, BROKEN_SUITE)
    result.assert_outcomes(**{outcome: 1})
    result.stdout.fnmatch_lines([f"torchdoctor: every test runs under guard(mode='{mode}'), from ini torchdoctor_mode"])
    if mode == "warn":  # the fp32 bias was let through, with one PlacementWarning naming it
        result.stdout.fnmatch_lines(["*PlacementWarning*0.bias*"])


def test_command_line_option_wins_over_the_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntorchdoctor_mode = fix\n")
    result = _run(pytester, BROKEN_SUITE, "--torchdoctor=strict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["torchdoctor: every test runs under guard(mode='strict')"])


def test_bad_ini_mode_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntorchdoctor_mode = loud\n")
    result = _run(pytester, "def test_ok():\n    pass\n")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*torchdoctor_mode = 'loud': expected one of off, explain, strict, fix, warn*"])


def test_pyproject_tool_table_sets_the_mode(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml("[tool.torchdoctor]\nmode = \"fix\"\n")
    result = _run(pytester, BROKEN_SUITE)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["torchdoctor: every test runs under guard(mode='fix'), from ?tool.torchdoctor? in *"])


SEED = f"""
import sys
sys.path.insert(0, {TESTS!r})
import pytest, torch
from support import zoo

@pytest.fixture
def old_quant_state_to(monkeypatch):
    from bitsandbytes.functional import QuantState
    real_to = QuantState.to
    def old_to(self, device):  # bitsandbytes < 0.45.3 did not move the code
        code = self.code
        real_to(self, device)
        self.code = code
    monkeypatch.setattr(QuantState, "to", old_to)

@pytest.mark.simulate(device="cuda:1")
@pytest.mark.parametrize("rows", [1, 2])
def test_flux_like_4bit_layer_on_second_gpu(old_quant_state_to, rows):
    model = zoo.bnb_linear4bit()
    model.to("cuda:1")
    model(torch.randn(rows, 64, device="cuda:1"))
"""


def test_simulate_marker_seed_quant_state_code_left_behind(pytester: pytest.Pytester) -> None:
    """The seed report: a 4-bit layer moved to cuda:1 with quant_state.code left behind fails under the marker with
    1-row and 2-row inputs (the CPU kernel path does not read the code; the module-entry check does)."""
    result = _run(pytester, SEED)
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert out.count("proj.weight.quant_state.code") >= 2, out

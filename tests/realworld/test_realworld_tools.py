"""Real-world use of simulate, explain, env, checkpoint scan and the CLI: bugs found by trying them as users do."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdoctor
from support.helpers import assert_unchanged
from torchdoctor._cli.main import main

# --- simulate ------------------------------------------------------------------------------------------------------


def test_float8_linear_on_a_gpu_is_unsupported() -> None:
    # a GPU computes float8 only through _scaled_mm: F.linear raises "addmm_cuda" not implemented for 'Float8_e4m3fn'
    model = nn.Sequential(nn.Linear(4, 4))
    for device in ("cuda:0", "xpu"):
        report = torchdoctor.simulate(model, (torch.randn(2, 4),), device=device, dtype="float8_e4m3fn")
        assert [p.kind for p in report.problems] == ["unsupported_dtype"], (device, report.problems)
        assert "float8_e4m3fn" in report.problems[0].message
    assert torchdoctor.simulate(model, (torch.randn(2, 4),), device="cuda:0", dtype="bfloat16").ok


def test_accelerate_cpu_offload_runs_under_simulate() -> None:
    accelerate = pytest.importorskip("accelerate")
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))

    def offloaded(m: nn.Module) -> torch.Tensor:
        accelerate.cpu_offload(m, execution_device=torch.device("cuda:0"))  # weights -> meta, rebuilt per forward
        assert isinstance(m[0].weight, nn.Parameter) and type(m[0].weight).__name__ == "VirtualParameter"
        return m(torch.ones(2, 4, device="cuda:0"))

    before = nn.Parameter.__dict__["__new__"]
    report = assert_unchanged(model, torchdoctor.simulate, model, device="cuda", call=offloaded, data="cpu")
    assert report.ok, report.problems
    assert nn.Parameter.__dict__["__new__"] is before and type(nn.Parameter(torch.ones(1))) is nn.Parameter


def test_parameter_rebuilt_by_user_code_keeps_its_path() -> None:
    model = nn.Sequential(nn.Linear(4, 4))

    def half_weight(m: nn.Module) -> torch.Tensor:
        m.to("cuda")
        m[0].weight = nn.Parameter(m[0].weight.to(torch.float16))
        return m(torch.ones(2, 4, device="cuda"))

    report = torchdoctor.simulate(model, device="cuda", call=half_weight)
    assert report.problems and {(p.kind, p.path) for p in report.problems} <= {("dtype", "0.weight"), ("dtype", "0.bias")}


# --- CLI -----------------------------------------------------------------------------------------------------------


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent("""
        import torch
        def build():
            return torch.nn.Sequential(torch.nn.Linear(4, 4))
    """))
    return path


@pytest.mark.parametrize("count", ["0", "-1"])
def test_simulate_count_below_one_is_usage_error(model_file: Path, count: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", f"{model_file}:build", "--device", "cuda", "--count", count]) == 2
    err = capsys.readouterr().err
    assert "--count" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["simulate", f"{model_file}:build", "--device", "cuda:1", "--count", "2"]) == 0


# --- explain -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "signature"), [
    ("RuntimeError: Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; "
     "but got torch.cuda.FloatTensor instead (while checking arguments for embedding)", "dtype.index_type"),
    ("IndexError: tensors used as indices must be long, int, byte or bool tensors", "dtype.index_type"),
    ("RuntimeError: Index put requires the source and destination dtypes match, got Half for the destination and "
     "Float for the source.", "dtype.write_source"),
    ("RuntimeError: index_add_(): self (Float) and source (Half) must have the same scalar type", "dtype.write_source"),
    ("RuntimeError: scatter(): Expected self.dtype to be equal to src.dtype", "dtype.write_source"),
    ("RuntimeError: Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: "
     "long int and  query.dtype: c10::BFloat16 instead.", "dtype.attn_mask"),
])
def test_index_and_write_dtype_errors_are_classified(text: str, signature: str) -> None:
    top = torchdoctor.explain(text)[0]
    assert (top.category, top.signature) == ("dtype_mismatch", signature)
    assert "{" not in top.what_happened and top.fixes


@pytest.mark.parametrize(("text", "category", "fix"), [
    ("RuntimeError: Placeholder storage has not been allocated on MPS device!", "device_mismatch", "x.to("),
    ("TypeError: can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
     "memory first.", "device_mismatch", ".cpu().numpy()"),
    ("RuntimeError: Expected a 'mps:0' generator device but found 'cpu'", "device_mismatch", "torch.Generator(device="),
    ("RuntimeError: Cannot access accelerator device when none is available.", "no_accelerator", "pick_device()"),
])
def test_more_placement_errors_are_classified(text: str, category: str, fix: str) -> None:
    top = torchdoctor.explain(text)[0]
    assert top.category == category and any(fix in code for _, code in top.fixes), top


@pytest.mark.parametrize("text", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.65 GiB",
    "RuntimeError: CUDA error: device-side assert triggered\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
    "RuntimeError: MPS backend out of memory (MPS allocated: 18.13 GB, other allocations: 384.00 KB)",
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x768 and 1024x320)",
])
def test_errors_that_are_not_placement_errors_get_no_diagnosis(text: str) -> None:
    assert torchdoctor.explain(text) == []


# --- env -----------------------------------------------------------------------------------------------------------


def _saved_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    import json

    assert main(["env", "--json"]) in (0, 1)
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("edit", ["cpu_flags", "dtypes", "row", "recommended"])
def test_env_facts_with_odd_values_render_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            edit: str) -> None:
    import json

    doc = _saved_env(tmp_path, capsys)
    doc["capabilities"] = {"device": "cpu", "probed": True, "recommended": "float32", "recommended_reason": "r",
                           "dtypes": {"float32": {"matmul": True}}}
    if edit == "cpu_flags":
        doc["facts"]["platform"]["cpu_flags"] = [1, "avx2", None]
    elif edit == "dtypes":
        doc["capabilities"]["dtypes"] = "x"
    elif edit == "row":
        doc["capabilities"]["dtypes"]["float32"] = [1, "a"]
    else:
        del doc["capabilities"]["recommended"]
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(doc))
    for extra in ([], ["--json"]):
        assert main(["env", "--facts", str(path), *extra]) in (0, 1)
        assert "Traceback" not in capsys.readouterr().err


# --- CLI targets ---------------------------------------------------------------------------------------------------

TARGETS = textwrap.dedent("""
    import sys
    import torch

    def exits():
        sys.exit("bye")  # exit code 1 would read as "problems found"

    def returns_nothing():
        m = torch.nn.Linear(2, 2)

    def wrong_shape():
        return torch.nn.Linear(2, 2), (torch.ones(1, 3),)
""")


@pytest.mark.parametrize(("verb", "name", "needle"), [
    ("scan", "exits", "sys.exit('bye')"), ("simulate", "exits", "sys.exit('bye')"),
    ("scan", "returns_nothing", "is None"), ("simulate", "returns_nothing", "is None"),
    ("simulate", "wrong_shape", "RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
])
def test_targets_that_fail_give_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str,
                                                   name: str, needle: str) -> None:
    (tmp_path / "targets.py").write_text(TARGETS)
    assert main([verb, f"{tmp_path / 'targets.py'}:{name}", "--device", "cuda:0"]) == 2
    out = capsys.readouterr()
    assert needle in out.err and len(out.err.strip().splitlines()) == 1 and "Traceback" not in out.err
    assert "bye" not in out.out


def test_script_that_exits_on_import_is_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "script.py").write_text("import sys\nsys.exit(3)\n")
    assert main(["simulate", f"{tmp_path / 'script.py'}:model", "--device", "cuda"]) == 2
    assert "sys.exit(3)" in capsys.readouterr().err


# --- simulate: how real scripts move and run models ----------------------------------------------------------------


@pytest.mark.parametrize("move", [
    lambda m: m.to(device="cuda:1"), lambda m: m.to(1), lambda m: m.to(device=1, dtype=torch.float16),
    lambda m: m.to(torch.device(1)),
])
def test_module_to_with_device_keyword_or_int_moves(move: object) -> None:
    # Module.to(device=...) was parsed as a tensor factory and left every weight on the cpu (a false positive);
    # Module.to(local_rank) asked the absent runtime which device 1 is
    model = nn.Sequential(nn.Linear(4, 4))

    def run(m: nn.Module) -> torch.Tensor:
        move(m)  # type: ignore[operator]
        return m(torch.ones(2, 4, device="cuda:1", dtype=m[0].weight.dtype))

    report = torchdoctor.simulate(model, device="cuda:1", call=run)
    assert report.ok, report.problems


def test_default_device_compile_and_cuda_housekeeping_are_simulated() -> None:
    model = nn.Sequential(nn.Linear(4, 4))

    def run(m: nn.Module) -> torch.Tensor:
        torch.set_default_device("cuda:1")
        try:
            x = torch.randn(2, 4)  # made on the default device
        finally:
            torch.set_default_device(None)
        torch.cuda.ipc_collect()
        return torch.compile(m.to("cuda:1"))(x)

    report = torchdoctor.simulate(model, device="cuda:1", call=run)
    assert report.ok, report.problems
    assert torch.get_default_device() == torch.device("cpu")


def test_a_default_device_set_inside_call_does_not_outlive_the_simulation() -> None:
    import torch

    import torchdoctor

    def run(copy: torch.nn.Module) -> None:
        torch.set_default_device("cuda:1")  # and never reset, as scripts do
        copy.to("cuda:1")
        copy(torch.ones(1, 2))

    report = torchdoctor.simulate(torch.nn.Linear(2, 2), device="cuda:1", call=run)
    assert report.ok, report.problems
    assert torch.get_default_device() == torch.device("cpu") and torch.ones(1).device.type == "cpu"
    assert torch._C._len_torch_function_stack() == 0

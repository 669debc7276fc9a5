"""``ExplainReport`` (a drop-in for the old list), ``Diagnosis`` text, alternatives in JSON and the CLI, the token
parser shared with guard, and explain working where torch cannot be imported."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

import torchdoctor
from torchdoctor._cli.main import main
from torchdoctor._explain.api import Diagnosis, ExplainReport, explain
from torchdoctor._explain.tokens import devices_in, dtypes_in

CPU_GPU = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
MASK = "RuntimeError: mixed dtype (CPU): expect parameter to have scalar type of Float"


def test_report_is_a_drop_in_for_the_old_list() -> None:
    report = torchdoctor.explain(CPU_GPU + "\n" + MASK)
    assert isinstance(report, ExplainReport) and type(report).__module__ == "torchdoctor"
    assert len(report) == 2 and bool(report) and not report.ok
    assert {d.category for d in report} == {"device_mismatch", "dtype_mismatch"}
    first, *rest = report
    assert first is report[0] and report[-1] is rest[-1] and report[:1] == [first]
    assert report[0] in report and report.index(report[1]) == 1
    assert list(report) == list(report.diagnoses)
    empty = explain("all fine")
    assert empty == [] and not empty and empty.ok and len(empty) == 0 and list(empty) == []
    with pytest.raises(IndexError):
        empty[0]


def test_report_text_and_dict() -> None:
    report = explain(CPU_GPU)
    text = str(report)
    assert text.startswith("torchdoctor explain: 1 error(s) recognised, best first")
    assert "\n  or: quantization_device (" in text and 'model.to("cuda:0")' in text
    doc = report.to_dict()
    assert doc["schema"] == "torchdoctor/explain/1" and doc["source"] is None
    alts = doc["diagnoses"][0]["alternatives"]
    assert [a["category"] for a in alts][:1] == ["quantization_device"]
    assert set(alts[0]) == {"category", "confidence", "why"} and 0 < alts[0]["confidence"] < 0.9
    json.dumps(doc)
    assert str(explain("nothing here")) == "torchdoctor explain: no known device/dtype error found"


def test_diagnosis_str_is_readable() -> None:
    d = explain(CPU_GPU)[0]
    s = str(d)
    assert isinstance(d, Diagnosis) and not s.startswith("Diagnosis(")
    assert s.splitlines()[0] == "device_mismatch (0.90): Tensors on two devices met in one operation"
    assert "  fixes:" in s and "  confirm with: torchdoctor.scan" in s and "  > RuntimeError" in s
    assert repr(explain(CPU_GPU)) == "ExplainReport(1 diagnoses: [device_mismatch])"


def test_cli_shows_alternatives(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.log"
    path.write_text(CPU_GPU + "\n", encoding="utf-8")
    assert main(["explain", str(path)]) == 1
    assert "  or: quantization_device (" in capsys.readouterr().out
    assert main(["explain", str(path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == str(path) and doc["diagnoses"][0]["alternatives"][0]["why"]


@pytest.mark.parametrize("text,devices", [
    ("found at least two devices, cuda:0 and cpu!", ["cuda:0", "cpu"]),
    ("found at least two devices, CPU and CUDA:0!", ["cpu", "cuda:0"]),
    ("Input type (CUDABFloat16Type) and weight type (torch.FloatTensor)", ["cuda:0", "cpu"]),
    ("Input type (torch.cuda.FloatTensor) and weight type (torch.xpu.HalfTensor)", ["cuda:0", "xpu:0"]),
    ("Tensor on device meta is not on the expected device mps:1!", ["meta", "mps:1"]),
    ("[(torch.Size([4]), device(type='cuda', index=1)), (torch.Size([2]), device(type='cpu'))]", ["cuda:1", "cpu"]),
    ("argument #1 'self' is on CPU, but expected it to be on GPU", ["cpu", "cuda:0"]),
    ("Torch not compiled with CUDA enabled; torch.cuda.is_available() is False", ["cuda:0"]),
    ("in method wrapper_CUDA_addmm, cpu_offload, CUDA_VISIBLE_DEVICES, xpu.optimize", []),
    ("Could not run 'aten::add' from the 'XPU' backend. cuda cuda:0 CUDA", ["xpu:0", "cuda:0"]),
])
def test_devices_in(text: str, devices: list[str]) -> None:
    assert devices_in(text) == devices


@pytest.mark.parametrize("text,dtypes", [
    ("expected m1 and m2 to have the same dtype, but got: struct c10::Half != float", ["float16", "float32"]),
    ("Input type (CUDABFloat16Type) and weight type (torch.cuda.HalfTensor)", ["bfloat16", "float16"]),
    ("query.dtype: c10::BFloat16 key.dtype: float and value.dtype: double", ["bfloat16", "float32", "float64"]),
    ("result type Float can't be cast to the desired output type long int", ["float32", "int64"]),
    ("Expected object of scalar type torch.float16 but got torch.float8_e4m3fn", ["float16", "float8_e4m3fn"]),
    ("Found dtype Long but expected Float", ["int64", "float32"]),
    ("torch.float32 torch.float32 Half", ["float32", "float16"]),
    ("Could not run 'aten::add' with arguments from the 'CUDA' backend", []),
])
def test_dtypes_in(text: str, dtypes: list[str]) -> None:
    assert dtypes_in(text) == dtypes


def test_explain_without_torch() -> None:
    """The explain API imports and diagnoses with ``import torch`` failing (a machine that only reads logs)."""
    code = r'''
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
        return None
sys.meta_path.insert(0, Block())
from torchdoctor._explain import api
from torchdoctor._explain.tokens import devices_in
report = api.explain("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, "
                     "cuda:0 and cpu!")
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch."))
try:
    import torch
except ImportError:
    pass
else:
    raise SystemExit("torch was importable")
print(report[0].category, report[0].fixes[0][1], devices_in("CPU and CUDA:0"))
'''
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "device_mismatch model.to(\"cuda:0\") ['cpu', 'cuda:0']"

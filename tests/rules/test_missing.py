"""The ops a backend has no kernel for (``_rules.missing``) are checked against torch's own op table: each has a CPU
and a CUDA kernel and neither a kernel for that backend nor a composite that would decompose it there."""

from __future__ import annotations

import os

import pytest

from torchdoctor._rules.missing import MISSING, lacks, missing_fix


def _table() -> list[dict]:
    torchgen = pytest.importorskip("torchgen")
    path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native", "native_functions.yaml")
    if not os.path.exists(path):
        pytest.skip("this torchgen carries no native_functions.yaml")
    yaml = pytest.importorskip("yaml")
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _keys(entry: dict) -> set[str]:
    return {k.strip() for key in (entry.get("dispatch") or {}) for k in key.split(",")}


def test_every_listed_mps_op_lacks_an_mps_kernel_in_torchs_table() -> None:
    by_name: dict[str, list[dict]] = {}
    for e in _table():
        by_name.setdefault("aten::" + e["func"].split("(")[0].split(".")[0], []).append(e)
    for op in MISSING["mps"]:
        entries = by_name.get(op)
        assert entries, f"{op} is not an op of this torch"
        # the overloads a program calls: the one named, or the kernel it delegates to (structured ops)
        keys = set().union(*(_keys(e) for e in entries))
        assert "MPS" not in keys, f"{op} has an MPS kernel in this torch: drop it from _rules/missing.py"
        assert "CPU" in keys or "CPU, CUDA" in keys or any("CPU" in k for k in keys), op
        own = [e for e in entries if "." not in e["func"].split("(")[0]]
        assert own and not any(k.startswith("CompositeImplicit") for e in own for k in _keys(e)), op


def test_lacks_is_per_backend_and_the_fix_names_the_flag_and_the_line() -> None:
    assert lacks("mps", "aten::_int_mm") is not None
    assert lacks("cuda", "aten::_int_mm") is None and lacks("xpu", "aten::_int_mm") is None
    assert lacks("mps", "aten::mm") is None
    fix = missing_fix("mps", "aten::_int_mm", "app.py:13")
    assert fix.startswith("# aten::_int_mm at app.py:13 has no mps kernel: set PYTORCH_ENABLE_MPS_FALLBACK=1")
    assert "dequantize" in fix

"""The parts of a distributed check that need no process group: comparison of payloads, rendering, device
templates, wrapper paths, and what importing costs."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._distributed.compare import build_report
from torchdoctor._distributed.local import fill_device, scan_payload, strip_wrappers


def payload(rank: int, judged: str | None, tensors: dict[str, tuple[Any, ...]], host: str = "node0",
            error: str | None = None) -> dict[str, Any]:
    return {"rank": rank, "local_rank": rank, "host": host, "judged": judged, "error": error, "problems": [],
            "tensors": tensors, "count": len(tensors), "mesh": []}


ROW = ("cuda:{i}", "bfloat16", (4, 4), True, None, None)


def rows(i: int, **changes: Any) -> dict[str, tuple[Any, ...]]:
    base = {"w": (f"cuda:{i}", "bfloat16", (4, 4), True, None, "abc"), "b": (f"cuda:{i}", "bfloat16", (4,), True, None, "def")}
    base.update(changes)
    return base


def test_a_tensor_on_another_ranks_device_names_that_rank() -> None:
    report = build_report("check", [payload(0, "cuda:0", rows(0)), payload(1, "cuda:1", rows(1, b=("cuda:0", "bfloat16", (4,), True, None, "def")))])
    d = [x for x in report.disagreements if x.kind == "rank_device"]
    assert [(x.path, x.ranks, x.expected) for x in d] == [("b", (1,), "cuda:1")]
    assert d[0].message == "rank 1 holds b on cuda:0, the device of rank 0; its own device is cuda:1"


def test_two_ranks_on_one_device_of_one_host() -> None:
    same = build_report("check", [payload(0, "cuda:0", rows(0)), payload(1, "cuda:0", rows(0))])
    assert [(d.kind, d.ranks) for d in same.disagreements] == [("shared_device", (0, 1))]
    assert "Duplicate GPU detected" in same.disagreements[0].message
    other_hosts = build_report("check", [payload(0, "cuda:0", rows(0)), payload(1, "cuda:0", rows(0), host="node1")])
    assert other_hosts.ok


def test_majority_decides_who_is_blamed_and_a_tie_goes_to_the_lowest_rank() -> None:
    three = [payload(i, f"cuda:{i}", rows(i, w=(f"cuda:{i}", "float32" if i == 2 else "bfloat16", (4, 4), True, None, "abc")))
             for i in range(3)]
    (d,) = build_report("check", three).disagreements
    assert (d.kind, d.ranks, d.expected, dict(d.values)) == ("dtype", (2,), "bfloat16", {"bfloat16": (0, 1), "float32": (2,)})
    tie = [payload(i, f"cuda:{i}", rows(i, w=(f"cuda:{i}", "float32" if i else "bfloat16", (4, 4), True, None, "abc")))
           for i in range(2)]
    (d,) = build_report("check", tie).disagreements
    assert d.ranks == (1,) and d.expected == "bfloat16"


def test_checksums_compare_only_where_every_rank_hashed() -> None:
    differ = [payload(i, f"cuda:{i}", rows(i, w=(f"cuda:{i}", "bfloat16", (4, 4), True, None, "x" if i == 1 else "abc")))
              for i in range(3)]
    assert [(d.kind, d.path, d.ranks) for d in build_report("check", differ).disagreements] == [("checksum", "w", (1,))]
    unhashed = [payload(i, f"cuda:{i}", rows(i, w=(f"cuda:{i}", "bfloat16", (4, 4), True, None, None if i == 1 else "abc")))
                for i in range(3)]
    assert build_report("check", unhashed).ok


def test_failed_ranks_are_reported_and_left_out_of_the_comparison() -> None:
    report = build_report("check", [payload(0, "cuda:0", rows(0)), payload(1, None, {}, error="ValueError: boom")])
    assert report.failed == (1,) and not report.ok and report.exit_code() == 2
    assert not report.disagreements  # an empty table of a failed rank is not "every tensor missing"
    assert "rank 1 (node0 local_rank 1): FAILED: ValueError: boom" in report.text()


def test_a_whole_rank_in_another_dtype_renders_as_one_group() -> None:
    many = {f"layers.{i}.w": ("cuda:0", "bfloat16", (4,), True, None, None) for i in range(30)}
    odd = {k: ("cuda:1", "float32", (4,), True, None, None) for k in many}
    report = build_report("check", [payload(0, "cuda:0", many), payload(1, "cuda:1", odd)])
    assert len(report.disagreements) == 30
    text = report.text()
    assert "dtype         rank 1: 30 tensors, e.g. layers.0.w has a different dtype across ranks" in text
    assert "(+25 more)" in text and len(text.splitlines()) < 10
    doc = report.to_dict()
    assert doc["schema"] == "torchdoctor/distributed/1" and len(doc["disagreements"]) == 30
    assert doc["disagreements"][0]["values"] == {"bfloat16": [0], "float32": [1]}


def test_device_templates() -> None:
    assert fill_device("cuda:{local_rank}", rank=5, local_rank=1) == torch.device("cuda", 1)
    assert fill_device("xpu:{rank}", rank=3, local_rank=1) == torch.device("xpu", 3)
    assert fill_device(None, 0, 0) is None
    with pytest.raises(ValueError, match=r"only \{local_rank\} and \{rank\} are filled"):
        fill_device("cuda:{gpu}", 0, 0)


def test_wrapper_segments_are_dropped_from_paths() -> None:
    assert strip_wrappers("module.layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.mlp.weight", True) == \
        "layers.0.mlp.weight"
    assert strip_wrappers("module.weight", False) == "module.weight"  # a user's own submodule called "module"
    assert strip_wrappers("_orig_mod.lin.weight", False) == "lin.weight"


def test_a_local_payload_is_plain_data_and_reads_the_one_policy() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[1].bias.data = model[1].bias.data.double()
    p = scan_payload(model, "cpu", None, True, 0, 0)
    assert [(d["kind"], d["path"]) for d in p["problems"]] == [(q.kind, q.path) for q in torchdoctor.scan(model, device="cpu").problems]
    assert p["tensors"]["1.bias"][:5] == ("cpu", "float64", (2,), True, None) and len(p["tensors"]["1.bias"][5]) == 32
    with pytest.raises(ValueError, match="a checkpoint path is scanned once"):
        scan_payload("model.safetensors", "cpu", None, False, 0, 0)


def test_check_without_a_process_group_says_what_to_do() -> None:
    with pytest.raises(RuntimeError, match=r"needs an initialised process group: call torch.distributed.init_process_group"):
        torchdoctor.distributed.check(nn.Linear(2, 2), device="cpu")


def test_importing_torchdoctor_loads_neither_the_distributed_package_nor_torch_distributed() -> None:
    code = ("import sys, torchdoctor; assert 'torchdoctor._distributed' not in sys.modules; "
            "assert 'torch.distributed' not in sys.modules, 'torch.distributed'; "
            "assert 'distributed' in torchdoctor.__all__; "
            "from torchdoctor import distributed as d; assert d.check is torchdoctor.distributed.check; "
            "assert 'torch.distributed.fsdp' not in sys.modules and 'torch.distributed.tensor' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]

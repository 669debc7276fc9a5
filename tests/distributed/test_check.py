"""``torchdoctor.distributed.check`` on real ranks over gloo: one 2-rank launch (nn.Module, DDP, FSDP2, DTensor) and
one 4-rank launch (a tiny transformers Llama with a bug planted on one rank), each running many scenarios."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distributed.launch import GROUP, WORKERS, assert_launched, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(GROUP)]


def _read(out: Path, nproc: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module")
def small(two_ranks: Path) -> list[dict[str, Any]]:
    """The ``small`` scenarios, from the 2-rank launch ``test_cli.py`` shares (``conftest.py``)."""
    return _read(two_ranks, 2)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("llama")
    assert_launched(torchrun(4, str(WORKERS / "check_scenarios.py"), str(out), "llama"))
    return _read(out, 4)


def _problems(report: dict[str, Any]) -> list[tuple[int, str, str]]:
    return [(r["rank"], p["kind"], p["path"]) for r in report["ranks"] for p in r["problems"]]


def _disagreements(report: dict[str, Any]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(d["kind"], d["path"], tuple(d["ranks"])) for d in report["disagreements"]]


def test_every_rank_gets_the_same_report(small: list[dict[str, Any]], llama: list[dict[str, Any]]) -> None:
    for ranks in (small, llama):
        for name in ranks[0]:
            assert all(r[name] == ranks[0][name] for r in ranks), name


def test_a_clean_ddp_model_is_quiet_and_paths_are_the_original_modules(small: list[dict[str, Any]]) -> None:
    report = small[0]["ddp_clean"]
    assert report["schema"] == "torchdoctor/distributed/1"
    assert report["ok"] and report["world_size"] == 2 and not report["disagreements"], report
    assert [r["tensors"] for r in report["ranks"]] == [6, 6]  # 0.weight ... 2.bias: no module. prefix, no aliases


def test_a_clean_fsdp2_model_is_quiet_before_and_after_a_step(small: list[dict[str, Any]]) -> None:
    for when in ("before", "after"):
        report = small[0]["fsdp2_clean"][when]
        assert report["ok"], (when, _problems(report), _disagreements(report))
        assert [r["tensors"] for r in report["ranks"]] == [6, 6], when  # FSDP's own state tensors are not the user's


def test_fsdp2_cpu_offload_and_mixed_precision_are_intended(small: list[dict[str, Any]]) -> None:
    offloaded = small[0]["fsdp2_cpu_offload_against_accelerator"]
    assert offloaded["ok"], _problems(offloaded)
    assert [r["device"] for r in offloaded["ranks"]] == ["cuda:0", "cuda:1"]  # {local_rank} filled per rank
    plain = small[0]["plain_cpu_against_accelerator"]  # the same model without FSDP2's policy: every tensor is wrong
    assert {(rank, kind) for rank, kind, _ in _problems(plain)} == {(0, "device"), (1, "device")}
    assert len(_problems(plain)) == 12
    assert small[0]["fsdp2_mixed_precision"]["ok"], _problems(small[0]["fsdp2_mixed_precision"])


def test_a_buffer_sharded_on_one_rank_and_replicated_on_another(small: list[dict[str, Any]]) -> None:
    report = small[0]["dtensor_sharded_here_replicated_there"]
    assert _disagreements(report) == [("placement", "1.running", (1,))]
    d = report["disagreements"][0]
    assert set(d["values"]) == {"dtensor cpu(2,) (Shard(dim=0),)", "dtensor cpu(2,) (Replicate(),)"}
    assert not _problems(report)


def test_a_tensor_parallel_model_is_quiet_and_described_by_its_mesh(small: list[dict[str, Any]]) -> None:
    report = small[0]["tensor_parallel_clean"]
    assert report["ok"], report.get("traceback") or (_problems(report), _disagreements(report))
    assert [r["tensors"] for r in report["ranks"]] == [4, 4]


def test_check_is_read_only(small: list[dict[str, Any]]) -> None:
    report = small[0]["read_only_fsdp2_with_checksums"]
    assert "raised" not in report, report.get("traceback")
    assert report["ok"] and report["checksums"]


def test_the_same_bad_argument_on_every_rank_raises_on_every_rank(small: list[dict[str, Any]]) -> None:
    for rank in small:
        result = rank["same_bad_argument_everywhere"]
        assert result["raised"] == "ValueError"
        assert "must be a floating dtype" in result["message"] and "(on every rank)" in result["message"]


def test_a_rank_specific_meta_weight_is_found_with_its_rank_and_path(llama: list[dict[str, Any]]) -> None:
    report = llama[0]["llama_meta_on_rank_2"]
    assert not report["ok"] and report["world_size"] == 4
    assert _problems(report) == [(2, "meta", "model.layers.0.mlp.down_proj.weight")]
    attr = llama[0]["llama_attribute_on_meta_on_rank_3"]
    assert _problems(attr) == [(3, "meta", "model.layers.1.self_attn.cache")]
    assert _disagreements(attr) == [("missing", "model.layers.1.self_attn.cache", (3,))]


def test_one_rank_in_another_dtype_is_found(llama: list[dict[str, Any]]) -> None:
    report = llama[0]["llama_bf16_on_rank_1"]
    assert not _problems(report)  # each rank alone is consistent: only the comparison sees it
    kinds = {(kind, ranks) for kind, _, ranks in _disagreements(report)}
    assert kinds == {("dtype", (1,))}
    first = next(d for d in report["disagreements"] if d["path"] == "model.layers.0.self_attn.q_proj.weight")
    assert first["values"] == {"float32": [0, 2, 3], "bfloat16": [1]} and first["expected"] == "float32"


def test_desynchronised_weights_requires_grad_and_extra_tensors(llama: list[dict[str, Any]]) -> None:
    report = llama[0]["llama_desync_freeze_extra"]
    assert sorted(_disagreements(report)) == [
        ("checksum", "lm_head.weight", (2,)),
        ("missing", "model.only_here", (3,)),
        ("requires_grad", "model.embed_tokens.weight", (1,)),
    ]
    checksum = next(d for d in report["disagreements"] if d["kind"] == "checksum")
    assert "replicated weights are out of sync" in checksum["message"]


def test_a_clean_ddp_llama_is_quiet_on_four_ranks(llama: list[dict[str, Any]]) -> None:
    report = llama[0]["llama_clean_ddp"]
    assert report["ok"], (_problems(report), _disagreements(report))


def test_a_rank_that_raises_does_not_hang_the_others(llama: list[dict[str, Any]]) -> None:
    for rank in llama:  # every rank returned, rank 3 included, and all know about rank 3's error
        report = rank["llama_rank_3_raises"]
        assert report["failed"] == [3] and not report["ok"]
        error = report["ranks"][3]["error"]
        assert error.startswith("ValueError: scan judges floating-point tensors against dtype=")
        assert all(r["error"] is None for r in report["ranks"][:3])

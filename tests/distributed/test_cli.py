"""``torchdoctor scan|simulate TARGET --distributed`` on real ranks: rank 0 prints, every rank exits alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distributed.launch import GROUP, WORKERS, torchrun
from support import hardware

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(GROUP)]
TARGETS = WORKERS / "targets.py"


@pytest.fixture(scope="module", params=hardware.BRANCHES)
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The runs on both of bitsandbytes' CPU import branches (its AVX512-BF16 one logs a line on every rank); the
    portable one comes from the 2-rank launch ``test_check.py`` shares (``conftest.py``), recorded there first."""
    if request.param == "portable":
        out = request.getfixturevalue("two_ranks") / "cli"
    else:
        out = tmp_path_factory.mktemp("cli")
        done = torchrun(2, str(WORKERS / "cli_runs.py"), str(out), branch=request.param)
        assert done.returncode == 0, done.stderr[-4000:]
    assert {(out / f"rank{r}.branch").read_text() for r in range(2)} == {request.param}
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_exit_codes_agree_on_every_rank_and_only_rank_0_prints(runs: list[dict[str, Any]]) -> None:
    expected = {"scan_clean": 0, "scan_float64_on_rank_1": 1, "scan_json_raise_on_rank_0": 2, "simulate_clean": 0,
                "scan_checkpoint_path": 2}
    for rank, results in enumerate(runs):
        assert {name: r["code"] for name, r in results.items()} == expected, rank
    # torchdoctor's own output: nothing on rank 1; what other libraries log is theirs (library_log), not counted
    assert [(n, r["stdout"], r["stderr"]) for n, r in runs[1].items() if r["stdout"] or r["stderr"]] == []
    assert runs[0]["scan_clean"]["stdout"].startswith("ok: 2 rank(s) checked")
    assert not runs[0]["scan_clean"]["stderr"] and not runs[0]["simulate_clean"]["stderr"]


def test_no_bitsandbytes_line_on_either_import_branch_when_the_target_never_uses_it(
        runs: list[dict[str, Any]]) -> None:
    # the targets never import bitsandbytes, and neither does torchdoctor (a virtual run imports it only when the
    # program does): its AVX512-BF16 branch's "Failed to load CPU gemm_4bit_forward from kernels-community" line,
    # logged at import, is nowhere in these runs, on either branch (the fixture checked which one each rank took)
    logged = [line for rank in runs for r in rank.values() for line in r["library_log"]]
    assert not [line for line in logged if "bitsandbytes" in line or "kernels-community" in line], logged
    assert not any("kernels-community" in r["stderr"] for rank in runs for r in rank.values())


def test_scan_names_the_rank_and_paths_in_the_wrong_dtype(runs: list[dict[str, Any]]) -> None:
    text = runs[0]["scan_float64_on_rank_1"]["stdout"]
    assert "rank 1 (" in text and "2 problem(s)" in text
    assert "out.weight" in text and "float64 on rank 1" in text
    assert "rank 0 (" in text and "ok, 4 tensor paths" in text


def test_a_rank_whose_target_fails_is_reported_in_json(runs: list[dict[str, Any]]) -> None:
    doc = json.loads(runs[0]["scan_json_raise_on_rank_0"]["stdout"])
    assert doc["schema"] == "torchdoctor/distributed/1" and doc["failed"] == [0]
    assert "rank 0 cannot build its model" in doc["ranks"][0]["error"]
    assert doc["ranks"][1]["ok"]


def test_the_same_usage_error_everywhere_is_one_line(runs: list[dict[str, Any]]) -> None:
    run = runs[0]["scan_checkpoint_path"]
    assert not run["stdout"]
    assert run["stderr"].startswith("torchdoctor scan: ")
    # TARGET is a .py file without ``:name``: the resolver's one line, said once for every rank
    assert "is a Python file, not a checkpoint" in run["stderr"] and run["stderr"].endswith("(on every rank)\n")


def test_simulate_on_four_cpu_ranks_finds_the_rank_that_computes_on_cuda_0(tmp_path: Path) -> None:
    done = torchrun(4, "-m", "torchdoctor", "simulate", f"{TARGETS}:target", "--distributed", "--device", "cuda",
                    "--json", env={"TD_BUG_RANK": "3", "TD_BUG": "cuda0"})
    assert done.returncode != 0  # problems found: exit 1 on the ranks
    doc = json.loads(done.stdout[done.stdout.index("{"):])
    assert doc["verb"] == "simulate" and doc["world_size"] == 4 and not doc["failed"]
    assert [r["device"] for r in doc["ranks"]] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert [r["ok"] for r in doc["ranks"]] == [True, True, True, False]
    problem = doc["ranks"][3]["problems"][0]
    assert problem["kind"] == "device" and problem["found"] == "cuda:0" and problem["expected"] == "cuda:3"
    assert done.stdout.count('"schema"') == 1  # rank 0 alone printed


def test_a_bare_cuda_call_lands_on_cuda_0_on_every_rank_as_on_a_real_node() -> None:
    # torchrun sets no current device: a program that never calls set_device puts ``.cuda()`` on cuda:0 on every
    # rank, as simulate() and run see it (the CLI used to make cuda:LOCAL_RANK current and found nothing)
    done = torchrun(2, "-m", "torchdoctor", "simulate", f"{TARGETS}:target", "--distributed", "--device", "cuda",
                    "--json", env={"TD_BUG_RANK": "1", "TD_BUG": "dotcuda"})
    assert done.returncode != 0, done.stderr[-2000:]
    doc = json.loads(done.stdout[done.stdout.index("{"):])
    assert [r["ok"] for r in doc["ranks"]] == [True, False]
    problem = doc["ranks"][1]["problems"][0]
    assert problem["kind"] == "device" and problem["found"] == "cuda:0" and problem["expected"] == "cuda:1"


def test_without_torchrun_it_is_a_usage_error() -> None:
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                                           "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-m", "torchdoctor", "scan", f"{TARGETS}:model", "--distributed"],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 2
    assert "--distributed runs under torchrun, e.g. `torchrun --nproc-per-node 2 -m torchdoctor scan" in done.stderr

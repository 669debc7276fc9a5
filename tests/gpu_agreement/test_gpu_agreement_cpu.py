"""bench/gpu_agreement.py without a GPU: the zoo builds, every tool answers on the CPU, the comparison flags planted
and real disagreements, and the hardware-mode verdicts (which only a GPU run exercises end to end) are judged here
on rows written as the hardware run writes them."""

from __future__ import annotations

import json
import pathlib
import runpy
import sys
from typing import Any

import pytest
import torch

import gpu_agreement as ga
import gpu_agreement_cases as cases
import gpu_agreement_models  # noqa: F401  (registers the model cases)
from gpu_agreement_table import markdown

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ("simulate", "virtual_devices", "move", "trace")


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One --quick cpu-check run, shared: the imports and the first virtual run are paid once."""
    out = tmp_path_factory.mktemp("quick")
    rc = ga.main(["--device", "cpu-check", "--quick", "--repeats", "1", "--out", str(out)])
    result = json.loads((out / "gpu_agreement.json").read_text())
    result["rc"] = rc
    result["md"] = (out / "gpu_agreement.md").read_text()
    return result


def test_the_zoo_has_every_seed_mechanism_and_the_controls() -> None:
    names = [c.name for c in cases.CASES]
    assert len(names) >= 30 and len(set(names)) == len(names)
    failing = " | ".join(c.mechanism for c in cases.CASES if c.expect == "raises")
    for seed in ("plain attribute left behind", "list-held module", "LoRA bias restored on the CPU",
                 "fp32 adapter in a bf16 model", "quant_state-like", "CPU generator", "CPU indices into",
                 "made on the CPU inside forward", "float8 weights in a plain", "too big for the card",
                 "training step with a gradient on the wrong device"):
        assert seed in failing, seed
    controls = " | ".join(c.mechanism for c in cases.CASES if c.expect == "runs")
    for control in ("offload", "fp32 norm", "per-call casting", "per call"):
        assert control in controls, control
    assert all(c.mechanism.startswith("control:") == (c.expect == "runs") for c in cases.CASES)
    assert all(c.kind in ("device", "dtype", "memory") for c in cases.CASES if c.expect == "raises")
    kinds = {getattr(c.make(), "__class__").__module__.split(".")[0] for c in cases.CASES}  # every case builds
    assert {"transformers", "peft", "gpu_agreement_cases"} <= kinds


def test_the_quick_subset_agrees_and_every_tool_answers(quick: dict[str, Any]) -> None:
    rows = {r["case"]: r for r in quick["cases"]}
    assert quick["rc"] == 0 and quick["mode"] == "cpu-check" and quick["disagreements"] == 0
    assert set(rows) == {c.name for c in cases.CASES if c.quick}
    for name, r in rows.items():
        for tool in TOOLS:
            assert r[tool] is None or "broken" not in r[tool], (name, tool, r[tool])
        assert all("broken" not in g for g in r["guard"].values()), (name, r["guard"])
        assert f"| `{name}` |" in quick["md"]
    # what each side said, pinned where the answer is known
    assert rows["attr_left_behind"]["simulate"]["problems"][0]["path"] == "scale"
    assert rows["lora_bias_restored_cpu"]["virtual_devices"]["problems"][0]["path"].endswith("lora_B.default.bias")
    f8 = rows["float8_plain_linear"]
    assert f8["real"]["raises"] and "must have the same dtype" in f8["real"]["error"]
    assert f8["guard"]["explain"]["named"][0] == "lin.weight" and f8["guard"]["fix"]["fixes"] == 1
    assert f8["explain"]["category"] == "dtype_mismatch"
    assert rows["offload_hooks"]["move"]["refused"].startswith("PlacementError: move refused")
    assert rows["cpu_scalar_tensor"]["simulate"]["ok"] and rows["cpu_scalar_tensor"]["overhead"]["same_output"]
    assert rows["train_target_cpu"]["overhead"]["same_output"]  # two fresh objects, seeded alike
    assert "cpu-check run" in quick["md"] and "torch " + torch.__version__ in quick["md"]


@pytest.mark.parametrize("plant", ga.PLANTS)
def test_a_planted_disagreement_is_flagged(plant: str, tmp_path: pathlib.Path, quick: dict[str, Any]) -> None:
    rc = ga.main(["--device", "cpu-check", "--only", "buffer_registered", "--plant", plant, "--repeats", "1",
                  "--out", str(tmp_path)])
    rows = {r["case"]: r for r in json.loads((tmp_path / "gpu_agreement.json").read_text())["cases"]}
    assert rc == 1
    assert rows["buffer_registered"]["disagreements"] == []
    assert [d.split(":")[0] for d in rows[f"planted_{plant}"]["disagreements"]] == [plant] * (
        2 if plant in ("missed", "unjustified") else 1)  # simulate and virtual_devices both, or the culprit once


def test_the_script_exits_non_zero_on_a_planted_disagreement(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # the script's own __main__ path, run in this process: a child Python would pay torch's import again
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts bench/ first: not for the tests after it
    monkeypatch.setattr(sys, "argv", ["gpu_agreement.py", "--device", "cpu-check", "--only", "attr_left_behind",
                                      "--plant", "missed", "--repeats", "1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(ROOT / "bench" / "gpu_agreement.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert exit_.value.code == 1
    assert "planted_missed" in out and "DISAGREES: missed: the hardware raised, simulate said ok" in out
    assert "1 disagreeing" in (tmp_path / "gpu_agreement.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--device", "npu"], "--device must be cuda:N or cpu-check, not 'npu'"),
    (["--device", "cpu-check", "--only", "nope"], "no case named nope; known: attr_left_behind"),
    (["--device", "cpu-check", "--repeats", "0"], "--repeats must be 1 or more, not 0"),
    (["--device", "cpu-check", "--compare-with", "/nonexistent.json"], "--compare-with /nonexistent.json: no such"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv: list[str], message: str, tmp_path: pathlib.Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    try:
        rc = ga.main([*argv, "--out", str(tmp_path)])
    except SystemExit as exc:  # --only is checked while the cases are selected
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


def test_bare_it_does_nothing_as_make_bench_all_runs_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert ga.main([]) == 0
    assert "nothing run; give --out DIR" in capsys.readouterr().out


def test_without_a_gpu_the_hardware_run_says_to_use_cpu_check(tmp_path: pathlib.Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the hardware run is what it should do")
    assert ga.main(["--out", str(tmp_path)]) == 2
    assert "has no CUDA GPU; use --device cpu-check" in capsys.readouterr().err


def test_a_spent_budget_lists_every_case_left_and_fails(tmp_path: pathlib.Path) -> None:
    rc = ga.main(["--device", "cpu-check", "--quick", "--budget-s", "0", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "gpu_agreement.json").read_text())
    assert rc == 1 and result["disagreements"] == len(result["cases"]) > 10
    assert "| `attr_left_behind` | not run: --budget-s 0 spent |" in (tmp_path / "gpu_agreement.md").read_text()

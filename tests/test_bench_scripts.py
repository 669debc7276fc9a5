"""The benchmark table's arithmetic and its child process (bench/table.py, bench/first_call.py)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

BENCH = pathlib.Path(__file__).resolve().parent.parent / "bench"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_summary_is_the_median_of_per_pair_ratios_not_the_ratio_of_medians() -> None:
    table = _load("table")
    # a load burst doubles both halves of the third pair: per-pair ratios stay 2, the ratio of medians would not
    ours = [2.0, 2.2, 8.0, 2.0, 2.4]
    anchor = [1.0, 1.1, 4.0, 1.0, 1.2]
    res = table.summary(ours, anchor)
    assert res["ratio"] == pytest.approx(2.0)
    assert (res["lo"], res["hi"], res["n"]) == (pytest.approx(2.0), pytest.approx(2.0), 5)
    assert res["ours"] == 2.2 and res["anchor"] == 1.1


def test_pairs_alternate_the_order() -> None:
    table = _load("table")
    calls: list[str] = []
    res = table.pairs(lambda: calls.append("ours"), lambda: calls.append("anchor"), 5, warm=0,
                      clock=iter(range(100)).__next__)
    assert calls == ["ours", "anchor", "anchor", "ours", "ours", "anchor", "anchor", "ours", "ours", "anchor"]
    assert res["n"] == 5


def test_a_failed_goal_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    table = _load("table")
    table.ROWS.clear()
    table.row("x", "y", {"ratio": 2.0, "lo": 1.5, "hi": 2.5, "n": 5, "ours": 0.002, "anchor": 0.001}, 1.5,
              note="because of z")
    table.row("mbs", "", {"ratio": 90.0, "lo": 80.0, "hi": 95.0, "n": 5, "ours": 90.0, "anchor": 0},
              80, unit="MB/s", higher_is_better=True)
    assert [r["ok"] for r in table.ROWS] == [False, True]
    table.print_table()
    out = capsys.readouterr().out
    assert "| x | y | x2.00 (1.50–2.50, 5) | 2.0 ms / 1.0 ms | ≤ 1.5x | NO: because of z |" in out
    assert "| mbs |  | 90.0 (80.0–95.0, 5) | 90.0 MB/s | ≥ 80 | yes |" in out
    table.ROWS.clear()


def test_first_call_child_without_arguments_does_nothing() -> None:
    # `make bench` used to run every script in bench/: the child must not fail there
    out = subprocess.run([sys.executable, str(BENCH / "first_call.py")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "child of bench/table.py" in out.stdout


def test_first_call_child_reports_first_and_later(tmp_path: pathlib.Path) -> None:
    from safetensors.torch import save_file
    import torch

    path = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(2, 2)}, str(path))
    out = subprocess.run([sys.executable, str(BENCH / "first_call.py"), "checkpoint", str(path)],
                         capture_output=True, text=True, timeout=300, check=True)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["first"] > 0 and doc["later"] > 0


@pytest.mark.parametrize("kind,arg,pairs", [("scan", "8b", 2), ("move", "-", 1), ("trace", "-", 1),
                                            ("simulate", "8b", 1), ("depth_simulate", "llama:1", 1),
                                            ("depth_scan", "sdxl:1", 2)])
def test_pooled_child_reports_interleaved_pairs(kind: str, arg: str, pairs: int) -> None:
    # the scan, move-warm, trace and simulate rows pool the rounds of three fresh processes: each child prints its
    # own as one JSON line (simulate: ours and two anchors)
    out = subprocess.run([sys.executable, str(BENCH / "table.py"), "--child", kind, arg, str(pairs)],
                         capture_output=True, text=True, timeout=300, check=True)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    series = ["a", "b", "c"] if kind.endswith("simulate") else ["a", "b"]
    assert sorted(doc) == series
    assert all(len(doc[k]) == pairs and all(x > 0 for x in doc[k]) for k in series)


def test_an_unknown_child_is_an_error() -> None:
    out = subprocess.run([sys.executable, str(BENCH / "table.py"), "--child", "nope", "-", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown; the pooled rows are scan, move, trace, simulate" in out.stderr


def test_depth_rows_build_real_widths_at_1x_and_4x() -> None:
    # the rows that must hold at any depth (issue 43): the same widths, four times the repeated blocks
    import logging

    levels = {n: logging.getLogger(n).level for n in ("transformers", "diffusers")}  # shapes.quiet() sets them
    counts: dict[str, list[int]] = {}
    try:
        shapes = _load("shapes")
        _depth_rows(shapes, counts)
        flux, _ = shapes.flux(1)
    finally:
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)
    assert counts == {"flux": [6, 24], "llama": [4, 16]}
    assert flux.inner_dim == 3072 and flux.config.joint_attention_dim == 4096


def _depth_rows(shapes: Any, counts: dict[str, list[int]]) -> None:
    for name, blocks in (("flux", lambda m: len(m.transformer_blocks) + len(m.single_transformer_blocks)),
                         ("llama", lambda m: len(m.model.layers))):
        built = {s: shapes.BUILDERS[name](s) for s in (1, 4)}
        counts[name] = [blocks(built[s][0]) for s in (1, 4)]
        assert all(p.is_meta for s in (1, 4) for p in built[s][0].parameters())
        assert all(not t.is_meta for t in built[1][1].values() if hasattr(t, "is_meta"))


def test_growth_is_the_ratio_of_pooled_medians() -> None:
    depth = _load("depth")
    docs = {1: [{"a": [1.0, 3.0, 2.0]}, {"a": [2.0]}], 4: [{"a": [8.0, 9.0]}, {"a": [7.0, 100.0]}]}
    # medians pooled over the processes of each depth: 2.0 at 1x, 8.5 at 4x
    assert depth.growth(docs, "a") == pytest.approx(4.25)


def test_growth_row_compares_growth_not_time(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 43 point 6: a row at 4x size is judged by how its time grew against how its anchor's grew."""
    table = _load("table")
    table.ROWS.clear()
    try:
        at1 = {"ratio": 1.0, "lo": 1.0, "hi": 1.0, "n": 5, "ours": 0.010, "anchor": 0.010}
        linear = {"ratio": 1.0, "lo": 1.0, "hi": 1.0, "n": 5, "ours": 0.040, "anchor": 0.040}
        faster = {"ratio": 1.5, "lo": 1.5, "hi": 1.5, "n": 5, "ours": 0.060, "anchor": 0.040}
        table.growth_row("a", "b", at1, linear)
        table.growth_row("c", "d", at1, faster)
        assert [(r["ratio"], r["ours"], r["anchor"], r["ok"]) for r in table.ROWS] == [
            (pytest.approx(1.0), pytest.approx(4.0), pytest.approx(4.0), True),
            (pytest.approx(1.5), pytest.approx(6.0), pytest.approx(4.0), False)]
        assert table.ROWS[1]["measure"] == "c: growth 4x/1x (time at 4x over time at 1x)"
        assert table.ROWS[1]["against"] == "d's growth"
        assert (table._scale("-"), table._scale("4")) == (1, 4)
    finally:
        table.ROWS.clear()
    capsys.readouterr()


def test_simulate_whole_rounds_rotate_and_its_ratio_is_the_median_of_per_round_ratios(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load("simulate_whole")
    calls: list[str] = []
    t = bench.rounds({k: (lambda k=k: calls.append(k)) for k in "abc"}, 3)
    assert calls[:3] == ["a", "b", "c"]  # the warm-up, then each round starts one later
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"] and all(len(v) == 3 for v in t.values())
    assert bench.ratio([2.0, 9.0, 3.0], [1.0, 3.0, 1.0]) == "x3.00 (2.00-3.00)"
    monkeypatch.setattr(sys, "argv", ["simulate_whole.py", "gpt:1"])
    with pytest.raises(SystemExit) as err:
        bench.main()
    assert err.value.code == 2 and "gpt:1: expected name:scale with name flux, sdxl or llama" in capsys.readouterr().err

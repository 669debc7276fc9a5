"""Every common option on every verb (issue 42 point 8): a walk over every verb's parser finds ``--color``, ``-q``
and ``--json`` with a help line each, and every option has help; each verb then runs with all three given."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
import torch

from torchdoctor._cli.main import main

from cli.test_cli_habits import verb_parsers

COMMON = ("--color", "-q", "--json")
VERBS = ("scan", "simulate", "explain", "env", "trace", "demo", "run")


def test_every_verb_takes_every_common_option_and_every_option_has_help() -> None:
    parsers = verb_parsers()
    assert sorted(parsers) == sorted(VERBS)
    lacking = [(verb, opt) for verb, p in parsers.items() for opt in COMMON if opt not in p._option_string_actions]
    assert lacking == []
    no_help = [(verb, a.dest) for verb, p in parsers.items() for a in p._actions
               if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert no_help == []
    assert all(p._option_string_actions["-q"] is p._option_string_actions["--quiet"] for p in parsers.values())


def test_each_verb_runs_with_color_never_quiet_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    common = ["--color", "never", "-q", "--json"]
    torch.save({"w": torch.ones(2)}, tmp_path / "ck.pt")
    (tmp_path / "prog.py").write_text("import torch\nm = torch.nn.Linear(2, 2).to(torch.float64)\nprint('hi')\n")

    assert main(["scan", "ck.pt", *common]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == "torchdoctor/scan/1"

    monkeypatch.setattr("sys.stdin", io.StringIO("RuntimeError: Expected all tensors to be on the same device, "
                                                 "but found at least two devices, cuda:0 and cpu!\n"))
    assert main(["explain", *common]) == 1
    assert json.loads(capsys.readouterr().out)["schema"] == "torchdoctor/explain/1"

    assert main(["env", *common]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["schema"] == "torchdoctor/env/1"

    assert main(["trace", *common, "prog.py"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("hi\n")  # the script's own output first, the document after it
    doc = json.loads(out[len("hi\n"):])
    assert doc["schema"] == "torchdoctor/trace/1" and doc["exit_code"] == 0 and doc["recorded"] >= 1
    assert doc["changes"] and "float64" in json.dumps(doc["changes"])
    assert err == f"torchdoctor trace: {len(doc['changes'])} change(s) shown, {doc['recorded']} recorded\n"  # -q

    assert main(["run", *common, "prog.py"]) == 0
    out, _ = capsys.readouterr()
    assert json.loads(out[len("hi\n"):])["ok"] is True

    assert main(["simulate", "--profile", "help", *common]) == 0
    assert "t4" in capsys.readouterr().out


def test_trace_without_quiet_still_shows_each_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prog.py").write_text("import torch\nm = torch.nn.Linear(2, 2).to(torch.float64)\n")
    assert main(["trace", "prog.py"]) == 0
    err = capsys.readouterr().err
    assert "float64" in err and err.count("\n") >= 2

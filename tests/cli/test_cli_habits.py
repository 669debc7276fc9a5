"""The command line's habits (issue 42, "CLI habits"): did-you-mean for verbs and options, ``torchdoctor help
[VERB]``, help text on every option of every verb, ``--color`` on every verb (``run`` included)."""

from __future__ import annotations

import argparse

import pytest

from torchdoctor._cli.main import _parser, main

VERBS = ["scan", "simulate", "explain", "env", "trace", "demo", "run"]


@pytest.mark.parametrize(("argv", "hint"), [
    (["scna", "x"], "invalid choice: 'scna'"),
    (["simluate", "x"], "invalid choice: 'simluate'"),
    (["scan", "x.pt", "--devcie", "cuda"], "unrecognized arguments: --devcie cuda; did you mean --device?"),
    (["scan", "x.pt", "--colour", "never"], "unrecognized arguments: --colour never; did you mean --color?"),
    (["env", "--jsno", "--markdwn"], "did you mean --json for --jsno, --markdown for --markdwn?"),
])
def test_a_near_miss_says_what_was_meant(argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and hint in err, err
    if argv[0] in ("scan", "env"):  # the verb whose option it was, as argparse names a verb's other errors
        assert err.startswith(f"torchdoctor {argv[0]}: unrecognized arguments: "), err
    if argv[0] in ("scna", "simluate"):
        assert err.endswith(f"did you mean {'scan' if argv[0] == 'scna' else 'simulate'!r}?")


def test_a_word_far_from_every_verb_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_help_and_help_verb(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["help"]) == 0
    out = capsys.readouterr().out
    assert "Find, explain and fix device and dtype placement bugs" in out
    assert "`torchdoctor help VERB` (or VERB --help) shows a verb's options." in " ".join(out.split())
    for verb in VERBS:
        assert main(["help", verb]) == 0
        assert capsys.readouterr().out.startswith(f"usage: torchdoctor {verb} ")
    assert main(["help", "scna"]) == 2
    assert capsys.readouterr().err.strip() == (
        "torchdoctor help: no verb 'scna' (verbs: scan, simulate, explain, env, demo, trace, run); did you mean 'scan'?")


def verb_parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_option_of_every_verb_has_help_and_every_verb_takes_color() -> None:
    parsers = verb_parsers()
    assert sorted(parsers) == sorted(VERBS)
    missing = [f"{verb} {'/'.join(a.option_strings) or a.dest}" for verb, p in parsers.items() for a in p._actions
               if not a.help and not isinstance(a, argparse._HelpAction)]
    assert missing == []
    assert [verb for verb, p in parsers.items() if "--color" not in p._option_string_actions] == []


def test_run_takes_color(tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--color", "never", "no_such_script_td.py"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized" not in err and "the script 'no_such_script_td.py' does not exist" in err

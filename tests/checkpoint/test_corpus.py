"""torchdoctor's verdicts on the comparison corpus (tests/checkpoint/corpus.py; bench/scanners.py runs the other
scanners on the same files): every payload is "can run code" and named, no benign file from a real library is,
and nothing runs."""

from __future__ import annotations

import os

import pytest

from torchdoctor._checkpoint.scan import CheckpointError, scan_checkpoint
from torchdoctor._checkpoint.unsafe import verdict

from . import corpus


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return root, corpus.build(root, str(root / "PWNED"))


def _can_run(report):
    return {p.found for p in report.problems if p.kind == "unsafe_global" and "can run code" in p.message}


def test_every_payload_is_named_as_running_code(cases):
    root, all_cases = cases
    payloads = [c for c in all_cases if c.kind == "payload"]
    assert len(payloads) >= 39
    for case in payloads:
        if case.refused:  # a payload the scan cannot see into (a link out of the archive): refused by name
            with pytest.raises(CheckpointError, match=case.refused):
                scan_checkpoint(case.path)
            continue
        report = scan_checkpoint(case.path)
        flagged = _can_run(report)
        assert flagged & set(case.names), (case.name, [p.message for p in report.problems])
        assert not report.ok
    assert not (root / "PWNED").exists()


def test_no_benign_file_is_called_dangerous(cases):
    root, all_cases = cases
    benign = [c for c in all_cases if c.kind == "benign"]
    assert {"training.ckpt", "optimizer.pt", "scheduler.pt", "gpt2-bin/pytorch_model.bin", "training_args.bin",
            "whole-gpt2.pt", "torchscript.pt"} <= {c.name for c in benign}
    for case in benign:
        report = scan_checkpoint(case.path)
        assert not _can_run(report), (case.name, [p.message for p in report.problems])


def test_hostile_files_are_never_ok(cases):
    _, all_cases = cases
    for case in (c for c in all_cases if c.kind == "hostile"):
        try:
            report = scan_checkpoint(case.path)
        except CheckpointError as exc:
            assert "\n" not in str(exc) and len(str(exc)) <= 400, case.name
            continue
        assert not report.ok, case.name


@pytest.mark.parametrize("name", [
    "torch.os.system", "torch.serialization.os.system", "torch.fx.graph_module._exec_with_source",
    "torch.utils.collect_env.run", "argparse._os.system", "pathlib.os.system", "pathlib.Path.touch",
    "torch.hub.load", "numpy.testing._private.utils.runstring", "transformers.pipeline", "torch.nn.Module.__init__",
    "argparse.Namespace.__init__", "collections.OrderedDict.fromkeys.__globals__", "torch.nn.modules.linear.os",
])
def test_verdict_is_exact_never_by_prefix(name):
    assert verdict(name).startswith("can run code")


def test_verdict_names_what_a_module_attribute_resolves_to():
    assert "(torch.os is the os module: this is os.system)" in verdict("torch.os.system")
    assert "(argparse._os is the os module: this is os.system)" in verdict("argparse._os.system")
    assert verdict("argparse.Namespace").startswith("a plain data type")
    assert verdict("torch.nn.modules.linear.Linear").startswith("a library class")


def test_allow_lists_cover_the_installed_torch():
    torch = pytest.importorskip("torch")
    from torch import _weights_only_unpickler

    from torchdoctor._checkpoint.names import WEIGHTS_ONLY

    assert set(_weights_only_unpickler._get_allowed_globals()) <= WEIGHTS_ONLY
    assert isinstance(torch.nn.Linear, type)


def test_protocol_0_text_file_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "notes.bin"
    path.write_bytes(b"(just some text, not a pickle)\n")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        scan_checkpoint(path)


def test_unregistered_extension_code_is_refused_as_torch_refuses_it(tmp_path):
    path = tmp_path / "ext.pkl"
    path.write_bytes(b"\x80\x02\x82\x05)R.")
    with pytest.raises(CheckpointError, match="extension code 5 is not registered"):
        scan_checkpoint(path)
    assert os.path.exists(path)

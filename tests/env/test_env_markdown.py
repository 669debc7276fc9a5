"""``torchdoctor env --markdown``: a block to paste into an issue, like ``accelerate env`` / ``diffusers-cli env``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchdoctor._cli.main import main
from torchdoctor._env.report import env_report

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "rules.json").read_text())


def launched_cpu_facts() -> dict:
    facts = json.loads(json.dumps(FIXTURES["base"]))
    facts.update(FIXTURES["rules"]["distributed_backend_missing"]["positive"][0])
    facts["env"] = {**facts["env"], "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "gpu-node-17.corp"}
    facts["python"] = {"version": "3.11.7", "executable": "/home/alice/venv/bin/python"}
    return facts


def test_markdown_has_a_fenced_block_of_key_facts_and_the_findings(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(launched_cpu_facts()))
    code = main(["env", "--facts", str(path), "--markdown"])
    out = capsys.readouterr().out
    assert code == 1  # the same exit code as the text form: an error finding
    lines = out.splitlines()
    assert lines[0] == "### Environment (`torchdoctor env --markdown`)"
    start, end = lines.index("```text"), lines.index("```")
    block = lines[start + 1:end]
    keys = [line.split(":", 1)[0] for line in block[:block.index("")]]
    assert keys == ["torchdoctor", "Python", "Platform", "OS", "torch", "Accelerators", "Drivers", "Available",
                    "Device choice", "Distributed", "Packages", "Variables"]
    assert block[block.index("") + 1].startswith("capabilities")  # then the dtype capability table (as the text)
    assert "torch:         2.13.0+cpu (build cpu)" in block
    assert "Distributed:   rank 0/2, local rank 0/2, master <set>:29500; backends: gloo" in block
    assert "**Findings**: 1 error(s), 0 warning(s), 1 info" in lines
    assert any(line.startswith("- **error** `distributed_backend_missing`: NCCL_DEBUG, NCCL_SOCKET_IFNAME set for NCCL")
               for line in lines)
    assert "  - fix: `pip install torch --index-url https://download.pytorch.org/whl/cu128" in out
    # nothing that identifies a user or a host goes into a public issue
    assert "gpu-node-17" not in out and "alice" not in out and "MASTER_ADDR=<set>" in out


def test_markdown_of_a_clean_machine_and_backticks_in_messages() -> None:
    report = env_report(FIXTURES["base"])
    text = report.markdown()
    assert "- **info** `cpu_only_build`:" in text and "Distributed:   not launched as a rank" in text
    assert text.count("```") == 2  # a finding's own backticks never close the block


def test_markdown_and_json_together_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "--markdown", "--json"]) == 2
    assert "--markdown and --json are two forms of the same report: choose one" in capsys.readouterr().err


def test_rank_facts_are_collected_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchdoctor._env.facts import collect_facts

    for k, v in {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "29500",
                 "NCCL_DEBUG": "WARN", "CCL_ZE_IPC_EXCHANGE": "sockets", "ZE_AFFINITY_MASK": "0"}.items():
        monkeypatch.setenv(k, v)
    facts = collect_facts()
    assert {k: facts["env"][k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT",
                                         "NCCL_DEBUG", "CCL_ZE_IPC_EXCHANGE", "ZE_AFFINITY_MASK")} == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "29500",
        "NCCL_DEBUG": "WARN", "CCL_ZE_IPC_EXCHANGE": "sockets", "ZE_AFFINITY_MASK": "0"}
    assert facts["distributed"] == {"available": True, "backends": ["gloo"]}  # this CPU build
    assert "rank 3/4, local rank 1/2" in env_report(facts).text()

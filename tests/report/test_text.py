"""Problem lists as people read them: grouped, width-bounded, each path once; rich only on a terminal; progress
only for slow work on a terminal; the frozen report and its JSON."""

from __future__ import annotations

import dataclasses
import io
import json
import time

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import torchdoctor
from support import zoo
from torchdoctor._report.progress import progress
from torchdoctor._report.terminal import emit, output_width, safe_text, use_color
from torchdoctor._report.text import group_problems, line_width, problem_fix, render_problems


@pytest.fixture(scope="module")
def meta_llama() -> torchdoctor.ScanReport:
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=24, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    return torchdoctor.scan(model, device="cpu")


def _meta_problems(report: torchdoctor.ScanReport) -> list[torchdoctor.Problem]:
    """One meta problem per tensor, as a verb that judges tensor by tensor reports them (the scan itself now sums a
    model built on meta up in one line: ``test_meta_model_is_one_summary``)."""
    why = ("holds no data (meta) but should be on cpu; a forward on CPU may silently return garbage. Load or "
           "materialise it (load_state_dict(..., assign=True) or to_empty() then load).")
    return [torchdoctor.Problem("meta", t.path, t.role, "meta", "cpu", f"{t.path} {t.compact} {why}")
            for t in report.tensors if t.device.type == "meta"]


def test_alike_problems_of_a_meta_llama_print_as_one_line(meta_llama: torchdoctor.ScanReport) -> None:
    problems = _meta_problems(meta_llama)
    assert len(problems) == 24 * 9 + 5  # 24 layers, embed, norm, lm_head, two rotary buffers
    lines = render_problems(problems)
    group = [ln for ln in lines if "tensors under model.layers.*" in ln]
    assert group == [f"  meta {24 * 9} tensors under model.layers.* on meta: holds no data (meta) but should be on "
                     "cpu; a forward on CPU may silently return garbage. Load or materialise it "
                     "(load_state_dict(..., assign=True) or to_empty() then load)."]
    text = "\n".join(lines)
    assert "model.embed_tokens.weight" in text and "lm_head.weight" in text  # the lone ones stay by path
    assert len(lines) < 15
    assert sum(len(g.members) for g in group_problems(problems)) == len(problems)


def test_meta_model_is_one_summary(meta_llama: torchdoctor.ScanReport) -> None:
    lines = meta_llama.text().splitlines()
    assert len(lines) < 15 and "weights not loaded" in lines[1]


def test_lines_bounded_by_width_and_kind_column_never_overflows(meta_llama: torchdoctor.ScanReport) -> None:
    problems = [*_meta_problems(meta_llama)[:3], torchdoctor.Problem(
        "unsupported_dtype", "lm_head.weight", "parameter", "bfloat16", "float32",
        "cuda (capability 7.5) cannot run matmul in bfloat16 " + "because cuBLAS has no kernel " * 4)]
    with line_width(80):
        lines = render_problems(problems)
    assert lines and all(len(ln) <= 80 for ln in lines), lines
    kinds = [ln for ln in lines if ln.startswith("  ") and not ln.startswith("   ")]
    col = {ln.index(ln.split()[1], len(ln.split()[0]) + 2) for ln in kinds}
    assert len(col) == 1  # the path column starts at one place: the kind column is as wide as its longest kind
    assert render_problems(problems)[0].startswith("  unsupported_dtype lm_head.weight  cuda (capability 7.5)")


def test_simulate_prints_each_path_once() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    model.extra = [nn.Linear(4, 4)]  # a list-held module: .to() leaves it on cpu

    def run(m: nn.Module) -> None:
        m.to("cuda:1")
        m.extra[0](m(torch.ones(1, 4, device="cuda:1")))

    report = torchdoctor.simulate(model, device="cuda:1", call=run)
    assert {p.path for p in report.problems} == {"extra.0.weight", "extra.0.bias"}
    for line in report.text().splitlines():
        for path in ("extra.0.weight", "extra.0.bias"):
            assert line.count(path) <= 1, line


def test_problem_fix_is_code_for_the_path() -> None:
    assert problem_fix({"kind": "device", "path": "blocks.0.attn-1.weight", "expected": "cuda:0"}) == \
        "model.blocks[0]['attn-1'].weight.data = model.blocks[0]['attn-1'].weight.data.to('cuda:0')"
    assert problem_fix({"kind": "saved_device", "path": "w", "expected": "cpu"}, "ckpt.pt") == \
        "torch.load('ckpt.pt', map_location='cpu', weights_only=True)"
    assert problem_fix({"kind": "unsafe_global", "path": "w"}) is None


class _Terminal(io.StringIO):
    """A text stream that says it is a terminal, as a pty does."""

    def isatty(self) -> bool:
        return True


def test_rich_colours_only_on_a_terminal_and_never_with_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "1 problem(s) in m:\n  dtype 1.bias f64[4]@cpu is float64"
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    tty, pipe = _Terminal(), io.StringIO()
    emit(text, tty)
    emit(text, pipe)
    assert "\x1b[" in tty.getvalue() and "\x1b[" not in pipe.getvalue()
    assert pipe.getvalue() == text + "\n"
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(tty)
    plain = _Terminal()
    emit(text, plain)
    assert plain.getvalue() == text + "\n"


def test_control_characters_in_paths_are_escaped() -> None:
    hostile = "w\r\x1b[2K\x1b[8mhidden\u202e"
    out = io.StringIO()
    emit(f"  device {hostile}", out)
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue() and "\u202e" not in out.getvalue()
    assert safe_text(hostile) == "w\\x0d\\x1b[2K\\x1b[8mhidden\\u202e"


def test_output_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert output_width(io.StringIO()) is None  # a pipe gets whole lines
    monkeypatch.setenv("COLUMNS", "72")
    assert output_width(io.StringIO()) == 72


def test_progress_draws_only_on_a_terminal_after_the_delay_and_erases_itself() -> None:
    tty = _Terminal()
    with progress("reading", total=3, stream=tty, delay=0.05, interval=0.02) as p:
        p.advance()
        p.note("shard-1")
        time.sleep(0.3)
    out = tty.getvalue()
    assert "reading 1/3 shard-1" in out and out.endswith("\r")
    assert out.rsplit("\r", 2)[-2].strip() == ""  # the last thing written blanks the line
    quick = _Terminal()
    with progress("reading", stream=quick, delay=1.0):
        pass
    assert quick.getvalue() == ""  # work under the delay shows nothing
    for silent in (io.StringIO(), _Terminal()):
        with progress("reading", stream=silent, delay=0.0, interval=0.01, quiet=isinstance(silent, _Terminal)):
            time.sleep(0.1)
        assert silent.getvalue() == ""


def test_a_narrow_terminal_shortens_the_label_never_the_count_bar_or_time() -> None:
    """At 80 columns simulate's long label ("simulating app.py:target on virtual cuda:1 (NVIDIA H100 (virtual)),
    modules") used to be cut from the right, so the count was never seen."""
    from torchdoctor._report.progress import Progress

    p = Progress("simulating app.py:target on virtual cuda:1 (NVIDIA H100 (virtual)), modules", 40, None, 1.0, 0.1)
    p.advance(10)
    wide = p.line()
    assert wide.startswith("| simulating app.py:target on virtual cuda:1 (NVIDIA H100 (virtual)), modules 10/40 ")
    assert "10/40 [##........] (0 s)" in wide
    narrow = p.line(60)
    assert len(narrow) == 60 and narrow.endswith("... 10/40 [##........] (0 s)"), narrow
    assert narrow.startswith("| simulating app.py:target on v")


def test_scan_report_is_frozen_and_json_keys_are_field_names() -> None:
    model = zoo.tiny_llama(torch.bfloat16)
    model.lm_head.weight.data = model.lm_head.weight.data.float()
    report = torchdoctor.scan(model)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.source = "x"  # type: ignore[misc]
    relabelled = dataclasses.replace(report, source="models.py:llama")
    assert relabelled.source == "models.py:llama" and report.source == "LlamaForCausalLM"
    doc = json.loads(json.dumps(report.to_dict()))
    fields = {f.name for f in dataclasses.fields(report)} - {"extra", "verb"}
    assert set(doc) == fields | {"schema", "ok", "nothing_to_check", "relocations"} | set(report.extra)
    assert doc["schema"] == "torchdoctor/scan/1"
    assert all(isinstance(t["device"], str) for t in doc["tensors"])
    assert set(doc["tensors"][0]) == {f.name for f in dataclasses.fields(torchdoctor.TensorInfo)}
    assert set(doc["problems"][0]) == {f.name for f in dataclasses.fields(torchdoctor.Problem)}


def test_repr_html_is_a_fragment_of_the_map() -> None:
    report = torchdoctor.scan(nn.Linear(2, 2))
    fragment = report._repr_html_()
    assert fragment.startswith('<div class="tdmap"') and "<html" not in fragment
    assert report.to_html().startswith("<!DOCTYPE html>")

"""Session 17, guard: a plugin node builds its model, casts it to bfloat16, then assigns a new float32 head
(``net.out = nn.Linear(8, 2)``). With a trace active (as the run verb keeps one) the fix is that assignment given
the model's dtype, with its diff, and in fix mode the head is one finding, not one per tensor of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchdoctor
from support.apps import load_file
from torchdoctor import PlacementError

NODE = '''import torch, torch.nn as nn
import torchdoctor


class Head(nn.Module):
    def __init__(s):
        super().__init__(); s.enc = nn.Linear(8, 8); s.out = nn.Linear(8, 2)

    def forward(s, x): return s.out(s.enc(x))


def run_node(x, mode):
    with torchdoctor.trace(None):
        net = Head().to(torch.bfloat16)
        net.out = nn.Linear(8, 2)  # float32 head built after the cast
        with torchdoctor.guard(net, mode=mode) as g:
            return net(x.to(torch.bfloat16)), g
'''
LINE = "        net.out = nn.Linear(8, 2)  # float32 head built after the cast"
FIXED = "        net.out = nn.Linear(8, 2).to(torch.bfloat16)  # float32 head built after the cast"



@pytest.mark.parametrize("mode", ["explain", "strict"])
def test_a_head_assigned_after_the_cast_is_fixed_at_its_assignment(tmp_path: Path, mode: str) -> None:
    node = tmp_path / "node.py"
    node.write_text(NODE)
    with pytest.raises(PlacementError) as info:
        load_file(node, f"_td_node_{mode}").run_node(torch.randn(2, 8), mode)
    e = info.value
    assert e.fix == "net.out = nn.Linear(8, 2).to(torch.bfloat16)  # node.py:15", str(e)
    assert f"-{LINE}\n" in (e.patch or "") and f"+{FIXED}\n" in (e.patch or ""), e.patch
    assert "fix proven" in str(e)
    node.write_text(NODE.replace(LINE, FIXED))  # the printed diff, applied: the node runs quiet
    out, g = load_file(node, f"_td_node_{mode}_fixed").run_node(torch.randn(2, 8), mode)
    assert out.dtype == torch.bfloat16 and not g.report().problems


def test_fix_mode_says_the_assigned_head_once(tmp_path: Path) -> None:
    node = tmp_path / "node.py"
    node.write_text(NODE)
    out, g = load_file(node, "_td_node_fix").run_node(torch.randn(2, 8), "fix")
    report = g.report()
    assert out.dtype == torch.bfloat16
    assert [(p.path, p.role, p.found, p.expected) for p in report.problems] == [
        ("out", "component", "float32", "bfloat16")]
    assert [f.path for f in report.fixes] == ["out"]
    assert report.note(report.problems[0]).fix == "net.out = nn.Linear(8, 2).to(torch.bfloat16)  # node.py:15"


def test_without_a_trace_the_tensors_are_fixed_where_the_model_holds_them() -> None:
    from torch import nn

    net = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)).to(torch.bfloat16)
    net[1] = nn.Linear(8, 2)
    with pytest.raises(PlacementError) as info, torchdoctor.guard(net):
        net(torch.randn(2, 8, dtype=torch.bfloat16))
    assert (info.value.fix or "").startswith("model[1].weight.data = "), info.value.fix

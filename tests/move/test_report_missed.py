"""``move``'s own report leads with what ``Module.to`` would have missed, then folds the rest by module (issue 42
point 10), as ``scan --plan`` does: in text, in JSON (``missed_by_module_to``) and in the HTML map. An optimizer's
state, which ``Module.to`` never moves, is one line per optimizer, not one per state tensor."""

from __future__ import annotations

import dataclasses
import json

import torch
from torch import nn

import torchdoctor


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.mlp = nn.Linear(4, 4)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(30))
        self.norm = nn.LayerNorm(4)
        self.extra = [nn.Linear(2, 2)]  # list-held: Module.to never sees it
        self.mask = torch.ones(4)  # a plain attribute


def test_text_leads_with_what_module_to_misses_then_folds_by_module() -> None:
    report = torchdoctor.move(Net(), "meta", torch.bfloat16)
    lines = str(report).splitlines()
    assert lines[0].startswith("moved 125 tensor(s), ") and " to meta bfloat16 in " in lines[0]
    assert lines[1:] == [
        "3 that Module.to would have missed:",
        "  mask  f32[4]@cpu -> bf16[4]@meta",
        "  extra.0.weight  f32[2,2]@cpu -> bf16[2,2]@meta",
        "  extra.0.bias  f32[2]@cpu -> bf16[2]@meta",
        "122 that Module.to would have moved too, by module:",
        "  layers.0-29  120 tensor(s)  f32@cpu -> bf16@meta",
        "  norm  2 tensor(s)  f32@cpu -> bf16@meta",
    ]
    assert report.missed == ("mask", "extra.0.weight", "extra.0.bias")
    assert dataclasses.replace(report, seconds=0.0).missed == report.missed


def test_a_short_move_is_listed_whole_and_a_plain_module_misses_nothing() -> None:
    m = nn.Sequential(nn.Linear(2, 2))
    assert str(torchdoctor.move(m, dtype=torch.float64)).splitlines()[1:] == [
        "2 that Module.to would have moved too:",
        "  0.weight  f32[2,2]@cpu -> f64[2,2]@cpu",
        "  0.bias  f32[2]@cpu -> f64[2]@cpu",
    ]


def test_an_optimizers_state_is_one_line_among_what_module_to_misses() -> None:
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(10)])
    model.scale = torch.ones(4)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    report = torchdoctor.move(model, dtype=torch.float64)
    lines = str(report).splitlines()
    assert lines[1:5] == [
        "41 that Module.to would have missed:",
        "  scale  f32[4]@cpu -> f64[4]@cpu",
        "  optimizer.state  40 tensor(s)  f32@cpu -> f64@cpu",
        "20 that Module.to would have moved too:",  # few enough to list whole
    ], lines
    assert len(report.missed) == 41 and opt.state[model[0].weight]["exp_avg"].dtype == torch.float64


def test_json_and_html_name_what_module_to_would_have_missed_first() -> None:
    report = torchdoctor.move(Net(), "meta", torch.bfloat16)
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["missed_by_module_to"] == ["mask", "extra.0.weight", "extra.0.bias"]
    assert list(doc).index("missed_by_module_to") < list(doc).index("moved") and len(doc["moved"]) == 125
    page = report.to_html()
    head = '<h2>What Module.to would have missed (3)</h2><ul class="missed"><li data-path="mask"><code>mask</code> ' \
           "f32[4]@cpu -&gt; bf16[4]@meta</li>"
    assert head in page
    assert page.index(head) < page.index('class="legend"') < page.index('class="totals"') < page.index('class="tree"')
    assert "What Module.to" not in torchdoctor.move(nn.Linear(2, 2), dtype=torch.float64).to_html()


def test_a_weight_its_own_pre_hook_remakes_is_not_a_tensor_module_to_misses() -> None:
    # torch.nn.utils.weight_norm keeps `weight` as a plain attribute remade from weight_g and weight_v before every
    # call: move (and scan --plan) leave it to that hook, never list it as missed by Module.to
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = nn.Sequential(nn.utils.weight_norm(nn.Conv1d(4, 4, 3)), nn.Conv1d(4, 4, 1))
    report = torchdoctor.move(model, "meta", torch.float16)
    assert report.missed == ()
    assert {m.path for m in report.moved} == {"0.bias", "0.weight_g", "0.weight_v", "1.weight", "1.bias"}
    assert model[0].weight_v.device.type == "meta" and model[0].weight_v.dtype == torch.float16
    # the control: a plain attribute no hook remakes is still missed by Module.to and moved
    model[1].mask = torch.ones(4)
    assert torchdoctor.move(model, "meta").missed == ("1.mask",)

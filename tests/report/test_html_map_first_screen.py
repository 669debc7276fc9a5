"""The device map leads with what to act on (issue 42, point 6): in ``scan(pipe, "cuda:0", torch.bfloat16)`` of a
tiny Stable Diffusion pipeline with the README's planted culprit, the first culprit's card (path, found, expected,
fix) is on the first screen of a 1280x720 browser window, measured in the real headless Chromium; the components
not yet moved, the overview and the tree follow. Before, the card sat at y = 1,753 px, under the legend, totals
and a 69-row module outline."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo
from torchdoctor._report.html import OPEN_CARDS, render_html


@pytest.fixture(scope="module")
def planted() -> torchdoctor.ScanReport:
    pipe = zoo.tiny_sd_pipeline(torch.bfloat16)
    pipe.unet.conv_in.weight.data = pipe.unet.conv_in.weight.data.float()  # the README's planted culprit
    return torchdoctor.scan(pipe, "cuda:0", torch.bfloat16)


def _open(driver: Any, path: Path) -> None:
    driver.get(path.resolve().as_uri())
    deadline = time.monotonic() + 30
    while driver.execute_script("var m=document.querySelector('.tdmap'); return m && m.getAttribute('data-ready')") != "1":
        assert time.monotonic() < deadline, "the map's script never finished"
        time.sleep(0.05)


_FIRST_CARD = """
var card=document.querySelector('.tdmap .card'), r=card.getBoundingClientRect();
var dd=Array.from(card.querySelectorAll('dt')).map(function(t){return [t.textContent, t.nextElementSibling.textContent];});
var fix=card.querySelector('.fix pre').getBoundingClientRect();
var order=Array.from(document.querySelectorAll('.tdmap h2')).map(function(h){return h.textContent;});
return {top: r.top, bottom: r.bottom, fix_bottom: fix.bottom, height: innerHeight, width: innerWidth,
        path: card.getAttribute('data-path'), kind: card.getAttribute('data-kind'), rows: dd,
        fix: card.querySelector('.fix code').textContent, order: order,
        tree: document.querySelector('.tdmap .tree').getBoundingClientRect().top,
        tree_rows: document.querySelectorAll('.tdmap .tree .row').length};
"""


def test_first_culprit_is_on_the_first_screen_at_1280x720(browser: Any, planted: torchdoctor.ScanReport,
                                                           tmp_path: Path) -> None:
    page = tmp_path / "pipe.html"
    planted.to_html(page)
    browser.set_window_size(1280, 720)
    try:
        _open(browser, page)
        browser.execute_script("window.scrollTo(0, 0)")
        seen = browser.execute_script(_FIRST_CARD)
    finally:
        browser.set_window_size(1200, 1600)
    # the same culprit the text report names first
    assert seen["path"] == "unet.conv_in.weight" and "unet.conv_in.weight" in planted.text().splitlines()[1]
    assert seen["width"] == 1280 and seen["top"] < 720, seen
    # the whole card, fix included, inside what a 1280x720 window shows (its viewport is shorter than 720)
    assert seen["bottom"] <= seen["height"] and seen["fix_bottom"] <= seen["height"], seen
    rows = dict(seen["rows"])
    assert (rows["found"], rows["expected"]) in {("cpu", "cuda:0"), ("float32", "bfloat16")}, rows
    assert seen["fix"].startswith("model.unet.conv_in.weight.data = model.unet.conv_in.weight.data.to(")
    # what to act on first, then the overview, then the tree (which still works: the root opened by itself)
    assert seen["order"][:2] == ["Problems to fix (2)", "Not yet on the device asked for"], seen["order"]
    assert seen["order"][2:] == ["Totals by device and dtype", "Modules", f"Tensors by path ({len(planted.tensors)})"]
    assert seen["tree"] > seen["bottom"] and seen["tree_rows"] > 0


def test_heading_says_what_to_fix_and_what_one_move_fixes(planted: torchdoctor.ScanReport) -> None:
    page = planted.to_html()
    real, moves = planted.relocations()
    moved = sum(len(m.members) for m in moves)
    assert len(real) == 2 and moved + 2 == len(planted.problems)
    assert (f'<span class="bad-count">{len(planted.problems)} problem(s)</span>: 2 to fix, {moved} not yet on the '
            "device asked for</div>") in page
    assert page.index('<div class="card" ') < page.index('class="card move"') < page.index('class="legend"') \
        < page.index('class="totals"') < page.index('class="outline"') < page.index('class="tree"')


def test_many_culprits_fold_after_the_first_cards() -> None:
    """Thirty unrelated culprits: the first ten cards are open, the rest fold under one line, so the components to
    move and the overview stay near the top; every card is still in the page."""
    model = nn.ModuleDict({f"block{i}": nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)) for i in range(30)})
    for i in range(30):
        getattr(model, f"block{i}")[2 * (i % 2)].bias.data = torch.zeros(2, dtype=torch.float64)
    report = torchdoctor.scan(model, dtype=torch.float32)
    assert len(report.problems) == 30
    page = render_html(report.to_dict())
    head, _, folded = page.partition('<details class="rest">')
    assert head.count('<div class="card" ') == OPEN_CARDS == 10
    assert folded.split("</summary>", 1)[0] == "<summary>20 more problem(s) in 20 card(s)"
    assert folded.count('<div class="card" ') == 20 and folded.index("</details>") < folded.index('class="legend"')

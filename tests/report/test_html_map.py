"""The HTML device map in a real headless Chromium (Debian's `chromium` and `chromium-driver`, driven by
selenium): opened offline from ``file://``, a node expanded, a path searched, the highlighted problem and the
colours checked in the DOM, a screenshot saved (the browser: ``conftest.py``). Also the page's text itself:
escaping, size."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo
from torchdoctor._cli.main import main
from torchdoctor._report.html import device_color, dtype_color, render_html

HOSTILE = "</script><img src=x onerror=\"document.title='pwned'\"><!--"


def _rgb(hex_color: str) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, 1)"  # how selenium reports a computed colour


@pytest.fixture(scope="module")
def broken_llama() -> Any:
    """A tiny bf16 Llama with planted bugs: three down_proj weights left in fp32, a meta norm, a hostile attribute."""
    model = zoo.tiny_llama(torch.bfloat16, num_hidden_layers=6)
    for i in range(3):
        layer = model.model.layers[i].mlp.down_proj
        layer.weight.data = layer.weight.data.float()
    model.model.norm.weight = nn.Parameter(torch.empty_like(model.model.norm.weight, device="meta"))
    setattr(model.lm_head, HOSTILE, torch.zeros(2, dtype=torch.bfloat16))
    return model


def _open(driver: Any, path: Path) -> None:
    driver.get(path.resolve().as_uri())
    deadline = time.monotonic() + 30
    while driver.execute_script("var m=document.querySelector('.tdmap'); return m && m.getAttribute('data-ready')") != "1":
        assert time.monotonic() < deadline, "the map's script never finished"
        time.sleep(0.05)


def _row(driver: Any, path: str) -> Any:
    rows = [r for r in driver.find_elements("css selector", ".tree .row") if r.get_attribute("data-path") == path]
    return rows[0] if rows else None


def test_map_in_headless_chromium(browser: Any, broken_llama: Any, tmp_path: Path) -> None:
    page = tmp_path / "map.html"
    assert main(["scan", "-q", "--html", str(page), "support.zoo:tiny_llama"]) == 0  # the CLI writes maps too
    broken_llama_report = torchdoctor.scan(broken_llama)
    broken_llama_report.to_html(page)
    _open(browser, page)
    assert browser.title != "pwned" and not browser.find_elements("css selector", "img[src=x]")
    errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert errors == [], errors  # no script error, and no request left the file (the page's CSP forbids any)

    # lazy: only the top level exists before any click
    assert {r.get_attribute("data-path") for r in browser.find_elements("css selector", ".tree .row")} == {
        "model", "lm_head"}
    # expand a node
    _row(browser, "model").find_element("css selector", ".tw").click()
    assert _row(browser, "model.layers") is not None and _row(browser, "model.layers.0") is None
    _row(browser, "model.layers").find_element("css selector", ".tw").click()
    assert [r.get_attribute("data-path") for r in browser.find_elements("css selector", ".tree .row")
            if (r.get_attribute("data-path") or "").count(".") == 2] == [f"model.layers.{i}" for i in range(6)]
    assert "3 problems" in _row(browser, "model.layers").text

    # search a path and jump to it
    box = browser.find_element("css selector", "input.q")
    box.send_keys("layers.1.mlp.down_proj.weight")
    deadline = time.monotonic() + 5
    while "1 match" not in browser.find_element("css selector", ".hitcount").text:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    browser.find_element("css selector", ".hits div").click()
    weight = _row(browser, "model.layers.1.mlp.down_proj.weight")
    assert weight is not None and weight.is_displayed()

    # the highlighted problem and the colours
    assert "bad" in weight.get_attribute("class").split() and weight.get_attribute("data-problem") == "dtype"
    assert (weight.get_attribute("data-device"), weight.get_attribute("data-dtype")) == ("cpu", "float32")
    dev_sw, dt_sw = weight.find_elements("css selector", ".sw")[:2]
    assert dev_sw.value_of_css_property("background-color") == _rgb(device_color("cpu"))
    assert dt_sw.value_of_css_property("background-color") == _rgb(dtype_color("float32"))
    ok_weight = _row(browser, "model.layers.1.mlp.up_proj.weight") or _reveal(browser, "model.layers.1.mlp.up_proj.weight")
    assert "bad" not in ok_weight.get_attribute("class").split()
    assert ok_weight.find_elements("css selector", ".sw")[1].value_of_css_property("background-color") == \
        _rgb(dtype_color("bfloat16"))
    legend = {e.get_attribute("data-dtype") for e in browser.find_elements("css selector", ".legend [data-dtype]")}
    assert legend == {"bfloat16", "float32"}

    # the problem cards: path, found, expected, why, the fix with a copy button
    cards = browser.find_elements("css selector", ".card")
    kinds = sorted(c.get_attribute("data-kind") for c in cards)
    assert kinds == ["dtype", "dtype", "dtype", "meta"]  # three down_proj weights (too few to group), the norm
    meta = next(c for c in cards if c.get_attribute("data-kind") == "meta")
    assert "model.norm.weight" in meta.text and "found\nmeta" in meta.text and "expected\ncpu" in meta.text
    assert "load_state_dict(state_dict, strict=False, assign=True)" in meta.find_element("css selector", "pre").text
    copy = meta.find_element("css selector", "button.copy")
    copy.click()
    deadline = time.monotonic() + 5
    while copy.text == "copy":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert copy.text in ("copied", "select and copy")
    meta.find_element("css selector", "button.goto").click()
    assert _row(browser, "model.norm.weight").is_displayed()

    # the hostile attribute name is text, found by search like any path
    box.clear()
    box.send_keys("onerror")
    deadline = time.monotonic() + 5
    while f"lm_head.{HOSTILE}" not in _texts(browser, ".hits div"):
        assert time.monotonic() < deadline, browser.find_element("css selector", ".hits").text
        time.sleep(0.05)
    assert browser.title != "pwned" and not browser.find_elements("css selector", "img[src=x]")

    shot = tmp_path / "map.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    keep = os.environ.get("TORCHDOCTOR_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


def _texts(driver: Any, selector: str) -> list[str]:
    """Texts of the elements, read in the page in one step (the search list is rebuilt while keys arrive)."""
    return list(driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(function(e){return e.textContent;})", selector))


def _reveal(driver: Any, path: str) -> Any:
    driver.execute_script("document.querySelector('.tdmap').revealPath(arguments[0])", path)
    return _row(driver, path)


def test_simulate_map_shows_op_and_module(browser: Any, tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    model.extra = [nn.Linear(4, 4)]

    def run(m: nn.Module) -> None:
        m.to("cuda:1")
        m.extra[0](m(torch.ones(1, 4, device="cuda:1")))

    report = torchdoctor.simulate(model, device="cuda:1", call=run)
    page = tmp_path / "sim.html"
    page.write_text(render_html(report.to_dict()), encoding="utf-8")
    _open(browser, page)
    first = sorted(report.problems, key=lambda p: p.path)[0]
    assert first.op and first.module_type  # where it surfaced: the op and the module running it
    card = browser.find_element("css selector", ".card")
    assert f"surfaced\nop {first.op} in module {first.module_path or '<root>'} ({first.module_type})" in card.text
    assert "virtual cuda:1" in browser.find_element("css selector", ".meta").text
    row = _reveal(browser, "extra.0.weight")
    assert row is not None and "bad" in row.get_attribute("class").split()


def test_70b_shaped_map_stays_small_and_lazy(browser: Any, tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                      num_key_value_heads=8, vocab_size=128256)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    report = torchdoctor.scan(model, device="cuda:0")
    page = tmp_path / "70b.html"
    report.to_html(page)
    assert len(report.tensors) > 700 and page.stat().st_size < 600_000
    t0 = time.monotonic()
    _open(browser, page)
    assert time.monotonic() - t0 < 20
    assert len(browser.find_elements("css selector", ".tree .row")) < 10
    row = _reveal(browser, "model.layers.79.mlp.down_proj.weight")
    assert row is not None and row.get_attribute("data-device") == "meta"
    assert len(browser.find_elements("css selector", ".tree .row")) < 200  # only the opened path's siblings
    titles = [c.text for c in browser.find_elements("css selector", ".card code.path")]
    assert titles == ["<root>"], titles  # a model built on meta: one "weights not loaded" card, not 720

    # the outline: 80 layers are one range row with their sizes; bars proportional to bytes (issue 27, point 7)
    outline = browser.find_elements("css selector", "table.outline tr")
    assert len(outline) <= 10
    by_path = {r.get_attribute("data-path"): r for r in outline}
    layers = by_path["model.layers.0-79"]
    assert layers.get_attribute("data-count") == "80"
    assert "80 \u00d7 3.2 GiB = 255.0 GiB" in layers.text, layers.text
    bar = {p: by_path[p].find_element("css selector", ".size").size["width"] for p in ("model.layers.0-79", "lm_head")}
    want = int(by_path["lm_head"].get_attribute("data-bytes")) / int(layers.get_attribute("data-bytes"))
    assert abs(bar["lm_head"] / bar["model.layers.0-79"] - want) < 0.02, (bar, want)


def test_page_is_escaped_self_contained_and_bounded(broken_llama: Any) -> None:
    page = torchdoctor.scan(broken_llama).to_html()
    assert HOSTILE not in page and "<img" not in page
    assert "http://" not in page and "https://" not in page and "src=" not in page.replace("src=x", "")
    data = page.split('<script type="application/json" class="td-data">', 1)[1].split("</script>", 1)[0]
    assert f"lm_head.{HOSTILE}" in [r[0] for r in json.loads(data)["tensors"]]
    many = {"schema": "torchdoctor/scan/1", "problems": [], "tensors": [
        {"path": f"t.{i}", "device": "cpu", "dtype": "float32", "shape": [1], "nbytes": 4} for i in range(250_000)]}
    big = render_html(many)
    assert len(big) < 12_000_000 and "50000 more tensors are counted in the totals but not drawn" in big


def test_move_report_map() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    moved = torchdoctor.move(model, dtype=torch.bfloat16)
    page = render_html(moved.to_dict())
    data = json.loads(page.split('class="td-data">', 1)[1].split("</script>", 1)[0])
    assert sorted(r[0] for r in data["tensors"]) == ["0.bias", "0.weight"]
    assert data["dtypes"] == ["bfloat16"] and data["devices"] == ["cpu"]  # one name per dtype on every map


def test_one_name_and_one_colour_per_dtype_on_every_map(browser: Any, tmp_path: Path) -> None:
    """A move map (compact forms, ``bf16``) and a scan map name and colour bfloat16 alike."""
    model = nn.Sequential(nn.Linear(2, 2))
    moved = torchdoctor.move(model, dtype=torch.bfloat16)
    scanned = torchdoctor.scan(model)
    seen = {}
    for name, report in (("move", moved), ("scan", scanned)):
        page = tmp_path / f"{name}.html"
        report.to_html(page)
        _open(browser, page)
        items = browser.find_elements("css selector", ".legend [data-dtype]")
        seen[name] = {i.get_attribute("data-dtype"): i.find_element("css selector", ".sw").value_of_css_property(
            "background-color") for i in items}
    assert "bf16" not in seen["move"] and seen["move"]["bfloat16"] == seen["scan"]["bfloat16"] == \
        _rgb(dtype_color("bfloat16"))

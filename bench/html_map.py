"""The HTML device map of Llama-3-8B- and 70B-shaped models built on meta: time to render and file size.

Render time is compared with the scan that produced the report (interleaved rounds, medians), so the ratio
says what the map costs on top of finding. Scanned against device="cuda:0", every tensor of a meta model is a `meta` problem, so this is also
the worst case for the problem cards. With `--browser` (needs chromium and chromium-driver) it also opens the
70B map headless and reports the time to an interactive page and how many tree rows exist before any click.
"""

from __future__ import annotations

import os
import sys

# this file is named like the standard library's html module, which the renderer imports: run as a script,
# its own directory must not shadow it
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]

import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging

import torchdoctor
from torchdoctor._report.html import render_html

logging.set_verbosity_error()

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256),
    "llama3-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8, vocab_size=128256),
}


def browser_load(path: str) -> tuple[float, int]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"):
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tempfile.mkdtemp()}")
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        t0 = time.perf_counter()
        driver.get(f"file://{path}")
        while driver.execute_script("return document.querySelector('.tdmap').getAttribute('data-ready')") != "1":
            time.sleep(0.01)
        seconds = time.perf_counter() - t0
        rows = int(driver.execute_script("return document.querySelectorAll('.tree .row').length"))
        return seconds, rows
    finally:
        driver.quit()


def main(rounds: int = 15) -> None:
    print(f"torch {torch.__version__}, {rounds} interleaved rounds, medians")
    for name, cfg in SHAPES.items():
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(**cfg))
        report = torchdoctor.scan(model, device="cuda:0")
        doc = report.to_dict()
        times: dict[str, list[float]] = {"scan": [], "to_dict": [], "render": []}
        fns = {"scan": lambda: torchdoctor.scan(model, device="cuda:0"), "to_dict": report.to_dict, "render": lambda: render_html(doc)}
        for i in range(rounds):
            order = list(fns.items())
            if i % 2:
                order.reverse()
            for key, fn in order:
                t0 = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - t0)
        page = report.to_html()
        med = {k: statistics.median(v) for k, v in times.items()}
        total = med["to_dict"] + med["render"]
        print(f"{name}: {len(report.tensors)} tensors, {len(report.problems)} problems; map {len(page) / 1024:.0f} KiB; "
              f"to_dict {med['to_dict'] * 1e3:.1f} ms + render {med['render'] * 1e3:.1f} ms = {total * 1e3:.1f} ms "
              f"(x{total / med['scan']:.2f} of the scan, {med['scan'] * 1e3:.1f} ms)")
        if "--browser" in sys.argv:
            with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False, encoding="utf-8") as fh:
                fh.write(page)
            seconds, rows = browser_load(fh.name)
            print(f"  headless chromium: interactive after {seconds * 1e3:.0f} ms, {rows} tree rows drawn before any "
                  "click")
            os.unlink(fh.name)


if __name__ == "__main__":
    main()

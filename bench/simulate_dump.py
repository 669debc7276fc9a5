"""Every answer ``simulate`` and ``virtual_devices`` give on the zoo and on planted bugs, one JSON line per run, and
their sha256: what a speed change to the op path (``_virtual/dispatch.py``, ``kernels.py``, ``simulate.py``) must keep
byte for byte.

    python bench/simulate_dump.py OUT.jsonl                 # the whole set (zoo x 3 devices x 2 dtypes, twice)
    python bench/simulate_dump.py OUT.jsonl --no-kernel-table   # the same with the meta-kernel table off
    python bench/simulate_dump.py OUT.jsonl --quick         # a third of the zoo, the planted bugs, no big shapes

Dump before and after a change and compare the two files (``cmp``). Each zoo run is made twice in one process, so
the second meets the process-wide kernel table the first filled; a dump with the table off is the uncached
reference (its lines equal the cached ones). A line is the report's ``to_dict()`` and ``text()`` with the timings
taken out (``seconds``, ``built_seconds``, "0.12 s"). The planted bugs are the models of
``tests/virtual/test_simulate.py``; the real-width shapes are ``bench/shapes.py``'s at 1x on meta.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # bench/trace.py shadows stdlib trace
sys.path.insert(0, os.path.join(_HERE, "..", "tests"))
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "DIFFUSERS_OFFLINE"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import torchdoctor  # noqa: E402
from torchdoctor._virtual import kernels  # noqa: E402

_TIME = re.compile(r"\d+\.\d\d s\b")


def _load(name: str, path: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def line(name: str, report: Any) -> str:
    """The report as one JSON line, timings out."""
    d = report.to_dict()
    d.pop("seconds", None)
    d.pop("built_seconds", None)
    text = _TIME.sub("T s", report.text()) if hasattr(report, "text") else str(report.error()) if report.problems \
        else ""
    return json.dumps({"case": name, "report": d, "text": text}, sort_keys=True, default=str)


def zoo_cases(quick: bool) -> Iterator[tuple[str, Callable[[], Any]]]:
    from support import zoo

    names = zoo.NAMES[::3] if quick else zoo.NAMES
    for name in names:
        for dtype in (torch.float32, torch.bfloat16):
            for device in ("cuda:1", "xpu:0", "mps"):
                def run(name: str = name, dtype: torch.dtype = dtype, device: str = device) -> Any:
                    built = zoo.build(name, dtype)
                    return torchdoctor.simulate(built.target(), device=device, dtype=dtype)
                yield f"zoo {name} {device} {dtype}", run


def planted_cases() -> Iterator[tuple[str, Callable[[], Any]]]:
    from support import zoo

    t = _load("_dump_test_simulate", os.path.join(_HERE, "..", "tests", "virtual", "test_simulate.py"))
    x4, img = torch.randn(2, 4, generator=torch.Generator().manual_seed(1)), torch.randn(1, 3, 8, 8)

    def bias_elsewhere(m: nn.Module) -> None:
        m.to("cuda:1")
        m.conv.bias.data = m.conv.bias.data.to("cuda:0")
        m(torch.randn(1, 3, 8, 8, device="cuda:1"))

    def lora_left(model: nn.Module) -> None:
        model.to("cuda:1")
        lora_b = model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"]
        lora_b.weight = nn.Parameter(torch.zeros_like(lora_b.weight, device="cpu"))
        model(input_ids=t.IDS.to("cuda:1"))

    def f32_weight() -> Any:
        model = zoo.tiny_llama(torch.bfloat16)
        down = model.model.layers[0].mlp.down_proj
        down.weight.data = down.weight.data.float()
        return torchdoctor.simulate(model, {"input_ids": t.IDS}, device="cuda:1")

    cases: dict[str, Callable[[], Any]] = {
        "list-held conv": lambda: torchdoctor.simulate(t.ListHeld(), (img,), device="cuda:1"),
        "bias elsewhere": lambda: torchdoctor.simulate(t.Net(), device="cuda:1", call=bias_elsewhere),
        "cpu table": lambda: torchdoctor.simulate(t.Table(), (torch.tensor([1, 2]),), device="cuda:1"),
        "meta buffer": lambda: torchdoctor.simulate(t.Scaled(torch.ones(4, device="meta")), (x4,), device="cuda:1"),
        "float64 on mps": lambda: torchdoctor.simulate(t.Scaled(torch.ones(4, dtype=torch.float64)), (x4,),
                                                       device="mps"),
        "bare cuda": lambda: torchdoctor.simulate(_bare(), (x4,), device="cuda:1"),
        "two bugs": lambda: torchdoctor.simulate(t.TwoBugs(), (x4,), device="cuda:1"),
        "limit": lambda: torchdoctor.simulate(t.TwoBugs(6), (x4,), device="cuda:1", limit=3),
        "custom op": lambda: torchdoctor.simulate(t.CustomOp(), (x4,), device="cuda:1"),
        "float32 weight in bf16 llama": f32_weight,
        "conv input dtype": lambda: torchdoctor.simulate(nn.Sequential(nn.Conv2d(4, 4, 2)).to(torch.bfloat16),
                                                         (torch.randn(1, 4, 8, 8),), device="cuda:1"),
        "lora weight left on cpu": lambda: torchdoctor.simulate(zoo.lora_llama(torch.bfloat16), device="cuda:1",
                                                                call=lora_left),
        "old gpu bf16": lambda: torchdoctor.simulate(nn.Linear(4, 4), (x4,), device="cuda:0", dtype="bfloat16",
                                                     profile="t4"),
        "session mixed": _session,
    }
    yield from cases.items()


def _bare() -> nn.Module:
    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + torch.ones(4).cuda()

    return Bare()


def _session() -> Any:
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).to("cuda:1")
        model[2].to(torch.float64)
        model(torch.ones(3, 4, device="cuda:1"))
        torch.ones(2, device="cuda:1") + torch.ones(2)
    return sim


def shape_cases() -> Iterator[tuple[str, Callable[[], Any]]]:
    shapes = _load("_dump_shapes", os.path.join(_HERE, "shapes.py"))
    for name in ("llama", "flux", "sdxl"):
        def run(name: str = name) -> Any:
            model, inputs = shapes.BUILDERS[name](1)
            return torchdoctor.simulate(model, inputs, device="cuda:1", dtype="bfloat16", assume_device="cpu")
        yield f"shape {name}:1", run


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--no-kernel-table", action="store_true", help="simulate with the meta-kernel table off")
    ap.add_argument("--quick", action="store_true", help="a third of the zoo, no real-width shapes")
    args = ap.parse_args()
    kernels.ENABLED = not args.no_kernel_table
    kernels.clear()
    torch.manual_seed(0)
    cases = [*zoo_cases(args.quick), *planted_cases(), *(() if args.quick else shape_cases())]
    h = hashlib.sha256()
    n = 0
    with open(args.out, "w") as out:
        for rnd in (1, 2):  # the second round meets the kernel table the first filled
            for name, run in cases:
                torch.manual_seed(0)
                try:
                    text = line(f"{name} #{rnd}", run())
                except Exception as exc:  # an answer too
                    text = json.dumps({"case": f"{name} #{rnd}", "error": f"{type(exc).__name__}: {exc}"})
                out.write(text + "\n")
                h.update(text.encode() + b"\n")
                n += 1
    print(f"{n} runs, sha256 {h.hexdigest()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

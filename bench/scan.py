"""scan against accelerate's ``named_module_tensors`` + ``find_tied_parameters`` (issue 43 point 3: at most 0.9x),
on real-width models built on meta: Flux's transformer (19+38 blocks), SDXL's UNet (its real 1/2/10 transformer
layers), Llama-3-8B and 70B, and the 1x/4x depths of ``bench/shapes.py``.

    python bench/scan.py [--rounds 41] [--only flux,llama3-8b]
    python bench/scan.py --dump reports.json   # no timing: every report, to compare two trees byte for byte
    python bench/scan.py --rev fc5f573 --only llama-1x   # also that commit's torchdoctor, in the same process

Interleaved pairs in one process (the order alternates each round), thread CPU time (load from other processes
disturbs it less than wall time); printed per shape: the median of the per-pair ratios, their quartiles and range,
a model's first scan (no walk kept from an earlier scan of it: ``_walk.kept``) and the walk alone against the same
anchor, and the medians in ms; where a shape's 1x and 4x depths both ran, scan's
growth from one to the other against accelerate's (issue 43 point 6). The garbage collector runs as it would in a
program (scan pauses it for itself; accelerate's listing runs with it). Every tensor of a meta-built model is "not
loaded": scan reports one problem per component and still builds a row per tensor.

``--rev REV`` loads the whole package as commit REV has it (``git archive``, renamed ``torchdoctor_ab``) beside the
working tree's and times both in the same interleaved rounds, first and repeated scans (their reports asserted equal
first): new / old ratios that load on the machine moves far less than either's ratio to accelerate.

``--dump`` pins what a speed change must keep: scan's whole report (``to_dict()``, text, expected rows, summary) on
every test-zoo entry (``tests/support/zoo.py``) in float32 and bfloat16, with ``dtype=`` and ``device=``, after one
tensor is cast and layers are moved to meta or half, and on every shape here, written as JSON; run it on the old and
the new source and compare the files.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import torchdoctor
from torchdoctor._walk import walk


def _shapes() -> Any:
    """``bench/shapes.py`` by path (``bench/`` on ``sys.path`` would let ``bench/trace.py`` shadow ``trace``)."""
    spec = importlib.util.spec_from_file_location("_bench_shapes", os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "shapes.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def flux() -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        return FluxTransformer2DModel(num_layers=19, num_single_layers=38, guidance_embeds=True)


def sdxl() -> torch.nn.Module:
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        return UNet2DConditionModel(
            sample_size=128, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
            use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=2816)


def llama(layers: int, hidden: int, inter: int, heads: int) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM

        with torch.device("meta"):
            return LlamaForCausalLM(LlamaConfig(vocab_size=128256, hidden_size=hidden, intermediate_size=inter,
                                                num_hidden_layers=layers, num_attention_heads=heads,
                                                num_key_value_heads=8))
    return build


def _depth(name: str, scale: int) -> Callable[[], torch.nn.Module]:
    return lambda: _shapes().BUILDERS[name](scale)[0]


SHAPES: dict[str, Callable[[], torch.nn.Module]] = {
    "flux": flux, "sdxl": sdxl, "llama3-8b": llama(32, 4096, 14336, 32), "llama3-70b": llama(80, 8192, 28672, 64),
    **{f"{n}-{s}x": _depth(n, s) for n in ("flux", "sdxl", "llama") for s in (1, 4)}}


def _spread(xs: list[float]) -> str:
    s = sorted(xs)
    q = lambda p: s[int(p * (len(s) - 1))]  # noqa: E731
    return f"x{statistics.median(s):.3f} (quartiles {q(0.25):.3f}-{q(0.75):.3f}, range {s[0]:.3f}-{s[-1]:.3f})"


def old_package(rev: str) -> Any:
    """torchdoctor as commit ``rev`` has it, imported as ``torchdoctor_ab`` (its own imports renamed)."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    into = tempfile.mkdtemp(prefix="scan_ab_")
    tar = subprocess.run(["git", "-C", root, "archive", rev, "src/torchdoctor"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=tar, check=True)
    pkg = os.path.join(into, "torchdoctor_ab")
    os.rename(os.path.join(into, "src", "torchdoctor"), pkg)
    for folder, _, files in os.walk(pkg):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                text = re.sub(r"\btorchdoctor\._", "torchdoctor_ab._", text)
                text = re.sub(r"\bfrom torchdoctor import\b", "from torchdoctor_ab import", text)
                text = re.sub(r"^(\s*)import torchdoctor$", r"\1import torchdoctor_ab as torchdoctor", text, flags=re.M)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
    sys.path.insert(0, into)
    import torchdoctor_ab  # type: ignore[import-not-found]

    return torchdoctor_ab


def measure(model: torch.nn.Module, rounds: int, old: Any = None) -> dict[str, list[float]]:
    from accelerate.utils import find_tied_parameters, named_module_tensors

    def acc() -> None:
        list(named_module_tensors(model, include_buffers=True, recurse=True))
        find_tied_parameters(model)

    from torchdoctor._walk import kept

    def first() -> None:  # a model's first scan: no walk kept from an earlier one (the kept one put back after)
        was = kept._KEPT.pop(id(model), None)
        torchdoctor.scan(model)
        kept._KEPT[id(model)] = was

    fns = {"scan": lambda: torchdoctor.scan(model), "first": first, "walk": lambda: walk(model), "accelerate": acc}
    if old is not None:
        a, b = torchdoctor.scan(model), old.scan(model)
        assert a.to_dict() == b.to_dict() and a.text(10**6) == b.text(10**6), "the two trees' reports differ"
        old_kept = importlib.import_module("torchdoctor_ab._walk.kept")

        def old_first() -> None:
            was = old_kept._KEPT.pop(id(model), None)
            old.scan(model)
            old_kept._KEPT[id(model)] = was

        fns.update({"old scan": lambda: old.scan(model), "old first": old_first})
    for _ in range(3):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(rounds):
        order = list(fns.items())
        if i % 2:
            order.reverse()  # neither runs always right after the other
        for key, fn in order:
            c0 = time.thread_time()
            fn()
            times[key].append(time.thread_time() - c0)
    return times


def dump(path: str) -> None:
    """Every report ``--dump`` pins (see the module docstring), keyed by what was scanned."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
    import zoo  # the test suite's model zoo

    out: dict[str, Any] = {}

    def rec(name: str, obj: Any, **kw: Any) -> None:
        try:
            r = torchdoctor.scan(obj, **kw)
            out[name] = {"dict": r.to_dict(), "text": r.text(100_000), "expected": repr(r.expected),
                         "summary": repr(getattr(r, "summary", None)), "extra": {k: repr(v) for k, v in r.extra.items()}}
        except Exception as exc:  # an error is a result too
            out[name] = f"error: {exc!r}"

    for name in zoo.NAMES:
        for dt in (torch.float32, torch.bfloat16):
            obj = zoo.build(name, dt).obj
            rec(f"{name}/{dt}", obj)
            rec(f"{name}/{dt}/dtype=bf16", obj, dtype="bfloat16")
            rec(f"{name}/{dt}/device=meta", obj, device="meta")
            if isinstance(obj, torch.nn.Module) and len(list(obj.parameters())) > 2:
                first = list(obj.parameters())[1]
                first.data = first.data.double()
                linears = [m for m in obj.modules() if isinstance(m, torch.nn.Linear)]
                if linears:
                    linears[-1].to("meta")
                if len(linears) > 2:
                    linears[1].half()
                rec(f"{name}/{dt}/changed", obj)
    for name, build in SHAPES.items():
        model = build()
        rec(name, model)
        rec(f"{name}/dtype=bf16", model, dtype="bfloat16")
    with open(path, "w") as f:
        json.dump(out, f, indent=0, sort_keys=True, default=repr)
    print(f"{len(out)} reports written to {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--only", default="", help="comma-separated shapes: " + ", ".join(SHAPES))
    ap.add_argument("--dump", default="", help="write every pinned report to this JSON file and time nothing")
    ap.add_argument("--rev", default="", help="also time this commit's torchdoctor in the same rounds (new / old)")
    args = ap.parse_args()
    _shapes().quiet()
    if args.dump:
        dump(args.dump)
        return
    print(f"torch {torch.__version__}, {args.rounds} interleaved rounds, thread CPU time; per-pair ratios to "
          "accelerate's named_module_tensors + find_tied_parameters (goal: scan <= 0.9x)")
    medians: dict[str, dict[str, float]] = {}
    old = old_package(args.rev) if args.rev else None
    for name in (args.only.split(",") if args.only else SHAPES):
        model = SHAPES[name]()
        t = measure(model, args.rounds, old)
        medians[name] = {k: statistics.median(v) for k, v in t.items()}
        scan_r = [s / a for s, a in zip(t["scan"], t["accelerate"])]
        walk_r = [w / a for w, a in zip(t["walk"], t["accelerate"])]
        first_r = [f / a for f, a in zip(t["first"], t["accelerate"])]
        med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
        print(f"{name}: {len(torchdoctor.scan(model).tensors)} tensors; scan {_spread(scan_r)}; first scan "
              f"{_spread(first_r)}; walk {_spread(walk_r)}; ms scan {med['scan']:.2f} / first {med['first']:.2f} / "
              f"walk {med['walk']:.2f} / accelerate {med['accelerate']:.2f}", flush=True)
        if old is not None:
            ratio = {k: [n / o for n, o in zip(t[k], t[f"old {k}"])] for k in ("scan", "first")}
            print(f"  {args.rev}: first scan {_spread([o / a for o, a in zip(t['old first'], t['accelerate'])])}, "
                  f"repeated {_spread([o / a for o, a in zip(t['old scan'], t['accelerate'])])}; new / old: first "
                  f"{_spread(ratio['first'])}, repeated {_spread(ratio['scan'])}; ms old first "
                  f"{med['old first']:.2f} / repeated {med['old scan']:.2f}", flush=True)
    for name in ("flux", "sdxl", "llama"):  # issue 43 point 6: growth from 1x to 4x depth, against accelerate's
        one, four = medians.get(f"{name}-1x"), medians.get(f"{name}-4x")
        if one and four:
            g_scan, g_acc = four["scan"] / one["scan"], four["accelerate"] / one["accelerate"]
            print(f"{name} 1x -> 4x: scan x{g_scan:.2f}, accelerate x{g_acc:.2f}; growth over accelerate's "
                  f"x{g_scan / g_acc:.2f} (goal <= 1.1)")


if __name__ == "__main__":
    main()

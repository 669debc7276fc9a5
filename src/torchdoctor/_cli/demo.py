"""``torchdoctor demo``: diagnose and fix a small broken diffusion model, end to end, on CPU.

The model is a tiny diffusers ``UNet2DConditionModel`` in bf16 with LoRA adapters (peft) when diffusers and peft
are installed, else a self-contained torch model of the same shape (a conv, cross-attention projections with LoRA
adapters, a conv out), so the demo runs with torch alone. Three bugs are planted the way they happen in real
stacks: one adapter's ``lora_B`` left in float32 while its ``lora_A`` is bf16 (a partial LoRA load), a refiner
conv kept in a plain Python list (``Module.to`` never reaches it), and a plain tensor attribute left behind by
``.to()``. The text and the JSON name the same culprit.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import time
import warnings
from typing import Any

import torch
from torch import nn

ADAPTER_LAYER = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"


@contextlib.contextmanager
def _quiet() -> Any:
    """Library chatter (diffusers' fp32 notice, peft's warnings) is not what the demo is about."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                yield
        finally:
            logging.disable(logging.NOTSET)


PLAIN_ADAPTER_LAYER = "attn.to_q"


class LoraLinear(nn.Module):
    """A linear layer with one low-rank adapter, laid out as peft lays it out (``base_layer``, ``lora_A.default``,
    ``lora_B.default``)."""

    def __init__(self, features: int, rank: int = 4) -> None:
        super().__init__()
        self.base_layer = nn.Linear(features, features)
        self.lora_A = nn.ModuleDict({"default": nn.Linear(features, rank, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(rank, features, bias=False)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x))


class CrossAttention(nn.Module):
    def __init__(self, dim: int, context_dim: int) -> None:
        super().__init__()
        self.to_q = LoraLinear(dim)
        self.to_k = nn.Linear(context_dim, dim)
        self.to_v = nn.Linear(context_dim, dim)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        return self.to_out(torch.nn.functional.scaled_dot_product_attention(q, k, v))


class TinyDenoiser(nn.Module):
    """A denoiser shaped like a UNet block: conv in, cross-attention over the text states, conv out."""

    def __init__(self, channels: int = 4, dim: int = 8, context_dim: int = 8) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(channels, dim, 3, padding=1)
        self.time_embedding = nn.Embedding(1000, dim)
        self.attn = CrossAttention(dim, context_dim)
        self.conv_out = nn.Conv2d(dim, channels, 3, padding=1)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor) -> Any:
        h = self.conv_in(sample) + self.time_embedding(timestep)[:, :, None, None]
        b, c, hh, ww = h.shape
        tokens = h.flatten(2).transpose(1, 2)
        h = h + self.attn(tokens, encoder_hidden_states).transpose(1, 2).reshape(b, c, hh, ww)
        out = self.conv_out(h)
        for refiner in getattr(self, "refiners", []):
            out = refiner(out)
        return out  # latent_scale is read by the caller's sampler loop, as in the diffusers demo


def has_diffusers() -> bool:
    import importlib.util

    try:
        return all(importlib.util.find_spec(name) is not None for name in ("diffusers", "peft"))
    except (ImportError, ValueError):
        return False


def build_broken_plain() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The torch-only demo model, with the same three bugs."""
    torch.manual_seed(0)
    model: Any = TinyDenoiser()
    nn.init.normal_(model.attn.to_q.lora_B["default"].weight, std=0.02)  # peft starts lora_B at zero; a loaded one is not
    model.refiners = [nn.Conv2d(4, 4, 1)]  # bug 2: a submodule in a plain list
    model.latent_scale = torch.full((1, 4, 1, 1), 0.18215)  # bug 3: a plain tensor attribute
    model.to(torch.bfloat16)
    lora_b = model.attn.to_q.lora_B["default"]
    lora_b.weight.data = lora_b.weight.data.float()  # bug 1: lora_B fp32, lora_A bf16
    return model, _inputs()


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "sample": torch.randn(1, 4, 8, 8, generator=g).to(torch.bfloat16),
        "timestep": torch.tensor([10]),
        "encoder_hidden_states": torch.randn(1, 4, 8, generator=g).to(torch.bfloat16),
    }


def build_broken_unet() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The broken model and inputs for its forward."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "DIFFUSERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    with _quiet():
        from diffusers import UNet2DConditionModel
        from peft import LoraConfig

        torch.manual_seed(0)
        unet: Any = UNet2DConditionModel(
            block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, sample_size=8, in_channels=4,
            out_channels=4, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=8, attention_head_dim=2,
        )
        unet.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights=False,
                                    target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
        unet.refiners = [nn.Conv2d(4, 4, 1)]  # bug 2: a submodule in a plain list
        unet.latent_scale = torch.full((1, 4, 1, 1), 0.18215)  # bug 3: a plain tensor attribute
        unet.to(torch.bfloat16)
        layer = unet.get_submodule(ADAPTER_LAYER)
        name = next(iter(layer.lora_B))
        layer.lora_B[name].weight.data = layer.lora_B[name].weight.data.float()  # bug 1: lora_B fp32, lora_A bf16
    return unet, _inputs()


def _section(title: str) -> None:
    print(f"\n== {title} ==")


def run(as_json: bool = False, plain: bool | None = None) -> int:
    """The demo; ``plain`` picks the torch-only model (default: when diffusers or peft is missing)."""
    plain = (not has_diffusers()) if plain is None else plain
    if as_json:
        import json

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code, steps = _run(plain)
        print(json.dumps({"schema": "torchdoctor/demo/1", "ok": code == 0, **steps}))
        return code
    code, _ = _run(plain)
    return code


def _run(plain: bool) -> tuple[int, dict[str, Any]]:
    import torchdoctor

    t0 = time.perf_counter()
    unet, inputs = build_broken_plain() if plain else build_broken_unet()
    steps: dict[str, Any] = {"model": "torch" if plain else "diffusers"}
    print("A tiny denoiser (torch only: install diffusers and peft for the diffusers UNet)" if plain else
          "A tiny diffusers UNet", "in bf16 with LoRA adapters and three planted placement bugs.")

    _section("1. scan(unet, device='cpu', dtype=torch.bfloat16): what is wrong, by path")
    report = torchdoctor.scan(unet, device="cpu", dtype=torch.bfloat16)
    steps["scan"] = [p.path for p in report.problems]
    print(report.text(limit=10))

    _section("2. the forward fails; explain() says why")
    try:
        with _quiet(), torch.no_grad():
            unet(**inputs)
        print("forward ran (unexpected)")
        original: BaseException | None = None
    except RuntimeError as exc:
        original = exc
        print(f"RuntimeError: {str(exc).splitlines()[0]}")
        diagnoses = torchdoctor.explain(exc)
        if diagnoses:
            d = diagnoses[0]
            steps["explain"] = d.category
            print(f"explain -> [{d.category}] {d.title}")
            if d.fixes:
                print(f"  fix: {d.fixes[0][0]}: {d.fixes[0][1].splitlines()[0]}")

    _section("3. guard() names the module and the tensor")
    try:
        with _quiet(), torch.no_grad(), torchdoctor.guard(unet):
            unet(**inputs)
    except torchdoctor.PlacementError as exc:
        steps["guard"] = exc.module_path
        culprit = next((p.path for p in exc.problems), None)
        steps["culprit"] = culprit
        print(_as_unet(str(exc), unet))
        print(f"culprit: {culprit}")

    _section("4. move(unet, 'cpu', torch.bfloat16): fix everything, verified")
    with _quiet():
        moved = torchdoctor.move(unet, device="cpu", dtype=torch.bfloat16)
    steps["moved"] = len(moved.moved)
    print(moved.text() if hasattr(moved, "text") else moved)
    after = torchdoctor.scan(unet, device="cpu", dtype=torch.bfloat16)
    steps["scan_after"] = after.ok
    print(f"scan after move: {'ok' if after.ok else after.text()}")
    with _quiet(), torch.no_grad():
        out = getattr(unet(**inputs), "sample", None)
        out = unet(**inputs) if out is None else out
    print(f"forward now runs: {tuple(out.shape)} {out.dtype}")

    _section("5. simulate on cuda:1 (no GPU here)")
    with _quiet():
        sim = torchdoctor.simulate(unet, inputs, device="cuda:1", dtype=torch.bfloat16)
    steps["simulate_ok"] = sim.ok
    print("unet.to('cuda:1') then forward, would it run? " + ("yes" if sim.ok else "no\n" + _as_unet(sim.text(), unet)))

    _section("6. simulate again, with torchdoctor.move(unet, 'cuda:1') instead of .to()")

    def with_move(copy: Any) -> Any:
        torchdoctor.move(copy, "cuda:1")  # also moves the list-held refiner and the plain attribute
        return copy(**{k: v.to("cuda:1") for k, v in inputs.items()})

    with _quiet():
        sim2 = torchdoctor.simulate(unet, device="cuda:1", dtype=torch.bfloat16, call=with_move)
    steps["simulate_after_move_ok"] = sim2.ok
    print("would it run? " + ("yes: " + sim2.text() if sim2.ok else "no\n" + sim2.text()))

    elapsed = time.perf_counter() - t0
    steps["seconds"] = round(elapsed, 2)
    ok = bool(steps["scan"]) and steps.get("scan_after") is True and original is not None \
        and steps.get("simulate_after_move_ok") is True
    print(f"\ndemo finished in {elapsed:.1f} s")
    return (0 if ok else 1), steps


def _as_unet(text: str, unet: Any) -> str:
    """A fix the API writes for its ``model`` argument, written with the demo's own name for it (``unet``)."""
    from torchdoctor._run.names import held_code

    return held_code(text, {"unet": unet})


def command(args: argparse.Namespace) -> int:
    return run(as_json=bool(getattr(args, "json", False)), plain=True if getattr(args, "plain", False) else None)

"""Whole programs carried to their end on a virtual cuda:1 with the numbers a CPU run of the same program gives and
the placements a GPU machine would give: a training step with AMP's scaler, gradient clipping, a scheduler, an EMA
(``AveragedModel``) and a checkpoint read back with ``map_location``; an app's own offload hooks that move each
block's weights to the GPU on a side stream from pinned memory and back after its forward (``p.data = ...``); and
a generation saved as PNG through numpy and PIL, as safetensors and with ``torch.save``."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import torchdoctor


def _train(dev: torch.device) -> dict[str, Any]:
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    torch.manual_seed(0)
    def build() -> nn.Module:
        return nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.BatchNorm1d(8), nn.ReLU(), nn.Flatten(),
                             nn.Linear(64, 3)).to(dev)
    model = build()
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    opt = torch.optim.AdamW(model.parameters(), lr=0.02)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.02, total_steps=6)
    scaler = torch.amp.GradScaler(dev.type, enabled=dev.type == "cuda")
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        x, y = torch.randn(6, 4, 8, generator=g).to(dev, non_blocking=True), torch.randint(0, 3, (6,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y.to(dev), label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        sched.step()
        ema.update_parameters(model)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf, map_location=dev)
    again = build()
    again.load_state_dict(ck["model"])
    opt2 = torch.optim.AdamW(again.parameters(), lr=0.02)
    opt2.load_state_dict(ck["opt"])
    state = opt2.state[next(iter(again.parameters()))]["exp_avg"]
    return {"loss": loss.item(), "norm": float(norm), "ema": sum(p.sum().item() for p in ema.module.parameters()),
            "n": int(ema.n_averaged), "lr": sched.get_last_lr()[0], "state": str(state.device),
            "model": str(next(again.parameters()).device)}


def _offload(dev: torch.device) -> dict[str, Any]:
    torch.manual_seed(0)
    gpu = dev.type == "cuda"
    blocks = [nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.SiLU()) for _ in range(3)]
    stream = torch.cuda.Stream(dev) if gpu else None

    def load(b: nn.Module) -> None:
        with torch.cuda.stream(stream) if stream is not None else torch.no_grad():
            for p in b.parameters():
                p.data = p.data.to(dev, non_blocking=True)

    def pre(mod: nn.Module, args: Any) -> None:
        if next(mod.parameters()).device != dev:
            load(mod)
        if stream is not None:
            torch.cuda.current_stream(dev).wait_stream(stream)
        i = blocks.index(mod)
        if i + 1 < len(blocks):
            load(blocks[i + 1])  # prefetch the next block

    def post(mod: nn.Module, args: Any, out: Any) -> Any:
        for p in mod.parameters():
            p.data = p.data.to("cpu", non_blocking=True)
        return out

    for b in blocks:
        for p in b.parameters():
            p.data = p.data.pin_memory() if gpu else p.data
        b.register_forward_pre_hook(pre)
        b.register_forward_hook(post)
    x = torch.randn(3, 8, device=dev)
    with torch.no_grad():
        for b in blocks:
            x = b(x)
    return {"out": x.sum().item(), "on": str(x.device), "weights": sorted({str(p.device) for b in blocks
                                                                          for p in b.parameters()})}


def _save(dev: torch.device, tmp: Path) -> dict[str, Any]:
    from PIL import Image
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    net = nn.Sequential(nn.ConvTranspose2d(4, 3, 4, stride=2, padding=1), nn.Tanh()).to(dev)
    with torch.inference_mode():
        img = net(torch.randn(2, 4, 8, 8, device=dev))
    a = ((img[0].permute(1, 2, 0) + 1) * 127.5).clamp(0, 255).to(torch.uint8).cpu().numpy()
    Image.fromarray(a).save(tmp / "0.png")
    png = np.asarray(Image.open(tmp / "0.png"))
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp / "net.safetensors"))
    sd = load_file(str(tmp / "net.safetensors"), device=str(dev))
    torch.save(img, tmp / "img.pt")
    back = torch.load(tmp / "img.pt")
    return {"png": (png.shape, int(png.astype(np.int64).sum())), "sd": sorted({str(v.device) for v in sd.values()}),
            "pt": str(back.device), "same": torch.equal(back.cpu(), img.cpu())}


def _both(fn: Any, *dirs: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``fn`` run on the cpu, then on a virtual cuda:1 (each in its own folder when given two)."""
    plain = fn(torch.device("cpu"), *dirs[:1])
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        run = fn(torch.device("cuda:1"), *dirs[1:])
    assert sim.ok, sim.problems
    return plain, run


def test_a_training_step_with_scaler_clipping_scheduler_and_ema_ends_as_on_the_cpu() -> None:
    plain, run = _both(_train)
    for k in ("loss", "norm", "ema", "lr"):
        assert abs(plain[k] - run[k]) < 1e-5, (k, plain[k], run[k])
    assert plain["n"] == run["n"] == 6
    assert (run["state"], run["model"]) == ("cuda:1", "cuda:1")  # the checkpoint read back where it was asked


def test_an_apps_own_offload_hooks_leave_the_weights_where_a_gpu_would() -> None:
    plain, run = _both(_offload)
    assert abs(plain["out"] - run["out"]) < 1e-5
    assert run["on"] == "cuda:1"
    assert run["weights"] == ["cpu"]  # each block sent back after its forward (was cuda:1: a stale device label)


def test_outputs_saved_as_png_safetensors_and_torch_save_match_the_cpu_run(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain, run = _both(_save, tmp_path / "a", tmp_path / "b")
    assert plain["png"] == run["png"]
    assert run["sd"] == ["cuda:1"] and run["pt"] == "cuda:1" and run["same"]

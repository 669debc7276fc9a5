"""What apps do on purpose, each mechanism re-created in a few lines of our own (no app code is copied), read from
(ComfyUI comfy/ops.py, comfy/model_patcher.py, comfy/model_sampling.py at master 2026-02; SD.Next
modules/lora/lora_apply.py at 058a7f0; kohya-ss sd-scripts networks/lora.py at 48d368f). Both ways: the app's
correct state is quiet, a real bug planted in the same state is named by its path — also after a scan of the
correct state in the same process.

"meta" stands in for the accelerator (this machine has none): ``scan(..., device="meta")``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor

BF16 = torch.bfloat16


def paths(report: torchdoctor.ScanReport) -> list[str]:
    return sorted(p.path for p in report.problems)


# --- layers whose own forward casts or moves their weights per call (ComfyUI comfy.ops manual_cast / lowvram) ----


def weights_for(layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Our helper: the layer's weight and bias brought to the input's device and dtype for this call only."""
    bias = layer.bias.to(x.device, x.dtype) if layer.bias is not None else None
    return layer.weight.to(x.device, x.dtype), bias


class PerCallLinear(nn.Linear):
    """Casts per call when switched on for the class or the instance, or when patches wait to be applied."""

    cast_on_call = False
    patch_fns: list = []

    def forward_cast(self, x: torch.Tensor) -> torch.Tensor:
        w, b = weights_for(self, x)
        for fn in self.patch_fns:
            w = fn(w)
        return F.linear(x, w, b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cast_on_call or len(self.patch_fns) > 0:
            return self.forward_cast(x)
        return super().forward(x)


class AlwaysCastLinear(PerCallLinear):
    cast_on_call = True  # the manual_cast flavour: a class that always casts


def _stack() -> nn.Sequential:
    return nn.Sequential(*[PerCallLinear(8, 8) for _ in range(4)], nn.LayerNorm(8)).to(BF16)


def test_fp8_storage_and_fp16_weights_under_casting_layers_are_intended() -> None:
    m = _stack()
    m[0].weight.data = m[0].weight.data.to(torch.float8_e4m3fn)
    m[0].cast_on_call = True
    m[1].to(torch.float16)
    m[1].cast_on_call = True
    assert m(torch.ones(2, 8, dtype=BF16)).dtype == BF16  # the app's state runs
    assert paths(torchdoctor.scan(m)) == []
    assert paths(torchdoctor.scan(m, dtype=BF16)) == []
    m[3].to(torch.float32)  # a plain (non-casting) layer left in fp32: a real bug
    try:
        m(torch.ones(2, 8, dtype=BF16))
        raise AssertionError("the planted leftover should break the forward")
    except RuntimeError as exc:
        assert "dtype" in str(exc)
    assert paths(torchdoctor.scan(m)) == ["3.bias", "3.weight"]


def test_lowvram_partial_load_is_intended_and_a_leftover_is_found() -> None:
    m = _stack()
    for i in (0, 1):  # loaded on the device
        m[i].to("meta")
    m[4].to("meta")
    for i in (2, 3):  # kept on cpu, cast per call by their own forward (switched on per instance)
        m[i].cast_on_call = True
    assert paths(torchdoctor.scan(m, device="meta")) == []
    m[3].cast_on_call = False  # now nothing moves it at call: a leftover on cpu
    assert paths(torchdoctor.scan(m, device="meta")) == ["3.bias", "3.weight"]
    assert all(p.kind == "device" for p in torchdoctor.scan(m, device="meta").problems)


def test_pending_patches_switch_per_call_casting_on() -> None:
    m = _stack()
    m[2].to(torch.float16)
    assert paths(torchdoctor.scan(m)) == ["2.bias", "2.weight"]
    m[2].patch_fns = [lambda w: w * 1.0]  # a LoRA patch applied at call: the layer casts itself now
    assert paths(torchdoctor.scan(m)) == []


def test_a_class_that_always_casts_needs_no_switch() -> None:
    m = nn.Sequential(AlwaysCastLinear(8, 8), nn.Linear(8, 8)).to(BF16)
    m[0].to(torch.float16)
    assert m(torch.ones(1, 8, dtype=BF16)).dtype == BF16
    assert paths(torchdoctor.scan(m)) == []


def test_a_false_positive_does_not_hide_a_later_bug_on_the_same_path() -> None:
    m = _stack()
    m[2].to(torch.float16)
    first = paths(torchdoctor.scan(m))  # a plain layer in fp16: reported
    m[2].cast_on_call = True
    assert first == ["2.bias", "2.weight"] and paths(torchdoctor.scan(m)) == []
    m[2].cast_on_call = False
    m[2].to(torch.float32)
    assert paths(torchdoctor.scan(m)) == ["2.bias", "2.weight"]


# --- schedule tables outside the denoiser's forward (ComfyUI model_sampling.sigmas) -------------------------------


class Schedule(nn.Module):
    """No forward of its own: tables read by its methods, which move what they return to the caller's device."""

    def __init__(self) -> None:
        super().__init__()
        betas = torch.linspace(1e-4, 2e-2, 50, dtype=torch.float64)
        sig = ((1 - torch.cumprod(1 - betas, 0)) / torch.cumprod(1 - betas, 0)) ** 0.5
        self.register_buffer("sigmas", sig.float())
        self.register_buffer("log_sigmas", sig.log().float())

    def sigma(self, t: torch.Tensor) -> torch.Tensor:
        return self.sigmas[t.long().to(self.sigmas.device)].to(t.device)


class Denoiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.diffusion_model = nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Linear(16, 8))
        self.model_sampling = Schedule()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        sigma = self.model_sampling.sigma(t)
        return self.diffusion_model(x * (1 / (sigma[:, None] ** 2 + 1) ** 0.5).to(x.dtype))


def test_fp32_schedule_tables_beside_a_bf16_denoiser_are_intended() -> None:
    model = Denoiser()
    model.diffusion_model.to(BF16)
    assert model(torch.ones(2, 8, dtype=BF16), torch.tensor([3, 7])).dtype == BF16
    assert paths(torchdoctor.scan(model)) == []
    assert paths(torchdoctor.scan(model, dtype=BF16)) == []
    model.diffusion_model[2].bias.data = model.diffusion_model[2].bias.data.float()
    assert paths(torchdoctor.scan(model)) == ["diffusion_model.2.bias"]


# --- weight backups LoRA patchers keep on cpu (SD.Next network_weights_backup / network_bias_backup) ---------------


def test_weight_backups_on_cpu_are_intended_and_a_read_attribute_is_judged() -> None:
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    for layer in m:
        layer.network_weights_backup = layer.weight.detach().clone()
        layer.network_bias_backup = layer.bias.detach().clone()
    m.to("meta")  # the model on its device; the backups stay on cpu (Module.to never moves plain attributes)
    assert m[0].network_weights_backup.device.type == "cpu"
    assert paths(torchdoctor.scan(m, device="meta")) == []
    cast = nn.Sequential(nn.Linear(8, 8))
    cast[0].network_weights_backup = cast[0].weight.detach().clone()
    cast.to(BF16)  # the backup keeps the dtype it was saved in
    assert paths(torchdoctor.scan(cast)) == [] and paths(torchdoctor.scan(cast, dtype=BF16)) == []

    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * self.gain  # read by its own forward: must be where the weight is

    s = Scaled(8, 8)
    s.gain = torch.ones(8, 8)  # shaped like the weight, but read: not a backup
    s.to("meta")
    assert paths(torchdoctor.scan(s, device="meta")) == ["gain"]


# --- forward-replacing LoRA networks (kohya sd-scripts networks/lora.py) -------------------------------------------


class LoRAPatch(nn.Module):
    """Holds the low-rank pair itself and replaces the patched module's forward with its own."""

    def __init__(self, name: str, org: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.lora_name = name
        self.lora_down = nn.Linear(org.in_features, rank, bias=False)
        self.lora_up = nn.Linear(rank, org.out_features, bias=False)
        self.org_module = org

    def apply_to(self) -> None:
        self.org_forward = self.org_module.forward
        self.org_module.forward = self.forward
        del self.org_module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.org_forward(x) + self.lora_up(self.lora_down(x))


def _patched(base: torch.dtype = BF16) -> tuple[nn.Sequential, list[LoRAPatch]]:
    unet = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    net = [LoRAPatch(f"lora_unet_{i}", unet[i]) for i in (0, 2)]
    for lora in net:
        lora.apply_to()
    unet.to(base)  # a bf16 base with the network in fp32 (trained under autocast): by design
    return unet, net


def test_lora_network_tensors_are_seen_by_path_and_judged_against_the_patched_module() -> None:
    unet, _ = _patched()
    with torch.autocast("cpu", dtype=BF16):
        assert unet(torch.ones(1, 8, dtype=BF16)).dtype == BF16
    report = torchdoctor.scan(unet)
    seen = {t.path for t in report.tensors}
    assert {"0.forward.__self__.lora_down.weight", "0.forward.__self__.lora_up.weight",
            "2.forward.__self__.lora_up.weight"} <= seen
    assert paths(report) == []


def test_a_lora_network_mixed_within_itself_is_named_with_the_module_it_patches() -> None:
    unet, net = _patched(torch.float32)
    assert torchdoctor.scan(unet).ok
    net[1].lora_up.to(BF16)  # lora_down fp32, lora_up bf16: the patched forward fails
    try:
        unet(torch.ones(1, 8))
        raise AssertionError("a mixed LoRA pair should break the forward")
    except RuntimeError:
        pass
    report = torchdoctor.scan(unet)
    assert [p.path for p in report.problems] == ["2.forward.__self__.lora_up.weight"]
    assert "'2'" in report.problems[0].message


# --- an app's convention where no mechanism shows (ComfyUI ModelPatcher.backup) ------------------------------------


class Patcher:
    """A plain object holding the model and the weights saved before a patch, on the offload device."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.backup = {"0.weight": model[0].weight.detach().clone()}
        self.extra = torch.zeros(3)


def test_patcher_backup_is_intended_under_strict_and_other_state_is_judged() -> None:
    model = nn.Sequential(nn.Linear(8, 8))
    patcher = Patcher(model)
    model.to("meta")
    report = torchdoctor.scan(patcher, device="meta", strict=True)
    assert paths(report) == ["extra"]
    assert paths(torchdoctor.scan(patcher, device="meta")) == []


# --- a ComfyUI-shaped lowvram state of a real diffusers UNet -----------------------------------------------------


def _casting(base: type) -> type:
    class Casting(base):  # type: ignore[misc, valid-type]
        cast_on_call = False

        def forward_cast(self, x: torch.Tensor, *rest: object) -> torch.Tensor:
            w, b = weights_for(self, x)
            return self._conv_forward(x, w, b) if isinstance(self, nn.Conv2d) else F.linear(x, w, b)

        def forward(self, x: torch.Tensor, *rest: object) -> torch.Tensor:
            if self.cast_on_call:
                return self.forward_cast(x, *rest)
            return super().forward(x, *rest)

    return Casting


def test_lowvram_unet_with_fp8_storage_schedule_and_backups_is_quiet_and_a_leftover_is_found() -> None:
    from support import zoo

    unet = zoo.tiny_unet(BF16)
    kinds = {c: _casting(c) for c in (nn.Linear, nn.Conv2d)}
    layers = [m for m in unet.modules() if type(m) in kinds]
    for m in layers:
        m.__class__ = kinds[type(m)]
    model = Denoiser()
    model.diffusion_model = unet
    for i, m in enumerate(layers):
        if i % 2:  # kept on cpu and cast per call, some stored in fp8, backups beside them
            m.cast_on_call = True
            m.network_weights_backup = m.weight.detach().clone()
            if isinstance(m, nn.Linear):
                m.weight.data = m.weight.data.to(torch.float8_e4m3fn)
        else:
            m.to("meta")
    for m in unet.modules():  # everything else is loaded on the device
        if type(m) not in kinds.values() and not any(True for _ in m.children()):
            m.to("meta")
    model.model_sampling.to("meta")
    assert paths(torchdoctor.scan(model, device="meta")) == []
    victim = next(m for i, m in enumerate(layers) if i % 2 and isinstance(m, nn.Conv2d))
    victim.cast_on_call = False  # nothing moves it at call any more
    path = next(p for p, m in model.named_modules() if m is victim)
    assert paths(torchdoctor.scan(model, device="meta")) == [f"{path}.bias", f"{path}.weight"]

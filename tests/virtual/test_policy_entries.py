"""One policy through every entry, a virtual run included (issue 40 point 4): for each state an app leaves its model
in, ``scan(obj, device)``, a forward under ``virtual_devices``, the ComfyUI node pack's ``check_report`` and the
SD.Next / A1111 / Forge extension's ``check`` give the same answer on cuda, xpu and mps: nothing on the correct state,
and the same path for a bug planted after it (a plain tensor attribute left on the cpu that a block's forward adds
as it is).

The mechanisms are re-created in a few lines of our own after reading the apps (no app code copied): ComfyUI
``comfy/ops.py`` / ``comfy/model_patcher.py`` (lowvram partial loads: layers left on the offload device with a
``comfy_cast_weights``-like flag, float8 storage cast per call, LoRA patches as ``weight_function`` applied per
call); SD.Next 058a7f0 ``modules/sd_offload.py`` (balanced offload: an accelerate ``ModelHook`` subclass with
``execution_device``, attached with ``add_hook_to_module``) and ``modules/lora`` (fuse off: the original weights kept
as tensors under ``network_weights_backup``); InvokeAI 8e71a8a ``torch_module_autocast`` (weights in RAM, cast per
call through a ``_cast_weight_bias_for_input``-like method); Forge dfdcbab ``backend/operations.py`` (a manual-cast
flag and a module-level helper handed the layer).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import accelerate.hooks
import pytest
import torch
import torch.nn.functional as F
from scan.test_app_entries import _load_extension, _load_node_pack
from torch import nn

import torchdoctor

BF16 = torch.bfloat16
KINDS = ("cuda:0", "xpu:0", "mps:0")


# --- the model every app runs: blocks of the app's layer kind, each adding a plain tensor when one is set ----------


class Block(nn.Module):
    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.proj = layer
        self.shift: torch.Tensor | None = None  # a plain attribute: Module.to never moves it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return h if self.shift is None else h + self.shift


class Denoiser(nn.Module):
    def __init__(self, layer: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(layer()) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


# --- ComfyUI: cast layers switched per instance, LoRA patches applied per call, a patcher holding the model ---------


def place(t: torch.Tensor, dtype: torch.dtype | None, device: torch.device, copy: bool) -> torch.Tensor:
    """Our ops layer's copy to the compute device: an empty tensor there, filled from the stored one."""
    if t.device == device:
        return t.to(dtype=dtype, copy=copy) if copy or (dtype is not None and dtype != t.dtype) else t
    out = torch.empty_like(t, dtype=dtype, device=device)
    out.copy_(t)
    return out


def weight_and_bias(s: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Our ops layer's per-call cast (a module-level helper handed the layer): the weight brought over in its stored
    dtype (float8 stays float8 on the way), then cast to the input's; pending patches applied to the copies."""
    weight = place(s.weight, None, x.device, copy=len(s.weight_function) > 0)
    bias = None if s.bias is None else place(s.bias, x.dtype, x.device, copy=len(s.bias_function) > 0)
    for f in s.bias_function:
        bias = f(bias)
    if s.weight_function or weight.dtype != x.dtype:
        weight = weight.to(dtype=x.dtype)
        for f in s.weight_function:
            weight = f(weight)
    return weight, bias


class CastFlags:
    cast_weights = False
    weight_function: list[Callable[[torch.Tensor], torch.Tensor]] = []
    bias_function: list[Callable[[torch.Tensor], torch.Tensor]] = []


class OpsLinear(nn.Linear, CastFlags):
    def __init__(self) -> None:
        super().__init__(8, 8)

    def forward_cast(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, *weight_and_bias(self, x))

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.cast_weights or len(self.weight_function) > 0 or len(self.bias_function) > 0:
            return self.forward_cast(*args, **kwargs)
        return super().forward(*args, **kwargs)


class Model(nn.Module):
    """What the patcher holds (ComfyUI's and Forge's model classes are modules): the denoiser and where it is."""

    def __init__(self, layer: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.diffusion_model = Denoiser(layer).to(BF16)
        self.device, self.model_lowvram = torch.device("cpu"), False


class Patcher:
    def __init__(self, load: str, layer: Callable[[], nn.Module] = lambda: OpsLinear()) -> None:
        self.model = Model(layer)
        self.load_device, self.offload_device = torch.device(load), torch.device("cpu")
        self.current_device = self.offload_device

    def load(self, keep: tuple[int, ...] = ()) -> None:
        """On the load device; the blocks in ``keep`` stay on the offload device and cast per call (lowvram)."""
        for i, block in enumerate(self.model.diffusion_model.blocks):
            if i in keep:
                block.proj.cast_weights = True
            else:
                block.to(self.load_device)
        self.model.model_lowvram = bool(keep)
        self.model.device = self.current_device = self.load_device


def comfy(state: str, kind: str) -> tuple[Any, nn.Module, str]:
    patcher = Patcher(kind)
    blocks = patcher.model.diffusion_model.blocks
    if state == "at rest":
        return patcher, patcher.model.diffusion_model, "cpu"
    patcher.load(keep=() if state in ("loaded", "loaded fp8") else (1, 2))
    if "fp8" in state:  # float8 storage: every cast layer casts it to the compute dtype per call
        for i in ((0, 1, 2) if state == "loaded fp8" else (1,)):
            blocks[i].proj.weight.data = blocks[i].proj.weight.data.to(torch.float8_e4m3fn)
            blocks[i].proj.cast_weights = True
    if state == "lowvram lora":
        blocks[0].proj.weight_function = [lambda w: w * 1.0]  # a patch on a loaded layer: cast per call too
        blocks[2].proj.bias_function = [lambda b: b + 0.0]
    return patcher, patcher.model.diffusion_model, kind


# --- SD.Next: balanced offload by an accelerate hook of its own; LoRA backups kept as tensors ----------------------


class Offload(accelerate.hooks.ModelHook):
    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        module.to(self.execution_device)
        return args, kwargs


class DispatchingOffload(accelerate.hooks.ModelHook):
    """The balanced offload as SD.Next moves a component: accelerate's ``dispatch_model`` onto the execution device
    with ``force_hooks``, which puts accelerate's own hooks on the component and on each of its modules."""

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if module.blocks[0].proj.weight.device != self.execution_device:
            module = accelerate.dispatch_model(module, main_device=self.execution_device, force_hooks=True,
                                               device_map={"": self.execution_device})
            module._hf_hook.execution_device = self.execution_device
        return args, kwargs


def sdnext(state: str, kind: str) -> tuple[Any, nn.Module, str]:
    pipe = types.SimpleNamespace(unet=Denoiser(lambda: nn.Linear(8, 8)).to(BF16))
    hook = DispatchingOffload() if "dispatched" in state else Offload()
    hook.execution_device = torch.device(kind)
    accelerate.hooks.add_hook_to_module(pipe.unet, hook, append=True)
    if "at rest" not in state:
        pipe.unet(torch.ones(1, 8, dtype=BF16, device=kind))  # a generation: the hook brought the unet over
    if state == "lora backups":
        for block in pipe.unet.blocks:
            block.proj.network_weights_backup = block.proj.weight.detach().to("cpu").clone()
            block.proj.network_bias_backup = block.proj.bias.detach().to("cpu").clone()
            with torch.no_grad():
                block.proj.weight += 0.01
    return pipe, pipe.unet, kind


# --- InvokeAI: weights in RAM, cast per call through a method of the layer -----------------------------------------


def to_device(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if t is None else t.to(device)


class AutocastLinear(nn.Linear):
    def __init__(self) -> None:
        super().__init__(8, 8)
        self._autocasting = False

    def _weight_bias_for_input(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return to_device(self.weight, x.device), to_device(self.bias, x.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._autocasting:
            w, b = self._weight_bias_for_input(x)
            assert w is not None
            return F.linear(x, w, b)
        return super().forward(x)


def invoke(state: str, kind: str) -> tuple[Any, nn.Module, str]:
    unet = Denoiser(AutocastLinear).to(BF16)
    unet.blocks[0].to(kind)  # the budget held one block; the others stay in RAM and cast per call
    for block in unet.blocks[1:]:
        block.proj._autocasting = True
    return unet, unet, kind


# --- Forge: a manual-cast flag, a module-level helper handed the layer, patchers in an engine ----------------------


def weights_for(layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    b = layer.bias
    return layer.weight.to(device=x.device, dtype=x.dtype), None if b is None else b.to(x.device, x.dtype)


class ForgeLinear(nn.Linear):
    manual_cast = False

    def __init__(self) -> None:
        super().__init__(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.manual_cast:
            return F.linear(x, *weights_for(self, x))
        return F.linear(x, self.weight, self.bias)


def forge(state: str, kind: str) -> tuple[Any, nn.Module, str]:
    patcher = Patcher(kind, ForgeLinear)
    patcher.model.diffusion_model.blocks[0].to(kind)  # the memory manager swapped blocks 1, 2 to the cpu
    for block in patcher.model.diffusion_model.blocks[1:]:
        block.proj.manual_cast = True
    patcher.model.device = patcher.current_device = patcher.load_device
    patcher.model.model_lowvram = True
    engine = types.SimpleNamespace(forge_objects=types.SimpleNamespace(unet=patcher))
    return engine, patcher.model.diffusion_model, kind


STATES: list[tuple[str, Callable[[str, str], tuple[Any, nn.Module, str]], str]] = [
    ("at rest", comfy, "comfy"), ("loaded", comfy, "comfy"), ("lowvram", comfy, "comfy"),
    ("lowvram fp8", comfy, "comfy"), ("loaded fp8", comfy, "comfy"), ("lowvram lora", comfy, "comfy"),
    ("offload at rest", sdnext, "sdnext"), ("offload after generation", sdnext, "sdnext"),
    ("lora backups", sdnext, "sdnext"), ("dispatched at rest", sdnext, "sdnext"),
    ("dispatched after generation", sdnext, "sdnext"), ("autocast partial load", invoke, "invoke"),
    ("manual cast", forge, "forge")]


def _answers(obj: Any, root: nn.Module, at: str, kind: str, node: Any, ext: Any, sim: Any) -> dict[str, list[str]]:
    """Each entry's problem paths, relative to the denoiser (``blocks.1.shift``); the static entries first, then
    a forward in the session (what it records anew)."""
    prefix = {id(m): p for p, m in _named(obj)}.get(id(root), "")

    def rel(report: Any, strip: str = prefix) -> list[str]:
        return sorted(p.path[len(strip) + 1:] if strip and p.path.startswith(strip + ".") else p.path
                      for p in report.problems)

    node_prefix = prefix[len("model."):] if prefix.startswith("model.") else prefix
    out = {"scan": rel(torchdoctor.scan(obj, device=kind)),
           "node": rel(node.check_report(obj), node_prefix if hasattr(obj, "model") else prefix),
           "extension": rel(ext.check(obj, "generation"))}
    before = len(sim.problems)
    with torch.no_grad():
        root(torch.ones(1, 8, dtype=BF16, device=at))
    out["run"] = sorted(p.path for p in sim.problems[before:])
    return out


def _named(obj: Any) -> list[tuple[str, nn.Module]]:
    """Module paths as scan names them, for the few holders used here (plain objects holding modules)."""
    out: list[tuple[str, nn.Module]] = []
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, nn.Module):
            out.extend((f"{path}.{p}".strip(".") if p else path, m) for p, m in v.named_modules())
        elif hasattr(v, "__dict__") and not isinstance(v, type):
            stack.extend((f"{path}.{k}".strip("."), x) for k, x in vars(v).items() if not k.startswith("_"))
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("state", "make", "app"), STATES, ids=[s[0] for s in STATES])
def test_every_entry_gives_one_answer_on_the_state_and_on_a_bug_planted_after_it(
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, kind: str, state: str, make: Any,
        app: str) -> None:
    if "dispatched" in state and kind.startswith("xpu"):
        # accelerate caches is_xpu_available() (lru_cache): asked before the session it said False, and
        # set_module_tensor_to_device refused "xpu:0 is not available" until the session cleared that cache
        import accelerate.utils.imports as acc

        assert acc.is_xpu_available() is False
    node = _load_node_pack(monkeypatch)
    ext, _ = _load_extension(monkeypatch, kind)
    planted: dict[str, list[str]] | None = None
    # asserted after the block: a session that recorded problems takes an exception in its block for their
    # consequence (raise_on_exit=False keeps it from the caller)
    with torchdoctor.virtual_devices(kind, raise_on_exit=False) as sim:
        obj, root, at = make(state, kind)
        steps = list(sim.problems)  # the app's own steps (a generation) are quiet
        quiet = _answers(obj, root, at, kind, node, ext, sim)
        if at != "cpu":  # at rest everything is on the cpu: a cpu attribute is where the model is
            root.blocks[1].shift = torch.zeros(8, dtype=BF16)  # left on the cpu; the block adds it as it is
            planted = _answers(obj, root, at, kind, node, ext, sim)
    if "fp8" in state and kind.startswith("mps"):  # MPS holds no float8: its move there is refused, as on a Mac
        first = [p for p in sim.problems if p.kind == "unsupported_dtype"][:1]
        assert first and first[0].found == "float8_e4m3fn" and "mps cannot hold float8_e4m3fn" in first[0].message, (
            state, sim.problems)
        return
    assert steps == [], (state, steps)
    assert quiet == {"scan": [], "node": [], "extension": [], "run": []}, (state, quiet)
    if planted is not None:
        assert planted == dict.fromkeys(planted, ["blocks.1.shift"]), (state, planted)
        # the fix moves the attribute, never a component the app offloads or loads itself
        fix = str(sim.error()).split("Fix:", 1)[-1]  # the session's report, made when it ends
        moves = [line for line in fix.splitlines() if ".to(" in line]
        assert moves and all("blocks[1].shift" in line for line in moves), fix

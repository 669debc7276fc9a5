"""Quiet by mechanism, whatever the app (issue 40 point 4, issue 41 points 3 and 4). Each mechanism is re-created in
a few lines of our own, after reading the apps (no app code copied): SD.Next 058a7f0 ``modules/sd_offload.py``
(balanced offload: an accelerate ``ModelHook`` subclass that moves the component in ``pre_forward``, its
``execution_device`` set on ``module._hf_hook``); InvokeAI 8e71a8a ``torch_module_autocast/custom_modules`` (layers
that keep weights in RAM and cast them per call through a helper, switched per instance, with patches, and when the
dtype differs); Forge dfdcbab ``backend/operations.py`` (``parameters_manual_cast`` and a module-level helper handed
the layer); transformers 5 rotary embeddings (the real class); SD.Next weight backups kept under backup names.
Both ways each time: the app's correct state is quiet, a real bug planted in it is named by its path.
"""

from __future__ import annotations

import accelerate.hooks
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor
from torchdoctor._scan import apps, percall

BF16, F16 = torch.bfloat16, torch.float16
GPU = torch.device("cuda:0")  # only compared: scan never touches the device


def paths(report: torchdoctor.ScanReport) -> list[str]:
    return sorted(p.path for p in report.problems)


# --- an app's own accelerate hook that moves the component at call (SD.Next balanced offload) ----------------------


class RestOnCpuHook(accelerate.hooks.ModelHook):
    """Our balanced offload: the component rests on the cpu and is brought to the execution device per call."""

    def __init__(self) -> None:
        super().__init__()
        self.moves = 0

    def pre_forward(self, module: nn.Module, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.moves += 1  # (a real app moves ``module`` to ``self.execution_device`` here)
        return args, kwargs


class Pipe:
    """A pipeline as apps hold one: components as attributes of a plain object."""

    def __init__(self) -> None:
        self.unet = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 8)).to(BF16)
        self.vae = nn.Sequential(nn.Conv2d(3, 4, 1)).to(BF16)
        self.text_encoder = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8)).to(BF16)


def _offloaded(shared: bool = True) -> Pipe:
    pipe = Pipe()
    hook = RestOnCpuHook()
    for name in ("unet", "vae", "text_encoder"):
        module = getattr(pipe, name)
        accelerate.hooks.add_hook_to_module(module, hook if shared else RestOnCpuHook(), append=True)
        module._hf_hook.execution_device = GPU  # set on the module's hook, as the app does after adding it
    return pipe


def test_components_resting_on_cpu_under_an_apps_own_hook_are_quiet() -> None:
    pipe = _offloaded()
    assert pipe.unet(torch.ones(1, 8, dtype=BF16)).dtype == BF16 and pipe.unet._hf_hook.moves == 1
    for device in (None, GPU):
        report = torchdoctor.scan(pipe, device=device)
        assert paths(report) == [], report.problems[:3]
        assert report.relocations()[1] == []  # no ``.to('cuda:0')`` that would undo the offload
    assert "RestOnCpuHook" in torchdoctor.scan(pipe, device=GPU).expected["unet"]["offloaded"]
    # the same hook wrapped in a SequentialHook beside another one (append=True on a module with a hook)
    accelerate.hooks.add_hook_to_module(pipe.unet, accelerate.hooks.ModelHook(), append=True)
    assert type(pipe.unet._hf_hook).__name__ == "SequentialHook"
    pipe.unet._hf_hook.execution_device = GPU
    assert paths(torchdoctor.scan(pipe, device=GPU)) == []


def test_offload_by_an_apps_hook_still_names_real_bugs() -> None:
    pipe = _offloaded()
    pipe.unet[2].to(torch.float32)  # a layer left in fp32 inside an offloaded bf16 component
    pipe.extra = nn.Linear(8, 8).to(BF16)  # a component nobody offloads, left on the cpu
    report = torchdoctor.scan(pipe, device=GPU)
    assert paths(report) == ["extra.bias", "extra.weight", "unet.2.bias", "unet.2.weight"]
    kinds = {p.path: p.kind for p in report.problems}
    assert kinds["unet.2.weight"] == "dtype" and kinds["extra.weight"] == "device"
    # the one move proposed is of the component nobody offloads; the offloaded one is never moved by a fix
    assert [r.fix("pipe") for r in report.relocations()[1]] == ["pipe.extra.to('cuda:0')"]
    assert "unet.to(" not in report.text()


def test_a_hook_without_an_execution_device_moves_nothing() -> None:
    class Timer(accelerate.hooks.ModelHook):
        def pre_forward(self, module: nn.Module, *args, **kwargs):  # type: ignore[no-untyped-def]
            return args, kwargs

    pipe = Pipe()
    accelerate.hooks.add_hook_to_module(pipe.unet, Timer())
    assert {"unet.0.weight", "unet.2.weight"} <= set(paths(torchdoctor.scan(pipe, device=GPU)))


# --- layers that keep weights in RAM and cast them per call through helpers (InvokeAI autocast layers) --------------


def move_to(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """Our cast helper (not a method of the layer): what InvokeAI's ``cast_to_device`` does."""
    return None if t is None else t.to(device)


class Autocasting:
    def init_autocast(self) -> None:
        self._autocast_on = False
        self._pending: list[float] = []


class AutocastLinear(nn.Linear, Autocasting):
    def _bring(self, t: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
        t = move_to(t, x.device)
        return t.to(dtype=x.dtype) if t is not None and t.dtype != x.dtype else t

    def _weight_bias_for(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self._bring(self.weight, x), self._bring(self.bias, x)

    def _cast_forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self._weight_bias_for(x)
        assert w is not None
        return F.linear(x, w, b) * (1.0 + sum(self._pending))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self._pending) > 0:
            return self._cast_forward(x)
        elif self._autocast_on:
            return self._cast_forward(x)
        elif x.is_floating_point() and self.weight.dtype != x.dtype:
            w, b = self._weight_bias_for(x)
            assert w is not None
            return F.linear(x, w, b)
        return super().forward(x)


def _autocast_model() -> nn.Sequential:
    m = nn.Sequential(*[AutocastLinear(8, 8) for _ in range(3)], nn.LayerNorm(8)).to(BF16)
    for layer in m[:3]:
        layer.init_autocast()
    return m


def test_autocasting_layers_kept_in_ram_are_quiet_and_switched_off_are_named() -> None:
    m = _autocast_model()
    m[3].to("meta")  # stands in for the accelerator: the part loaded there
    for i in (0, 1):  # partially loaded: these stay in RAM, cast per call
        m[i]._autocast_on = True
    m[2]._pending = [0.5]  # a patch waiting: cast per call too
    assert paths(torchdoctor.scan(m, device="meta")) == []
    assert percall.moved_on_call(m[0]) == {"weight": 3, "bias": 3}
    m[1]._autocast_on = False  # now nothing moves it: a leftover in RAM
    report = torchdoctor.scan(m, device="meta")
    assert paths(report) == ["1.bias", "1.weight"] and {p.kind for p in report.problems} == {"device"}


def test_a_layer_that_casts_when_the_dtype_differs_keeps_its_device_judged() -> None:
    m = _autocast_model()
    m[1].to(F16)  # autocasting off, fp16 weights in a bf16 model: the forward casts them to the input's dtype
    assert m(torch.ones(1, 8, dtype=BF16)).dtype == BF16
    assert paths(torchdoctor.scan(m)) == [] and paths(torchdoctor.scan(m, dtype=BF16)) == []
    assert percall.moved_on_call(m[1]) == {"weight": percall.DTYPE, "bias": percall.DTYPE}
    m.to("meta")
    m[1].to_empty(device="cpu")  # but the device: only the dtype branch casts, and only the dtype changes it
    assert paths(torchdoctor.scan(m, device="meta")) == ["1.bias", "1.weight"]


# --- Forge-style operations: a flag, and a module-level helper handed the layer -------------------------------------


def pull_weights(layer: nn.Module, **where: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight, bias = layer.weight, layer.bias
    if where:
        weight = weight.to(**where)
        bias = bias.to(**where) if bias is not None else None
    return weight, bias


def manual_cast(layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    return pull_weights(layer, device=x.device, dtype=x.dtype)


class ForgeStyleLinear(nn.Linear):
    manual = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.manual:
            w, b = manual_cast(self, x)
            return F.linear(x, w, b)
        else:
            w, b = pull_weights(self)  # the same helper without a cast: the plain path
            return F.linear(x, w, b)


def test_forge_style_manual_cast_is_quiet_and_the_plain_path_is_judged() -> None:
    m = nn.Sequential(*[ForgeStyleLinear(8, 8) for _ in range(3)]).to(BF16)
    m[0].to(F16)
    m[0].manual = True
    assert m(torch.ones(1, 8, dtype=BF16)).dtype == BF16
    assert paths(torchdoctor.scan(m)) == []
    m[0].manual = False  # the plain path uses the fp16 weights as they are
    assert paths(torchdoctor.scan(m)) == ["0.bias", "0.weight"]
    with pytest.raises(RuntimeError):
        m(torch.ones(1, 8, dtype=BF16))


# --- a module that moves its own buffer on every call (transformers 5 rotary embeddings) ----------------------------


def _tiny_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1,
                      intermediate_size=64, vocab_size=50)
    torch.set_default_dtype(BF16)  # built in bf16 as from_pretrained(dtype=) builds it: the rotary keeps float32
    try:
        return LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(torch.float32)


def test_rotary_buffers_moved_per_call_are_quiet_and_a_plain_buffer_is_not() -> None:
    model = _tiny_llama()
    rope = model.model.rotary_emb
    assert set(rope._buffers) >= {"inv_freq", "original_inv_freq"}
    # the forward moves inv_freq to the input's device and dtype; the dynamic-rope decorator moves
    # original_inv_freq to the device before it reads it (the default rope never reads it)
    assert percall.moved_on_call(rope) == {"inv_freq": percall.DEVICE | percall.DTYPE,
                                           "original_inv_freq": percall.DEVICE}
    with torchdoctor.virtual_devices("cuda:0"):
        model.to("cuda:0")
        rope.to("cpu")  # left on the cpu: runs on a real GPU
        report = torchdoctor.scan(model)
        assert paths(report) == [], report.problems
        assert paths(torchdoctor.scan(model, device="cuda:0")) == []
        model.model.norm.register_buffer("gain", torch.ones(32))  # a buffer the forward never moves, on cpu
        assert paths(torchdoctor.scan(model, device="cuda:0")) == ["model.norm.gain"]
        model.model.norm.to("cuda:0")
        model.model.layers[0].input_layernorm.to("cpu")  # a norm's forward casts its input, never its weight
        assert paths(torchdoctor.scan(model)) == ["model.layers.0.input_layernorm.weight"]
    assert apps.intended_at(rope, "inv_freq", rope.inv_freq, "buffer") == ("casts-per-call", 3)
    assert apps.intended_at(rope, "original_inv_freq", rope.original_inv_freq, "buffer") == ("moved-per-call", 1)
    assert apps.intended_at(model.model.norm, "weight", model.model.norm.weight, "parameter") is None


def test_a_buffer_moved_per_call_keeps_its_dtype_judged() -> None:
    class Table(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("freqs", torch.ones(4))
            self.proj = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x * self.freqs.to(x.device))

    m = Table().to(BF16)
    assert paths(torchdoctor.scan(m, device="meta")) == ["proj.bias", "proj.weight"]  # freqs: moved per call
    m.freqs = m.freqs.to(F16)  # the per-call move never casts it: fp16 meets bf16
    assert paths(torchdoctor.scan(m)) == ["freqs"]


# --- weight backups wherever kept (SD.Next network_weights_backup, sdnq_*_backup, a dict of them) -------------------


def test_backups_kept_beside_a_layer_or_in_a_dict_are_quiet() -> None:
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)).to(BF16)
    m[0].register_buffer("scale", torch.ones(8, dtype=BF16))
    m[0].network_weights_backup = m[0].weight.detach().float().clone()  # fp32, on the cpu
    m[0].sdnq_scale_backup = m[0].scale.detach().float().clone()  # shaped like a buffer
    m[1].lora_backup = {"weight": m[1].weight.detach().float().clone()}  # held in a container
    m.to("meta")
    assert paths(torchdoctor.scan(m, device="meta")) == []
    assert paths(torchdoctor.scan(m, dtype=BF16, device="meta")) == []
    m[1].lora_delta = torch.zeros(8, 8)  # not a backup name: judged against its module
    assert set(paths(torchdoctor.scan(m, device="meta"))) == {"1.lora_delta"}
    assert apps.intended_at(m[0], "network_weights_backup", m[0].network_weights_backup, "attribute")[0] == \
        "backup-copy"


# --- a copy into a tensor made where the call computes (ComfyUI's cast_to: empty_like on the device, then copy_) ----


class CopiedPerCall(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.empty_like(self.weight, dtype=x.dtype, device=x.device)
        w.copy_(self.weight)  # the stored weight is only the source: it may rest anywhere
        return F.linear(x, w, self.bias)


class CopiesIntoItself(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.weight.data.copy_(self.weight.data.clamp(-1, 1))  # the weight receives the copy: computed with as is
        return F.linear(x, self.weight, self.bias)


def test_a_weight_copied_into_a_tensor_on_the_input_device_is_quiet_and_its_bias_still_judged() -> None:
    assert percall.moved_on_call(CopiedPerCall(8, 8)) == {"weight": percall.DEVICE | percall.DTYPE}
    assert percall.moved_on_call(CopiesIntoItself(8, 8)) == {}
    m = nn.Sequential(CopiedPerCall(8, 8), CopiesIntoItself(8, 8)).to("meta")
    m[0].to_empty(device="cpu")
    m[0].bias = nn.Parameter(torch.zeros(8, device="meta"))
    m[1].to_empty(device="cpu")
    assert paths(torchdoctor.scan(m, device="meta")) == ["1.bias", "1.weight"]


def test_per_call_moves_are_read_from_the_code_never_from_a_rotary_name() -> None:
    class LlamaRotaryEmbedding(nn.Module):  # the name of transformers' class, a forward that never moves inv_freq
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("inv_freq", torch.ones(4), persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.inv_freq

    class Freqs(nn.Module):  # no rotary in its name, a forward that moves its buffer to the input's device
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.ones(4), persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.table.to(x.device)

    m = nn.Sequential(nn.Linear(4, 4), LlamaRotaryEmbedding(), Freqs())
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m[0].to("cuda:0")
        assert paths(torchdoctor.scan(m, device="cuda:0")) == ["1.inv_freq"]
        m(torch.ones(1, 4, device="cuda:0"))  # inv_freq on the cpu meets a cuda input
    assert [p.path for p in sim.problems if p.kind == "device"] == ["1.inv_freq"], sim.problems
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        m.to("cuda:0")
        m[2].to("cpu")  # table moved per call: runs
        assert torchdoctor.scan(m).ok
        m(torch.ones(1, 4, device="cuda:0"))
    assert sim.problems == []

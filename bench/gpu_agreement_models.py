"""The agreement zoo, part 2: transformers and peft models from tiny configs, training steps, accelerate's
offload hooks, kernels that compare dtypes in Python, and models sized against the card.

Models are built from configs (nothing downloaded); each builder imports its library when the case is made, so
the zoo's plain cases need neither transformers nor peft.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpu_agreement_cases import case, forward, seeded

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")

VOCAB = 128
GIB = 1024 ** 3


def llama(dtype: torch.dtype = torch.float32) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model: nn.Module = LlamaForCausalLM(cfg)
    return model.to(dtype).eval()


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                          bos_token_id=1, eos_token_id=2)).eval()


def lora(dtype: torch.dtype, bias: bool = False) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    base = llama(dtype)
    torch.manual_seed(1)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_bias=bias)
    return get_peft_model(base, cfg).eval()  # peft keeps the adapters fp32 over a bf16 base (autocast_adapter_dtype)


def lm_step(ids_on_device: bool = True) -> Callable[[Any, str], Any]:
    def step(model: Any, device: str) -> Any:
        model.to(device)
        ids = torch.arange(8).remainder(VOCAB).view(1, 8)
        with torch.no_grad():
            return model(input_ids=ids.to(device) if ids_on_device else ids).logits
    return step


@case("llama_fp32", "control: a transformers Llama from a config, moved whole", "runs")
def _llama() -> tuple[Any, Any]:
    return llama, lm_step()


@case("llama_bf16", "control: the Llama cast to bf16 (rotary inv_freq kept fp32, moved per call)", "runs")
def _llama_bf16() -> tuple[Any, Any]:
    return lambda: llama(torch.bfloat16), lm_step()


@case("llama_ids_on_cpu", "input_ids left on the CPU (the tokenizer's output never moved)", "raises",
      kind="device")
def _ids() -> tuple[Any, Any]:
    return llama, lm_step(ids_on_device=False)


def bf16_fp32_head() -> nn.Module:
    model = llama(torch.bfloat16)
    model.lm_head.float()  # an output head reloaded in fp32
    return model


@case("llama_fp32_head", "an fp32 lm_head in a bf16 Llama", "raises", kind="dtype", culprit="lm_head.weight")
def _head() -> tuple[Any, Any]:
    return bf16_fp32_head, lm_step()


@case("gpt2_tied", "control: GPT-2 with its tied lm_head and Conv1D layers", "runs")
def _gpt2() -> tuple[Any, Any]:
    return gpt2, lm_step()


@case("lora_fp32_adapters", "control: peft LoRA, fp32 adapters over a bf16 Llama (peft casts per call)", "runs")
def _lora() -> tuple[Any, Any]:
    return lambda: lora(torch.bfloat16), lm_step()


LORA_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default"


def lora_bias_restored(model: Any, device: str) -> Any:
    model.to(device)
    layer = model.get_submodule(LORA_B)
    saved = layer.bias.detach().cpu().clone()  # what a checkpoint on disk gives back
    layer.bias = nn.Parameter(saved)  # restored as a new Parameter: on the CPU
    ids = torch.arange(8).view(1, 8).to(device)
    with torch.no_grad():
        return model(input_ids=ids).logits


@case("lora_bias_restored_cpu", "a LoRA bias restored on the CPU after the move", "raises", kind="device",
      culprit=LORA_B + ".bias", quick=True)
def _lora_bias() -> tuple[Any, Any]:
    return lambda: lora(torch.float32, bias=True), lora_bias_restored


def offloaded(model: Any, device: str) -> Any:
    from accelerate import cpu_offload

    if not hasattr(model, "_hf_hook"):  # once: a second cpu_offload would offload the meta copies the first left
        cpu_offload(model, execution_device=torch.device(device))  # weights stay on the CPU, moved in per call
    ids = torch.arange(8).view(1, 8).to(device)
    with torch.no_grad():
        return model(input_ids=ids).logits


@case("offload_hooks", "control: accelerate cpu_offload (weights on the CPU, moved in by hooks)", "runs",
      quick=True)
def _offload() -> tuple[Any, Any]:
    return llama, offloaded


class Trainer(nn.Module):
    """A model and its optimizer in one object, so every tool reads both."""

    def __init__(self, warm_on_cpu: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-3)
        if warm_on_cpu:  # a step taken before the move: Adam's state is made on the CPU
            self.net(torch.randn(4, 8)).sum().backward()
            self.opt.step()
            self.opt.zero_grad()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def train(how: str) -> Callable[[Any, str], Any]:
    def step(obj: Any, device: str) -> Any:
        obj.to(device)  # moves the parameters; the optimizer's state stays where it was made
        x = torch.randn(4, 8, device=device)
        target = torch.tensor([0, 1, 2, 3])
        target = target if how == "target_cpu" else target.to(device)
        loss = F.cross_entropy(obj(x), target)
        loss.backward()
        if how == "grad_cpu":  # a gradient accumulated elsewhere, put back on the CPU
            p = obj.net[0].weight
            p.grad = p.grad.detach().cpu()
        obj.opt.step()
        obj.opt.zero_grad()
        return loss.detach()
    return step


@case("train_correct", "control: a training step (forward, backward, Adam) on the device", "runs")
def _train() -> tuple[Any, Any]:
    return seeded(lambda: Trainer(False)), train("ok")


@case("train_adam_state_cpu", "a training step whose Adam state was made on the CPU before the move", "raises",
      kind="device")
def _adam() -> tuple[Any, Any]:
    return seeded(lambda: Trainer(True)), train("ok")


@case("train_grad_on_cpu", "a training step with a gradient on the wrong device", "raises", kind="device",
      culprit="net.0.weight.grad")
def _grad() -> tuple[Any, Any]:
    return seeded(lambda: Trainer(False)), train("grad_cpu")


@case("train_target_cpu", "a training step whose labels stayed on the CPU", "raises", kind="device", quick=True)
def _target() -> tuple[Any, Any]:
    return seeded(lambda: Trainer(False)), train("target_cpu")


class ConvBias(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def conv_fp32_bias() -> nn.Module:
    torch.manual_seed(0)
    m = ConvBias().to(torch.bfloat16)
    bias = m.conv.bias
    assert bias is not None
    bias.data = bias.data.float()  # a bias loaded in fp32 after the cast
    return m


def image_step(model: Any, device: str) -> Any:
    model.to(device)
    with torch.no_grad():
        return model(torch.randn(1, 3, 8, 8, device=device, dtype=torch.bfloat16))


@case("conv_fp32_bias", "an fp32 conv bias in a bf16 Conv2d", "raises", kind="dtype", culprit="conv.bias")
def _conv() -> tuple[Any, Any]:
    return conv_fp32_bias, image_step


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 8, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def lstm_step(model: Any, device: str) -> Any:
    model.to(device)
    with torch.no_grad():
        return model(torch.randn(1, 4, 8, device=device, dtype=torch.float64))  # fp64 features into an fp32 LSTM


@case("lstm_fp64_input", "fp64 features into an fp32 LSTM (checked in Python before any kernel)", "raises",
      kind="dtype")
def _lstm() -> tuple[Any, Any]:
    return seeded(Recurrent), lstm_step


def autocast_step(model: Any, device: str) -> Any:
    model.to(device)
    x = torch.randn(2, 8, device=device)
    with torch.no_grad(), torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        return model(x)


@case("autocast_bf16", "control: an fp32 model under autocast to bf16 (per-call casting by torch)", "runs")
def _autocast() -> tuple[Any, Any]:
    from gpu_agreement_cases import ModuleListHeld

    return seeded(ModuleListHeld), autocast_step


def on_meta(gib: float) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        rows = int(gib * GIB) // (2 * 16384)
        with torch.device("meta"):
            return nn.Sequential(nn.Linear(16384, rows, bias=False, dtype=torch.bfloat16))
    return make


def materialise(model: Any, device: str) -> Any:
    model.to_empty(device=device)  # what loading weights onto the card allocates
    with torch.no_grad():
        return model(torch.zeros(1, 16384, device=device, dtype=torch.bfloat16))


NOT_ON_HOST = "would allocate the model's size in this machine's memory; the hardware's answer is the GPU's"


@case("too_big_for_card", "a model too big for the card (200 GiB of bf16 weights on a 141 GB H200)", "raises",
      kind="memory", cpu_real=NOT_ON_HOST, data="meta")
def _big() -> tuple[Any, Any]:
    return on_meta(200), materialise


@case("fits_the_card", "control: the same layer at 2 GiB", "runs", cpu_real=NOT_ON_HOST, data="meta")
def _fits() -> tuple[Any, Any]:
    return on_meta(2), materialise


@case("plain_mlp_fp32_input", "fp32 features into a bf16 model (the input never cast)", "raises", kind="dtype")
def _mlp_input() -> tuple[Any, Any]:
    from gpu_agreement_cases import ModuleListHeld

    def make() -> nn.Module:
        torch.manual_seed(0)
        return ModuleListHeld().to(torch.bfloat16)
    return make, forward()

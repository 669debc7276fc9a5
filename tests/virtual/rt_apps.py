"""Training loops as three kinds of program write them, shared by the tests that run them under
``virtual_devices``, ``torchdoctor run --device`` and ``@pytest.mark.simulate``.

Each loop puts its work on the bare ``"cuda"`` a program uses (the current device) and returns what it trained, so
a test can say where the work went and that it changed something.
"""

from __future__ import annotations

import tempfile
from typing import Any

import peft
import torch
from torch import nn

from tests.support import zoo


def lora_llama_steps(steps: int = 3) -> nn.Module:
    """A peft LoRA model from a tiny config, a few AdamW steps; returns a trained lora_B layer."""
    torch.manual_seed(0)
    model = peft.get_peft_model(zoo.tiny_llama(), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    model.to("cuda")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(3, 100, (2, 8), device="cuda")
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return model.base_model.model.model.layers[0].self_attn.q_proj.lora_B.default


class LoRAModule(nn.Module):
    """The sd-scripts mechanism in a few lines: the module takes over its base Linear's forward and adds its own
    low-rank path; its weights live in the network, so ``model.to`` never reaches them."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.lora_down = nn.Linear(base.in_features, rank, bias=False)
        self.lora_up = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.lora_up.weight)
        self.base_forward = base.forward

    def apply_to(self, base: nn.Linear) -> None:
        base.forward = self.forward  # what the network's apply_to does for every targeted layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_forward(x) + self.lora_up(self.lora_down(x)) * 0.5


class LoRANetwork(nn.Module):
    """A network held apart from the model it patches (``network.apply_to(unet)``, then ``network.to(device)``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        targets = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.loras = nn.ModuleList(LoRAModule(t) for t in targets)
        for lora, t in zip(self.loras, targets):
            lora.apply_to(t)


def base_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 4))


def sd_network_steps(steps: int = 3, move_network: bool = True) -> LoRANetwork:
    """An sd-scripts-style LoRA training loop (frozen base model, the network trained); ``move_network=False``
    plants the forgotten ``network.to(device)``."""
    torch.manual_seed(0)
    model = base_model().requires_grad_(False)
    network = LoRANetwork(model)
    model.to("cuda")
    if move_network:
        network.to("cuda")
    opt = torch.optim.AdamW(network.parameters(), lr=1e-2)
    x, y = torch.randn(6, 8, device="cuda"), torch.randn(6, 4, device="cuda")
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return network


class _Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = (torch.arange(8) * 7 + i) % 90 + 3
        return {"input_ids": ids, "labels": ids}


def trainer_steps(steps: int = 3) -> tuple[Any, nn.Module]:
    """A real ``transformers.Trainer`` loop on a tiny Llama (nothing saved, no reporting); returns its result and
    the model."""
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = zoo.tiny_llama()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=2, report_to=[],
                                 save_strategy="no", logging_strategy="no", disable_tqdm=True)
        result = Trainer(model=model, args=args, train_dataset=_Tokens()).train()
    return result, model

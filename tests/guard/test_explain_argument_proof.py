"""explain: a fix that hands the model's caller argument over in the model's dtype (``# pass x as ...``) is proven
(the failing module re-run on its inputs with the argument cast, or the whole forward on a copy) or labelled
unproven with what was tried; never printed bare (a nested image argument into a bf16 patch embedding:
transformers PR #48632)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


class _Patch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, 8, 4, stride=4)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.proj(pixel_values).flatten(2).transpose(1, 2)


class _OCR(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch_embed, self.embed, self.lm = _Patch(), nn.Embedding(32, 8), nn.Linear(8, 32)

    def forward(self, input_ids: torch.Tensor, images: dict) -> torch.Tensor:
        return self.lm(torch.cat([self.patch_embed(images["pixel_values"][0]), self.embed(input_ids)], dim=1))


def _explain(model: nn.Module, *args: object) -> torchdoctor.PlacementError:
    with pytest.raises(torchdoctor.PlacementError) as info, torch.no_grad(), torchdoctor.guard(model):
        model(*args)
    return info.value


def test_nested_image_argument_fix_is_proven_on_the_failing_module():
    model = _OCR().to(torch.bfloat16).eval()
    pixels = torch.rand(1, 3, 16, 16)
    err = _explain(model, torch.randint(0, 32, (1, 5)), {"pixel_values": [pixels]})
    assert err.fix == "# pass images['pixel_values'][0] as tensor.to(torch.bfloat16)"
    assert err.to_dict()["proof"] == ("fix proven: Conv2d runs on the inputs it failed on with "
                                      "images['pixel_values'][0] -> bfloat16")
    assert "fix proven: Conv2d" in str(err) and pixels.dtype == torch.float32  # the program's tensor untouched
    assert model.patch_embed.proj.weight.dtype == torch.bfloat16


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, extra: dict) -> torch.Tensor:
        return self.lin(x * 2) + extra["b"][0]


def test_argument_reaching_the_module_through_other_values_is_proven_by_the_whole_forward():
    model = _Scaled().to(torch.bfloat16)
    err = _explain(model, torch.rand(2, 4), {"b": [torch.zeros(4, dtype=torch.bfloat16)]})
    assert err.fix == "# pass x as tensor.to(torch.bfloat16)"
    assert err.to_dict()["proof"] == "fix proven: the whole forward runs again on a copy of the model with x -> bfloat16"


def test_a_fix_that_cannot_be_re_run_alone_is_labelled_unproven():
    # the argument is nested (the whole forward's re-run casts top-level inputs only) and the failing Linear is
    # handed a value computed from it: neither re-run applies the fix alone
    err = _explain(_Nested().to(torch.bfloat16), {"x": torch.rand(2, 4)})
    assert err.fix == "# pass batch['x'] as tensor.to(torch.bfloat16)"
    assert err.to_dict()["proof"] == ("fix unproven: batch['x'] reaches Linear through other values (it is not one "
                                      "of its inputs), so the cast alone was not re-run")


class _Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.lin(batch["x"] * 2)

"""A block (``virtual_devices``, ``run``, the marker) proves a fix at the failing op only where nothing between the
fixed tensor and that op can undo it (hunt s15 V4, V5). Two ways it was claimed wrongly:

- a run keeps a bounded chain of how each tensor was made; past its last link every result shared its parent's
  record, so a ``.float()`` met deep in a forward (Gemma3's projector with a forced-float32 norm: ``out =
  self._norm(x.float()) * (1.0 + self.weight.float())``, unsloth-zoo#706) looked as if it were the failing op's own
  operand, and ``x.to(torch.float16)`` was "fix proven" although the float32 weight promotes it again;
- a model tensor an op combined with an unnamed activation of its dtype (a float32 image encoder's projection weight
  times its float32 hidden states, ComfyUI#6907) was fixed by casting that weight alone, "proven" at the float16
  projection it fed, while the encoder's own matmul would then mix float32 and float16.
"""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor
from torchdoctor._virtual.origin import DEPTH


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-6)
        return out * (1.0 + self.weight.float())


class Projector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.w = Norm(), nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(DEPTH):  # a deep forward before the cast: longer than the chain a run keeps
            x = x * 1.0 + 0.0
        return torch.matmul(self.norm(x), self.w)


def _projector_app(m: Projector) -> torch.Tensor:
    m.to("cuda:0", torch.float16)
    m.norm.float()  # the app's forced-float32 norm
    with torch.no_grad():
        return m(torch.randn(2, 8, device="cuda:0", dtype=torch.float16))


def test_a_cast_deep_in_a_forward_is_never_proven_at_an_op_it_reaches_through_others() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False, select=False) as block:
        _projector_app(Projector())
    text = str(block.error())
    assert "a tensor made by aten.mul in `norm` from a tensor made by `float()` at " in text, text
    assert "test_proof_far_chains.py:28 in `norm`" in text, text
    [fix] = block.fixes
    assert "`out = x.float()` casts to float32 where aten.mm.default computes in float16" in fix.code
    assert not fix.proven and "only a re-run of the whole program proves it" in fix.tried, fix
    assert "# fix proven" not in text
    # the re-run the API can make finds the float32 weight still promoting: never "proven"
    api = torchdoctor.simulate(Projector(), device="cuda:0", call=_projector_app)
    assert not api.ok and not any(f["proven"] for f in api.to_dict()["fixes"]), api.text()


def test_a_chain_shorter_than_the_kept_links_still_proves_a_cast_that_is_the_operand() -> None:
    class Direct(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.matmul(x.float(), self.w)

    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False, select=False) as block:
        m = Direct().to("cuda:0", torch.float16)
        with torch.no_grad():
            m(torch.randn(2, 8, device="cuda:0", dtype=torch.float16))
    [fix] = block.fixes
    assert fix.proven and fix.tried.startswith("at the failing op aten.mm.default"), fix


def test_a_weight_combined_with_an_activation_is_not_proven_by_casting_it_alone() -> None:
    from diffusers.models.embeddings import IPAdapterFullImageProjection
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.image_encoder = CLIPVisionModelWithProjection(CLIPVisionConfig(
                hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                patch_size=8, projection_dim=16))
            self.image_proj = IPAdapterFullImageProjection(image_embed_dim=16, cross_attention_dim=16)

    torch.manual_seed(0)
    with torchdoctor.virtual_devices("cuda:0", dtype=torch.float16, raise_on_exit=False, select=False) as block:
        m = Stack().eval().to("cuda:0", torch.float16)
        m.image_encoder.to(torch.float32)  # kept float32 on purpose, its output fed to a float16 projection
        with torch.no_grad():
            m.image_proj(m.image_encoder(pixel_values=torch.rand(1, 3, 32, 32, device="cuda:0")).image_embeds)
    assert block.problems, "the float32 embeds reaching the float16 projection are a problem"
    text = str(block.error())
    weight_only = [f for f in block.fixes if f.code.startswith("model.image_encoder.visual_projection.weight.data")]
    assert all(not f.proven for f in weight_only), text
    assert "fix proven (at the failing op" not in text or not weight_only, text

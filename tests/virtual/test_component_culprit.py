"""In a pipeline the culprit is the component whose dtype differs from its neighbours, and the fix casts that
component (issue 41 point 5, hunt S12): an fp32 ControlNet beside a bf16 UNet gets `model.controlnet.to(bf16)` from
simulate and from a virtual run (the pytest marker's side), proven at the failing ops; never a model-wide cast."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor

BF16 = torch.bfloat16
WHOLE = "model.controlnet.to(torch.bfloat16)  # every floating tensor of controlnet is float32 while the rest of " \
    "the model is bfloat16: cast that component (or load it with torch_dtype=torch.bfloat16)"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.blocks = nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.inp(x))


class Pipe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.unet, self.controlnet = Net(), Net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.unet(x + self.controlnet(x))


def app(m: nn.Module) -> torch.Tensor:
    m.unet.to("cuda:0", BF16)
    m.controlnet.to("cuda:0")  # loaded without torch_dtype
    return m(torch.randn(2, 8, device="cuda:0", dtype=BF16))


def test_simulate_casts_the_component_in_another_dtype_not_the_model() -> None:
    report = torchdoctor.simulate(Pipe(), device="cuda:0", dtype=BF16, call=app)
    assert {p.path.split(".")[0] for p in report.problems if p.role == "parameter"} == {"controlnet"}
    (fix,) = [f for f in report.fixes if f.kind == "path"]
    assert fix.code == WHOLE and fix.proven, (fix.code, fix.tried)
    assert "torchdoctor.move(model" not in report.text() and "model.to(" not in report.text()


def test_a_component_in_the_dtype_of_its_neighbours_is_not_named_whole() -> None:
    m = Pipe()
    m.controlnet.inp.to(BF16)  # half of it cast: the two other layers are the culprits, by path

    def half(p: nn.Module) -> torch.Tensor:
        p.unet.to("cuda:0", BF16)
        p.controlnet.to("cuda:0")
        return p(torch.randn(2, 8, device="cuda:0", dtype=BF16))

    report = torchdoctor.simulate(m, device="cuda:0", dtype=BF16, call=half)
    codes = "\n".join(f.code for f in report.fixes)
    assert "model.controlnet.to(" not in codes and "model.controlnet.blocks" in codes, codes


def test_real_diffusers_controlnet_in_fp32_beside_a_bf16_unet_under_a_virtual_run() -> None:
    from diffusers import ControlNetModel, UNet2DConditionModel

    cfg = dict(block_out_channels=(8, 16), layers_per_block=1, cross_attention_dim=8, attention_head_dim=2,
               down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), norm_num_groups=4, in_channels=4)
    torch.manual_seed(0)
    pipe = nn.Module()
    pipe.unet = UNet2DConditionModel(**cfg, out_channels=4, up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                                     sample_size=8)
    pipe.controlnet = ControlNetModel(**cfg, conditioning_embedding_out_channels=(4, 8))
    with torchdoctor.virtual_devices("cuda:0", BF16, raise_on_exit=False) as sim:
        pipe.unet.to("cuda:0", BF16)
        pipe.controlnet.to("cuda:0")
        x, t = torch.randn(1, 4, 8, 8, device="cuda:0", dtype=BF16), torch.tensor([10], device="cuda:0")
        ehs = torch.randn(1, 3, 8, device="cuda:0", dtype=BF16)
        down, mid = pipe.controlnet(x, t, encoder_hidden_states=ehs, return_dict=False,
                                    controlnet_cond=torch.randn(1, 3, 16, 16, device="cuda:0", dtype=BF16))
        pipe.unet(x, t, encoder_hidden_states=ehs, down_block_additional_residuals=down,
                  mid_block_additional_residual=mid)
    assert sim.problems and all(p.path.startswith("controlnet") for p in sim.problems if p.role == "parameter")
    fix = str(sim.error()).split("Fix:", 1)[1]
    # the block's fix names the object as the program holds it: `pipe`, never a `model` the program does not have
    assert "pipe." + WHOLE.removeprefix("model.") in fix and "# fix proven (at the failing op" in fix, fix
    assert "torchdoctor.move(" not in fix and "model.controlnet" not in fix, fix

"""simulate's run costs one Python hop per torch call (issue 43 point 1): the cast-naming of ``makers`` runs inside the
run's one function mode instead of a second mode stacked on it, attribute reads and metadata queries are answered
without the mode's work, and diffusers' empty "kept in float32: []" warning is not printed per simulate."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdoctor


class Probe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.depth: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.depth.append(torch._C._len_torch_function_stack())
        return self.lin(x.to(torch.bfloat16))  # a cast in forward: still named at its line by the one mode


def test_a_forward_runs_under_one_function_mode_and_casts_are_still_named() -> None:
    model = Probe()
    report = torchdoctor.simulate(model, (torch.randn(2, 4),), device="cuda:0")
    assert model.depth == []  # the user's model never ran: simulate works on a copy
    copies: list[int] = []
    orig = Probe.forward

    def spy(self: Probe, x: torch.Tensor) -> torch.Tensor:
        copies.append(torch._C._len_torch_function_stack())
        return orig(self, x)

    Probe.forward = spy  # type: ignore[method-assign]
    try:
        report = torchdoctor.simulate(model, (torch.randn(2, 4),), device="cuda:0")
    finally:
        Probe.forward = orig  # type: ignore[method-assign]
    assert copies and set(copies) == {1}  # the run, and the re-run that proves its fix: one mode each
    assert "a tensor made by `to(torch.bfloat16)` at tests/virtual/test_speed_one_mode.py:" in report.problems[0].message


def test_attribute_reads_and_queries_answer_as_torch_does_on_a_twin() -> None:
    seen: dict[str, object] = {}

    def call(m: nn.Module) -> None:
        m.to("cuda:1")
        w = m.weight
        seen.update(device=w.device, shape=tuple(w.shape), dtype=w.dtype, fp=w.is_floating_point(), size=tuple(w.size()),
                    stride=w.stride(), dim=w.dim(), numel=w.numel(), grad=w.requires_grad, is_cuda=w.is_cuda)

    assert torchdoctor.simulate(nn.Linear(3, 2), device="cuda:1", call=call).ok
    assert seen == {"device": torch.device("cuda:1"), "shape": (2, 3), "dtype": torch.float32, "fp": True,
                    "size": (2, 3), "stride": (3, 1), "dim": 2, "numel": 6, "grad": True, "is_cuda": True}


def test_diffusers_empty_fp32_list_warning_is_not_printed_by_simulate() -> None:
    import logging

    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8)
    inputs = {"sample": torch.randn(1, 4, 8, 8), "timestep": torch.tensor([1]),
              "encoder_hidden_states": torch.randn(1, 4, 32)}
    from diffusers.utils import logging as dlogging

    # diffusers' line is read at its own logger, not at stderr: an earlier test may have quieted diffusers, disabled
    # its loggers (logging.config.dictConfig) or left its handler writing to a stream pytest has since closed
    logger = logging.getLogger("diffusers.models.modeling_utils")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    root = logging.getLogger("diffusers")  # its level as set (NOTSET included), not get_verbosity's effective one
    before, disabled, keep = root.level, logger.disabled, Keep()
    dlogging.set_verbosity_warning()
    logger.disabled = False
    logger.addHandler(keep)
    try:
        assert torchdoctor.simulate(unet, inputs, device="cuda:0", dtype="bfloat16").ok
        assert not [m for m in seen if "kept in float32" in m]
        unet.to(torch.bfloat16)  # the library's own line is untouched outside simulate
        assert [m for m in seen if "should be kept in float32: []" in m]
    finally:
        logger.removeHandler(keep)
        logger.disabled = disabled
        root.setLevel(before)

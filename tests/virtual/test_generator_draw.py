"""A generator made on the GPU drawing a tensor with no ``device=`` draws on the CPU, which the real machine refuses
("Cannot generate a cpu tensor from a generator of type cuda", ComfyUI-MVAdapter#55): a device problem at that
line, its fix the factory's ``device=``; a CPU generator drawing on the CPU is quiet."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def prepare_latents(generator: torch.Generator) -> torch.Tensor:
    return torch.randn((1, 4), generator=generator)


def app(m: nn.Module, where: str = "cuda:0") -> torch.Tensor:
    m.to("cuda:0")
    generator = torch.Generator(device=where).manual_seed(0)
    return m(prepare_latents(generator).to("cuda:0"))


def test_a_gpu_generator_drawing_on_the_cpu_is_named_at_its_line() -> None:
    report = torchdoctor.simulate(nn.Linear(4, 4), device="cuda:0", call=app)
    assert len(report.problems) == 1
    p = report.problems[0]
    line = prepare_latents.__code__.co_firstlineno + 1
    assert p.kind == "device" and p.found == "cpu" and p.expected == "cuda:0"
    assert f"torch.randn(device='cpu') at tests/virtual/test_generator_draw.py:{line} draws from a generator on cuda:0" \
        in p.message or f"test_generator_draw.py:{line} draws from a generator on cuda:0" in p.message
    assert "Cannot generate a cpu tensor from a generator of type cuda" in p.message
    assert "device=generator.device" in str(report)  # the factory's device=, the generator's as the program names it


def test_a_cpu_generator_drawing_on_the_cpu_is_quiet() -> None:
    assert torchdoctor.simulate(nn.Linear(4, 4), device="cuda:0", call=lambda m: app(m, "cpu")).ok

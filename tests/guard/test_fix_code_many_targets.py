"""Many culprits asking for two dtypes (a VAE's decoder blamed for float32 and the rest for bfloat16) are never one
``torchdoctor.move`` naming ``dtype=`` twice (a SyntaxError printed as a fix): one move per target, at the deepest
module holding all of that target's tensors; one device and one dtype at most stay one move of the model."""

from __future__ import annotations

import ast

import torch

from torchdoctor._guard.maps import fix_code


def _culprits(paths: list[str], target: object) -> list[tuple[str, str, str, object]]:
    return [(p, p, "dtype" if isinstance(target, torch.dtype) else "device", target) for p in paths]


def test_two_dtypes_are_two_moves_each_at_its_module() -> None:
    dec = [f"decoder.up.{i}.conv.weight" for i in range(3)] + ["decoder.mid.norm.weight", "decoder.mid.norm.bias"]
    rest = [f"post_quant_conv.{n}" for n in ("weight", "bias")] + [f"encoder.conv.{n}" for n in ("weight", "bias")]
    code = fix_code(_culprits(dec, torch.float32) + _culprits(rest, torch.bfloat16))
    assert code is not None
    ast.parse(code)  # valid Python, every line
    assert code.splitlines() == ["torchdoctor.move(model, dtype=torch.bfloat16)",  # outer first: nothing undone
                                 "torchdoctor.move(model.decoder, dtype=torch.float32)"], code


def test_one_device_and_one_dtype_stay_one_move_of_the_model() -> None:
    paths = [f"layers.{i}.weight" for i in range(5)]
    code = fix_code([(p, p, "device", (torch.device("cuda", 0), torch.bfloat16)) for p in paths])
    assert code == "torchdoctor.move(model, device='cuda:0', dtype=torch.bfloat16)", code


def test_the_outer_modules_move_comes_before_the_inner_ones() -> None:
    a = [f"blocks.{i}.weight" for i in range(4)]
    b = ["head.weight", "embed.weight"]
    code = fix_code(_culprits(a, torch.float16) + _culprits(b, torch.float32))
    assert code is not None
    ast.parse(code)
    assert "dtype=torch.float16" in code and code.count("torchdoctor.move(") == 2, code
    assert code.splitlines() == ["torchdoctor.move(model, dtype=torch.float32)",
                                 "torchdoctor.move(model.blocks, dtype=torch.float16)"], code

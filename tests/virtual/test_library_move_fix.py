"""A tensor a library moves on the program's request (diffusers' ``EMAModel.to("cpu")``, pinning the EMA weights
to the CPU) and that then meets the model's cuda tensors (``ema.step``) is fixed where the program holds it,
never by editing the library's own line, and never called proven at the op (hunt U26): the line that asked for
the move is the program's."""

from __future__ import annotations

import pytest
import torch
from diffusers.training_utils import EMAModel
from torch import nn

import torchdoctor


def test_an_ema_the_program_pins_to_the_cpu_is_not_fixed_in_the_librarys_line() -> None:
    with pytest.raises(torchdoctor.PlacementError) as info, torchdoctor.virtual_devices("cuda:0"):
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to("cuda:0")
        ema = EMAModel(model.parameters(), decay=0.999)
        ema.to("cpu")  # the program pins the EMA weights to the CPU
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss = model(torch.randn(2, 8, device="cuda:0")).square().mean()
        loss.backward()
        opt.step()
        ema.step(model.parameters())  # cuda parameters meet the cpu shadow weights
    err = info.value
    assert {p.path for p in err.problems} == {"ema.shadow_params[0]"}, str(err)
    text = str(err)
    assert "inside the forward" not in text and "(e.g. .to(x.device))" not in text, text
    assert "ema.to('cuda:0')" in text  # the program's object, as it holds it


def test_a_library_move_with_no_holder_on_record_is_advice_at_the_programs_object() -> None:
    from torchdoctor._report.model import Problem
    from torchdoctor._virtual.fixes import fix_items

    p = Problem(path="<top level>", kind="device", role="op", found="cpu", expected="cuda:0", op="aten.sub.Tensor",
                message="a tensor made by Tensor.to in code outside the model at diffusers/training_utils.py:851 "
                        "f32[16,8]@cpu is on cpu while aten.sub.Tensor runs on cuda:0")
    sources = {("device", "<top level>", "aten.sub.Tensor", "cpu"): ("moved a tensor at diffusers/training_utils.py:851",)}
    fixes = fix_items([p], torch.device("cuda:0"), None, sources) or []
    assert len(fixes) == 1, [f.code for f in fixes]
    fix = fixes[0]
    assert fix.code.startswith("# a tensor was moved to cpu by a library call (diffusers/training_utils.py:851)")
    assert "never an edit of the library's line" in fix.code and "inside the forward" not in fix.code
    assert not fix.proven and (fix.tried or "").startswith("not re-run")

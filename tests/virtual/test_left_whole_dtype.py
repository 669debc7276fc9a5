"""A layer the program rebuilt after the model's ``.to(device, bf16)`` (a LoRA unload restoring it from a cpu backup,
diffusers #10202) is on the cpu *and* in float32: the fix moves it whole in the model's dtype too
(``torchdoctor.move(..., 'cuda:1', torch.bfloat16)``); a device-only move left the dtype wrong. A fix that names the
model as ``simulate``'s ``call=`` does (``m``) is re-run with ``m`` bound to the model, never a NameError (hunt of the
twenty-sixth session, c04)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def _net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.SiLU(), nn.Conv2d(4, 4, 3, padding=1))


def _restore(m: nn.Module) -> None:
    backup = {k: v.detach().cpu().float() for k, v in m[0].state_dict().items()}
    new = nn.Conv2d(4, 4, 3, padding=1)
    new.load_state_dict(backup)
    m[0] = new  # restored: on the cpu, float32


def test_a_rebuilt_layer_is_moved_whole_in_the_models_dtype() -> None:
    model = _net()
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as s:
        model.to("cuda:1", torch.bfloat16)
        _restore(model)
        model(torch.randn(1, 4, 8, 8, device="cuda:1", dtype=torch.bfloat16))
    assert any(f.code.startswith("torchdoctor.move(model[0], 'cuda:1', torch.bfloat16)  # none of its 2 tensors "
                                 "moved: it was left on cpu in float32") for f in s.fixes), [f.code for f in s.fixes]


def test_a_fix_naming_the_calls_model_is_re_run_without_a_name_error() -> None:
    def call(m: nn.Module) -> torch.Tensor:
        m.to("cuda:1", torch.bfloat16)
        m[2] = nn.Conv2d(4, 4, 3, padding=1)  # left on the cpu in float32, replaced before the forward
        return m(torch.randn(1, 4, 8, 8, device="cuda:1", dtype=torch.bfloat16))

    r = torchdoctor.simulate(_net(), device="cuda:1", dtype=torch.bfloat16, call=call)
    assert r.fixes and all("NameError" not in f.tried for f in r.fixes), [(f.code, f.tried) for f in r.fixes]
    assert any("m[2]" in f.code for f in r.fixes), [f.code for f in r.fixes]

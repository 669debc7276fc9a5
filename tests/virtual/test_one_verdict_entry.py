"""One verdict for a problem found when a layer starts, not at an op (hunt C2): uint8 codes in a plain Conv3d of an
fp16 model get the same fix and the same verdict (unproven: a bare cast of stored integers runs with the wrong values)
from the API ``simulate`` and the command line."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

import torchdoctor
from torchdoctor._cli.main import main

APP = """
    import torch
    from torch import nn
    import torchdoctor


    class Wan(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch, self.head = nn.Conv3d(4, 4, 1), nn.Linear(4, 4)

        def forward(self, x):
            return self.head(self.patch(x).mean((2, 3, 4)))


    def target():
        m = Wan().to(torch.float16)
        m.patch.weight = nn.Parameter(torch.randint(0, 255, (4, 4, 1, 1, 1), dtype=torch.uint8), requires_grad=False)
        return torchdoctor.Target(m, (torch.randn(1, 4, 2, 2, 2, dtype=torch.float16),))
"""
FIX = "model.patch.weight.data = model.patch.weight.data.to(torch.float16)"


def test_uint8_in_a_plain_conv3d_gets_one_proven_verdict_from_api_and_cli(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "wan_app.py"
    path.write_text(textwrap.dedent(APP), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    import wan_app  # type: ignore[import-not-found]

    api = torchdoctor.simulate(wan_app.target(), device="cuda:0", dtype=torch.float16)
    assert main(["simulate", f"{path}:target", "--device", "cuda:0", "--dtype", "float16", "--json"]) == 1
    cli = json.loads(capsys.readouterr().out)
    verdicts = [[(f["code"].split("  #")[0], f["proven"], f["tried"]) for f in fixes]
                for fixes in ([f.to_dict() for f in api.fixes], cli["fixes"])]
    # one verdict from both entries: a bare cast of stored integers runs, with the integers as its values, so it is
    # never said proven (the twenty-sixth session's hunt, c10)
    assert verdicts[0] == verdicts[1] == [(FIX, False, "not re-run: a bare cast of stored integers runs with the "
                                           "integers as values; only their scale dequantizes")], verdicts
    assert "torch.uint8" not in (api.fix or "")  # the storage is cast, never the activations

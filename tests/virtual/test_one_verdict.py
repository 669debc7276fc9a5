"""One case, one verdict (issue 41 point 1): the same planted bug gets the same fix, proven the same way, from the
API ``simulate``, the command line ``torchdoctor simulate``, a ``virtual_devices`` block and the pytest marker. A
fix that only a note can say (a factory without ``device=``, an fp32 input into a bf16 model) is proven at the
failing op by all four, never "advice only" in one and proven in another."""

from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import torchdoctor
from torchdoctor._cli.main import main

pytest_plugins = ["pytester"]

APP = """
    import torch
    from torch import nn
    import torchdoctor


    class CpuMask(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            mask = torch.ones(4)
            return self.lin(x) * mask


    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x)


    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.scale = torch.ones(4)

        def forward(self, x):
            return self.lin(x) * self.scale


    def mask():
        return torchdoctor.Target(CpuMask(), (torch.ones(2, 4),))


    def fp32_input():
        return torchdoctor.Target(Plain().to(torch.bfloat16), (torch.ones(2, 4),))


    def attribute():
        return torchdoctor.Target(Scaled(), (torch.ones(2, 4),))
"""

# case -> (dtype asked, the fix's code as its first line starts, the line the text ends its proof with)
CASES = {
    "mask": (None, "# torch.ones in `<root>` made it on cpu: pass device= the input's device "
                   "(torch.ones(..., device=x.device))", "aten.mul.Tensor"),
    "fp32_input": (None, "# pass input 0", "aten.addmm.default"),
}
# where a block or the marker saw the argument made (a factory at a line of the caller's file), that call is the fix,
# proven as the argument's cast is; the API and the command line get the argument already made
SEEN_MADE = {
    "fp32_input": "# torch.ones made it in float32: pass dtype= (torch.ones(..., dtype=torch.bfloat16))",
    "attribute": ("bfloat16", "model.scale.data = model.scale.data.to('cuda:1', torch.bfloat16)", "aten.mul.Tensor"),
}
MAKE = {"mask": "mask", "fp32_input": "fp32_input", "attribute": "attribute"}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ModuleType]:
    path = tmp_path_factory.mktemp("verdict") / "verdict_app.py"
    path.write_text(textwrap.dedent(APP), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("verdict_app", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return path, mod


def _verdict(fixes: list[dict[str, Any]]) -> list[tuple[str, bool, bool]]:
    """Each judged part: its code's first 14 characters, proven, and whether the proof was at the failing op."""
    return [(d["code"][:14], d["proven"], d["tried"].startswith("at the failing op ")) for d in fixes
            if not d["tried"].startswith("not applied")]


def _block(mod: ModuleType, case: str) -> torchdoctor.VirtualSession:
    dtype = CASES[case][0]
    with torchdoctor.virtual_devices("cuda:1", dtype=dtype, raise_on_exit=False) as sim:
        t = getattr(mod, MAKE[case])()
        to = ("cuda:1",) if dtype is None else ("cuda:1", getattr(torch, dtype))
        t.obj.to(*to)(*(a.to(*to) if case != "fp32_input" else a.to("cuda:1") for a in t.args))
    return sim


@pytest.mark.parametrize("case", sorted(CASES))
def test_api_cli_and_block_give_one_verdict(app: tuple[Path, ModuleType], case: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path, mod = app
    dtype, code, op = CASES[case]
    api = torchdoctor.simulate(getattr(mod, MAKE[case])(), device="cuda:1", dtype=dtype)
    assert main(["simulate", f"{path}:{MAKE[case]}", "--device", "cuda:1", "--json",
                 *(["--dtype", dtype] if dtype else [])]) == 1
    cli = json.loads(capsys.readouterr().out)
    block = _block(mod, case)
    verdicts = [_verdict([f.to_dict() for f in api.fixes]), _verdict(cli["fixes"]),
                _verdict([f.to_dict() for f in block.fixes])]
    if case in SEEN_MADE:
        assert verdicts[2] == [(SEEN_MADE[case][:14], *v[1:]) for v in verdicts[0]], verdicts
        verdicts[2] = verdicts[0]
    assert verdicts[0] == verdicts[1] == verdicts[2], verdicts
    assert verdicts[0] and all(proven and at_op for _, proven, at_op in verdicts[0]), verdicts[0]
    for text in (api.text(), str(block.error())):
        assert (code in text or SEEN_MADE.get(case, code) in text) and re.search(rf"# fix proven \(at the failing op {op} at \S*verdict_app\.py:\d+: ", text)
        assert "advice only" not in text and "fix unproven" not in text


MARKED = """
    import pytest, torch
    import verdict_app as app

    def _run(case, to, keep_input_dtype=False):
        t = getattr(app, case)()
        t.obj.to(*to)(*(a.to(to[0]) if keep_input_dtype else a.to(*to) for a in t.args))

    @pytest.mark.simulate(device="cuda:1")
    def test_mask():
        _run("mask", ("cuda:1",))

    @pytest.mark.simulate(device="cuda:1")
    def test_fp32_input():
        _run("fp32_input", ("cuda:1",), keep_input_dtype=True)

    @pytest.mark.simulate(device="cuda:1", dtype="bfloat16")
    def test_attribute():
        _run("attribute", ("cuda:1", torch.bfloat16))
"""


def test_the_marker_gives_the_same_verdict(app: tuple[Path, ModuleType], pytester: pytest.Pytester) -> None:
    path, _ = app
    pytester.makepyfile(verdict_app=path.read_text(encoding="utf-8"), test_marked=textwrap.dedent(MARKED))
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-W", "ignore",
                                           timeout=600)
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    for case, (_, code, op) in CASES.items():
        assert SEEN_MADE.get(case, code) in out, case
        assert re.search(rf"# fix proven \(at the failing op {op} at \S*verdict_app\.py:\d+: ", out), case
    assert "fix unproven" not in out and "advice only" not in out

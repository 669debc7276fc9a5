"""A raised dtype error whose odd operand is no float guard compares (hunt 31: a16, e02, a49): integer data into a
layer, float indices into an embedding, a list of another dtype handed to ``torch._foreach_*``. guard named no
culprit, and ``run`` printed explain's generic advice with a name the program lacks (``x = x.to(torch.float32)``,
an ``inputs`` dict, ``t = t.bfloat16()``). The fix is the program's own line with that operand cast where it is
handed over, proven on copies, as a diff (``_guard/rawarg.py``); the same from ``run`` and from ``guard`` in the
user's own code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from run.test_run_cli import ENV, TIMEOUT, run, write
from run.test_run_hunt26 import _applied_clean, _report

A16 = """\
    # integer tensor into a float op (pixel values as uint8 into a conv stem)
    import numpy as np, torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    stem = nn.Conv2d(3, 8, 3, padding=1).to(device)
    img = (np.random.rand(32, 32, 3) * 255).astype(np.uint8)
    pixels = torch.from_numpy(img).permute(2, 0, 1)[None].to(device)
    feat = stem(pixels)
    print("ok", feat.shape)
"""

E02 = """\
    # token ids turned float by a masking trick, then fed to nn.Embedding
    import torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    emb = nn.Embedding(100, 8).to(device)
    ids = torch.randint(0, 100, (2, 6), device=device)
    keep = torch.rand(2, 6, device=device) > 0.2
    ids = ids * keep.float()               # becomes float32
    print("ok", emb(ids).shape)
"""

A49 = """\
    # EMA kept in bf16 to save memory, updated with torch._foreach_lerp_ from the fp32 model
    import copy, torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
    ema = copy.deepcopy(model).to(torch.bfloat16).requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ema_params, model_params = list(ema.parameters()), list(model.parameters())
    for step in range(2):
        model(torch.randn(4, 8, device=device)).sum().backward()
        opt.step(); opt.zero_grad()
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, model_params, 0.01)
    print("ok", ema[0].weight.dtype)
"""

CASES = {
    "a16": (A16, "feat = stem(pixels.float())  # app.py:7", "+feat = stem(pixels.float())\n",
            ["pixels made by `torch.from_numpy` at app.py:6", "`pixels.float() / 255`"]),
    "e02": (E02, 'print("ok", emb(ids.long()).shape)  # app.py:8', '+print("ok", emb(ids.long()).shape)\n',
            ["ids made float32 by `ids * keep.float()` at app.py:7", "`ids * keep` keeps the integer dtype of `ids`"]),
    "a49": (A49, "torch._foreach_lerp_(ema_params, [p.to(torch.bfloat16) for p in model_params], 0.01)  # app.py:12",
            "+        torch._foreach_lerp_(ema_params, [p.to(torch.bfloat16) for p in model_params], 0.01)\n",
            ["model_params (a list of float32 tensors) made at app.py:7"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_line_that_hands_the_operand_over_is_fixed_with_its_own_name(tmp_path: Path, case: str) -> None:
    program, fix, added, said = CASES[case]
    write(tmp_path / "app.py", program)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [finding] = [f for f in report["findings"] if f["how"] == "raised"]
    assert finding["fix_from"] == "guard" and finding["fix"] == fix, finding
    assert finding["proven"] is True, finding["culprit"]
    assert "fix proven: `" in finding["culprit"]
    for text in said:
        assert text in finding["culprit"], finding["culprit"]
    assert added in report["patch"], report["patch"]
    for placeholder in ("x = x.to", "inputs.items()", "t = t.bfloat16()"):
        assert placeholder not in str(report["fixes"]), report["fixes"]
    _applied_clean(tmp_path, report)


def test_the_text_report_prints_guards_fix_and_the_patch(tmp_path: Path) -> None:
    write(tmp_path / "app.py", A16)
    proc = run("--device", "cuda:0", "app.py", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert "explain's advice" not in out, out
    assert "  fix:\n    feat = stem(pixels.float())  # app.py:7\n" in out, out
    assert "patch (git apply):" in out and "    -feat = stem(pixels)\n    +feat = stem(pixels.float())" in out, out


GUARDED = """
    import numpy as np, torch, torch.nn as nn, torchdoctor

    class Tok(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 8)
            self.out = nn.Linear(8, 2)

        def forward(self, ids, keep):
            ids = ids * keep.float()
            return self.out(self.emb(ids))

    def check(fn):
        try:
            fn()
        except torchdoctor.PlacementError as err:
            print("FIX", err.fix)
            print("PROOF", err.proof)
            print("PATCH", err.patch)

    stem = nn.Conv2d(3, 8, 3, padding=1)
    img = torch.from_numpy((np.random.rand(32, 32, 3) * 255).astype(np.uint8))

    def pixels_inline():
        with torchdoctor.guard(stem):
            stem(img.permute(2, 0, 1)[None])

    model = Tok()

    def ids_in_forward():
        with torchdoctor.guard(model):
            model(torch.randint(0, 100, (2, 6)), torch.rand(2, 6) > 0.2)

    check(pixels_inline)
    check(ids_in_forward)
"""


def test_guard_in_the_users_code_fixes_the_line_in_a_forward_and_an_expression(tmp_path: Path) -> None:
    write(tmp_path / "app.py", GUARDED)
    proc = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=TIMEOUT)
    out = proc.stdout
    assert "FIX stem(img.permute(2, 0, 1)[None].float())  # app.py:27" in out, out + proc.stderr
    assert "FIX return self.out(self.emb(ids.long()))  # app.py:12" in out, out
    assert out.count("PROOF fix proven: `") == 2, out
    assert "+        stem(img.permute(2, 0, 1)[None].float())" in out, out
    assert "+        return self.out(self.emb(ids.long()))" in out, out


LOADED = """\
    import numpy as np, torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    stem = nn.Conv2d(3, 8, 3, padding=1).to(device)

    def load():
        img = (np.random.rand(32, 32, 3) * 255).astype(np.uint8)
        return torch.from_numpy(img).permute(2, 0, 1)[None].to(device)

    feat = stem(load())
    print("ok", feat.shape)
"""

UNREAD = """\
    import numpy as np, torch, torch.nn.functional as F
    device = "cuda" if torch.cuda.is_available() else "cpu"
    w = torch.randn(8, 3, 3, 3, device=device)

    def load():
        img = (np.random.rand(32, 32, 3) * 255).astype(np.uint8)
        return torch.from_numpy(img).permute(2, 0, 1)[None].to(device)

    feat = F.conv2d(load(), w)
"""


def test_a_modules_input_made_by_a_call_is_read_from_what_the_module_got(tmp_path: Path) -> None:
    write(tmp_path / "app.py", LOADED)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [finding] = report["findings"]
    assert finding["fix"] == "feat = stem(load().float())  # app.py:9" and finding["proven"] is True, finding
    _applied_clean(tmp_path, report)


def test_an_operand_guard_cannot_read_again_gets_words_never_a_name_the_program_lacks(tmp_path: Path) -> None:
    write(tmp_path / "app.py", UNREAD)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [finding] = report["findings"]
    assert finding["fix_from"] == "guard" and finding["proven"] is False, finding
    assert finding["fix"] == ("# cast the integer data to float32 where app.py:9 hands it over (`feat = "
                              "F.conv2d(load(), w)`); not written: no operand of that line is a name or a torch "
                              "expression guard can read again"), finding["fix"]
    assert "fix unproven: not re-run" in finding["culprit"] and report["patch"] is None

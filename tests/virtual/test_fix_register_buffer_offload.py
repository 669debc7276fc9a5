"""A plain tensor attribute of a layer under diffusers group offloading (a quantized layer's scale kept outside its
parameters: huggingface/diffusers#12610) is never onloaded: its fix is to register it as a buffer where the layer
builds it (a diff of that line), proven by a re-run; never ``torchdoctor.move(model, ...)``, which the hooks make
refuse, and never a note that its weight was "built in forward" (issue 41 point 1, hunt T5)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import torchdoctor
from support.apps import load_file as _load

PROGRAM = """
    import torch, torch.nn as nn, torch.nn.functional as F
    from diffusers.hooks import apply_group_offloading
    class Q(nn.Module):
        def __init__(self, n):
            super().__init__()
            w = torch.randn(n, n)
            self.scale = w.abs().amax(dim=1, keepdim=True) / 127
            self.weight = nn.Parameter((w / self.scale).round().to(torch.int8), requires_grad=False)
        def forward(self, x):
            return F.linear(x, self.weight.to(x.dtype) * self.scale.to(x.dtype))
    class Net(nn.Module):
        def __init__(self):
            super().__init__(); self.blocks = nn.ModuleList([Q(8), Q(8)])
        def forward(self, x):
            for b in self.blocks: x = x + b(x)
            return x
    def build(): return Net()
    def app(m, device="cuda:0"):
        apply_group_offloading(m, onload_device=torch.device(device), offload_device=torch.device("cpu"),
                               offload_type="block_level", num_blocks_per_group=1)
        return m(torch.randn(1, 8, device=device))
"""



def test_a_plain_attribute_under_group_offloading_becomes_a_buffer_where_it_is_built(tmp_path: Path) -> None:
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(PROGRAM), encoding="utf-8")
    mod = _load(path)
    api = torchdoctor.simulate(mod.build(), device="cuda:0", call=mod.app)
    text = api.text()
    assert not api.ok and "torchdoctor.move(" not in text and "built in forward" not in text, text
    (fix,) = api.to_dict()["fixes"]
    assert fix["proven"] and fix["code"].startswith("# blocks.0.scale, blocks.1.scale are plain attributes of Q: "
                                                    "the hooks that place the model (GroupOffloadingHook"), fix
    assert "register it as a buffer at app.py:8: self.register_buffer('scale', ..., persistent=False)" in fix["code"]
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False, select=False) as block:
        mod.app(mod.build())
    assert [(f.code, f.proven, f.diff) for f in block.fixes] == [(fix["code"], True, fix["diff"])]
    proc = subprocess.run(["git", "apply", "--unsafe-paths", "-p1", "--directory", "."], input=fix["diff"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "self.register_buffer('scale', w.abs().amax(dim=1, keepdim=True) / 127, persistent=False)" in \
        path.read_text(encoding="utf-8")
    fixed = _load(path)
    assert torchdoctor.simulate(fixed.build(), device="cuda:0", call=fixed.app).ok
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False, select=False) as block:
        fixed.app(fixed.build())
    assert block.ok, block.problems


def test_the_lasting_note_stays_without_hooks(tmp_path: Path) -> None:
    path = tmp_path / "plain.py"
    lines = textwrap.dedent(PROGRAM).splitlines()
    program = "\n".join("    m.to(device)" if "apply_group_offloading(m" in x else x for x in lines
                         if "offload_type=" not in x)
    path.write_text(program + "\n", encoding="utf-8")
    mod = _load(path)
    api = torchdoctor.simulate(mod.build(), device="cuda:0", call=mod.app)
    assert "plain attributes of Q: the hooks" not in api.text() and "register" in api.text(), api.text()

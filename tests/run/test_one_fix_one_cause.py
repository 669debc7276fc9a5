"""One cause, one fix, one count in ``torchdoctor run``'s report: a KV cache in another dtype shared by every layer is
one cause however many attention ops meet it; adapters built after the model's move (LoRA wrappers holding
``nn.Linear`` down/up projections) are one cause with their per-op dtype problems, fixed where they are built in the
wrapped layer's device and dtype. A default-dtype factory in a checkpointed forward (the default dtype set only around
the forward, as a "bf16-true" precision plugin does) is named when the recompute raises ``CheckpointError``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from torchdoctor._report.model import Problem
from torchdoctor._run.onecause import causes

KV_CACHE = '''
import torch, torch.nn as nn, torch.nn.functional as F

class Layer(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.q, self.kv = nn.Linear(d, d), nn.Linear(d, 2 * d)
    def forward(self, x, past, i):
        q = self.q(x).unsqueeze(1)
        k, v = self.kv(x).unsqueeze(1).chunk(2, -1)
        past[i][:, :, :x.shape[1]] = k
        return x + F.scaled_dot_product_attention(q, past[i][:, :, :x.shape[1]], v).squeeze(1)

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(3))
    def forward(self, x, past):
        for i, layer in enumerate(self.layers):
            x = layer(x, past, i)
        return x

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Model().to(device, torch.bfloat16)
past = torch.zeros(3, 2, 1, 8, 16, dtype=torch.float32, device=device)
with torch.no_grad():
    print(model(torch.randn(2, 5, 16, device=device, dtype=torch.bfloat16), past).shape)
'''

ADAPTERS = '''
import torch, torch.nn as nn

class Adapter(nn.Module):  # a LoRA wrapper with nn.Linear projections (lora_down / lora_up)
    def __init__(self, base, r=4):
        super().__init__()
        self.base = base
        self.lora_down = nn.Linear(base.in_features, r, bias=False)
        self.lora_up = nn.Linear(r, base.out_features, bias=False)
    def forward(self, x):
        return self.base(x) + self.lora_up(self.lora_down(x))

def inject(net, names=("q", "v")):
    for mod in list(net.modules()):
        for n in names:
            if isinstance(getattr(mod, n, None), nn.Linear):
                setattr(mod, n, Adapter(getattr(mod, n)))

class Attn(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
    def forward(self, x):
        a = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), -1)
        return x + self.o(a @ self.v(x))

device = "cuda" if torch.cuda.is_available() else "cpu"
net = nn.Sequential(Attn(), Attn()).to(device, torch.bfloat16)
inject(net)
x = torch.randn(2, 5, 16, device=device, dtype=torch.bfloat16)
print(net(x).shape)
'''

DEFAULT_CONTEXT = '''
import contextlib, torch, torch.nn as nn
from torch.utils.checkpoint import checkpoint

@contextlib.contextmanager
def half_default():
    old = torch.get_default_dtype(); torch.set_default_dtype(torch.bfloat16)
    try: yield
    finally: torch.set_default_dtype(old)

class Block(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, d)
    def forward(self, x):
        bias = torch.zeros(x.shape[-1])
        return self.lin(x) * (1 + bias.to(x.device))

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
net = nn.ModuleList([Block(), Block()]).to(device, torch.bfloat16)
x = torch.randn(4, 8, device=device, dtype=torch.bfloat16)
with half_default():
    h = x
    for b in net:
        h = checkpoint(b, h, use_reentrant=False)
    loss = h.float().pow(2).mean()
loss.backward()
print("trained")
'''

DEFAULT_SET = '''
import torch, torch.nn as nn
from torch.utils.checkpoint import checkpoint

class Gate(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.proj = nn.Linear(d, d)
    def forward(self, hidden):
        scale = torch.full((1,), 0.5, device=hidden.device)
        return self.proj(hidden) * scale

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
gate = Gate().to(device, torch.bfloat16)
hidden = torch.randn(4, 8, device=device, dtype=torch.bfloat16, requires_grad=True)
torch.set_default_dtype(torch.bfloat16)
out = checkpoint(gate, hidden, use_reentrant=False)
torch.set_default_dtype(torch.float32)
out.float().sum().backward()
print("done")
'''


def _run(app: Path, *extra: str) -> str:
    p = subprocess.run([sys.executable, "-m", "torchdoctor", "run", "--device", "cuda", "--color", "never", *extra,
                        app.name], cwd=app.parent, capture_output=True, text=True, timeout=300)
    return p.stdout + p.stderr


def _app(tmp_path: Path, text: str) -> Path:
    app = tmp_path / "app.py"
    app.write_text(text)
    return app


def test_dtype_problems_of_one_operand_in_many_modules_are_one_cause() -> None:
    desc = ("a tensor made by aten.slice in `{m}`, 2 ops after torch.zeros in code outside the model at app.py:13 "
            "f32[1,4,3,8]@mps:0 is float32 while aten.scaled_dot_product_attention.default computes in bfloat16 "
            "(in {m}, Block)")
    problems = [Problem("dtype", m, "activation", "float32", "bfloat16", desc.format(m=m),
                        op="aten.scaled_dot_product_attention.default", module_path=m, module_type="Block")
                for m in ("blocks.0", "blocks.1")]
    (one,) = causes(problems)
    assert one.members == ["blocks.0", "blocks.1"]
    assert "f32[1,4,3,8]@mps:0 is float32 while the ops compute in bfloat16: one tensor reaches 2 ops" in \
        one.shown.message


def test_some_tensors_of_a_model_left_behind_are_said_as_skipped_never_the_model_left_there() -> None:
    """The program placed its model layer by layer and skipped the Parameters no layer owns: the model was moved,
    those tensors were not (never "the model was left there")."""
    def off(path: str) -> Problem:
        return Problem("device", path, "parameter", "cpu", "cuda:0",
                       f"{path} f32[8]@cpu is on cpu while aten.add.Tensor runs on cuda:0", op="aten.add.Tensor",
                       module_path="blocks.0", module_type="Block")

    roots = [("Decoder", frozenset({"pos_emb", "blocks.0.gate", "blocks.0.lin.weight", "blocks.0.lin.bias"}))]
    (one,) = causes([off("pos_emb"), off("blocks.0.gate")], roots)
    assert "Decoder's 2 tensors (of its 4) are on cpu while the run is on cuda:0: they were not moved with the rest " \
           "of the Decoder model (a placement of its layers that skips them, or a move that missed them)" in \
           one.shown.message, one.shown.message
    (whole,) = causes([off(x) for x in sorted(roots[0][1])], roots)
    assert "(all of them)" in whole.shown.message and "the Decoder model was left there" in whole.shown.message


def test_a_kv_cache_in_another_dtype_shared_by_every_layer_is_one_cause(tmp_path: Path) -> None:
    out = _run(_app(tmp_path, KV_CACHE))
    assert "3 problem(s) recorded (1 cause(s))" in out, out
    assert "is float32 while the ops compute in bfloat16: one tensor reaches 3 ops: 0, 1, 2 in layers" in out, out


def test_adapters_built_after_the_move_are_one_cause_fixed_where_built(tmp_path: Path) -> None:
    out = _run(_app(tmp_path, ADAPTERS))
    assert "16 problem(s) recorded (1 cause(s))" in out, out
    assert "one cause: they are float32 where 8 op(s) compute in bfloat16" in out, out
    fix = out.split("\nFix", 1)[1]
    assert "# 4 Adapter modules are built at app.py:17 after the model was moved and cast to bfloat16, on the cpu" \
        in fix, fix
    assert "+                setattr(mod, n, Adapter(getattr(mod, n)).to(getattr(mod, n).weight.device, " \
           "getattr(mod, n).weight.dtype))" in fix, fix
    assert "fix proven" in fix and "no line that made them" not in fix and "cuda:0'" not in fix, fix


def test_a_default_dtype_factory_in_a_checkpointed_forward_is_named_and_fixed(tmp_path: Path) -> None:
    app = _app(tmp_path, DEFAULT_CONTEXT)
    out = _run(app)
    assert "CheckpointError" in out
    assert "culprit: torch.zeros at app.py:16 is given no dtype, so it makes its tensor in the default dtype: " \
           "bfloat16 in the forward (the program set it), float32 when the backward recomputed" in out, out
    assert "torch.zeros(..., dtype=x.dtype)  # at app.py:16" in out, out
    assert "+        bias = torch.zeros(x.shape[-1], dtype=x.dtype)" in out, out
    subprocess.run(["git", "init", "-q", "."], cwd=tmp_path, check=True)
    patch = out.split("patch (git apply):\n", 1)[1]
    (tmp_path / "p.diff").write_text("".join(line[4:] + "\n" for line in patch.splitlines() if line.startswith("    ")))
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True)
    plain = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and "trained" in plain.stdout, plain.stderr
    assert "no placement error" in _run(app)


def test_a_default_dtype_factory_on_the_device_names_the_function_s_own_tensor(tmp_path: Path) -> None:
    out = _run(_app(tmp_path, DEFAULT_SET))
    assert "culprit: torch.full at app.py:10 is given no dtype" in out, out
    assert "+        scale = torch.full((1,), 0.5, device=hidden.device, dtype=hidden.dtype)" in out, out

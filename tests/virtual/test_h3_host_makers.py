"""The program's own host line that made a model tensor, named: a float8 cast of a loader's weights (its dtype read
from a variable set lines away) refused by MPS is fixed where that dtype was chosen, a diff that applied lets the
program run clean; a loss's class weights left on the cpu are named by the factory and the name that made them,
and no other object's ``.to()`` is said to be their last change."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.apps import run_json

# weights stored in float8 by a loader, the dtype a variable the program sets after the loader's definition
FP8_VAR = '''import torch, torch.nn as nn, torch.nn.functional as F

class Cast(nn.Linear):
    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype), self.bias.to(x.dtype))

def build(store_dtype):
    m = nn.Sequential(Cast(8, 8), nn.ReLU(), Cast(8, 4))
    for layer in (m[0], m[2]):
        layer.weight.data = layer.weight.data.to(store_dtype)
    return m

store = torch.float8_e4m3fn  # chosen by the program's settings
net = build(store_dtype=store)
net.to("mps")
with torch.no_grad():
    print(net(torch.randn(2, 8, device="mps", dtype=torch.float16)).shape)
'''

# the dtype written in the cast itself, in a loop at module level
FP8_LITERAL = '''import torch, torch.nn as nn, torch.nn.functional as F

class Cast(nn.Linear):
    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype))

net = nn.Sequential(Cast(8, 8, bias=False))
for p in net.parameters():
    p.data = p.data.to(torch.float8_e5m2)
net.to("mps")
print(net(torch.randn(2, 8, device="mps", dtype=torch.float16)).shape)
'''

# the same float8 storage kept on the cpu and dequantized per call before the move: correct, quiet
FP8_KEPT = '''import torch, torch.nn as nn, torch.nn.functional as F

class Cast(nn.Linear):
    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype).to(x.device))

net = nn.Sequential(Cast(8, 8, bias=False))
for p in net.parameters():
    p.data = p.data.to(torch.float8_e4m3fn)
print(net(torch.randn(2, 8, device="mps", dtype=torch.float16)).shape)
'''


def _line(src: str, text: str) -> int:
    return next(i for i, ln in enumerate(src.splitlines(), 1) if text in ln)


def _applied_is_clean(tmp_path: Path, doc: dict, device: str) -> None:
    subprocess.run(["git", "apply", "-"], input=doc["patch"], cwd=tmp_path, text=True, check=True, timeout=60)
    again = run_json(tmp_path / "app.py", device)
    assert again["ok"] and again["problems"] == [], again["problems"]


def test_float8_weights_refused_by_mps_are_fixed_where_their_dtype_was_chosen(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(FP8_VAR)
    doc = run_json(tmp_path / "app.py", "mps")
    cast, chosen = _line(FP8_VAR, "layer.weight.data ="), _line(FP8_VAR, "store = torch.float8")
    [p] = doc["problems"]
    assert (f"0.weight f8e4m3[8,8]@cpu (cast to float8_e4m3fn by `layer.weight.data = layer.weight.data.to("
            f"store_dtype)` at app.py:{cast}, the dtype from `store = torch.float8_e4m3fn` at app.py:{chosen}) "
            "moved to mps:0 as float8_e4m3fn") in p["message"], p["message"]
    [f] = doc["fixes"]
    assert f["code"].startswith(f"store = torch.float16  # app.py:{chosen}: 0.weight is cast to float8_e4m3fn at "
                                f"app.py:{cast}"), f["code"]
    assert f["proven"] and "made outside the model" not in f["code"]
    assert "+store = torch.float16  # chosen by the program's settings" in doc["patch"]
    _applied_is_clean(tmp_path, doc, "mps")


def test_a_float8_cast_written_in_the_line_is_fixed_at_that_line(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(FP8_LITERAL)
    doc = run_json(tmp_path / "app.py", "mps")
    cast = _line(FP8_LITERAL, "p.data = p.data.to(")
    [p] = doc["problems"]
    assert f"(cast to float8_e5m2 by `p.data = p.data.to(torch.float8_e5m2)` at app.py:{cast}) moved to mps:0" in \
        p["message"], p["message"]
    assert "+    p.data = p.data.to(torch.float16)" in doc["patch"]
    _applied_is_clean(tmp_path, doc, "mps")


def test_float8_storage_kept_on_the_cpu_is_quiet(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(FP8_KEPT)
    doc = run_json(tmp_path / "app.py", "mps")
    assert doc["ok"] and doc["problems"] == []


# a loss's weights made by the program on the cpu, the model moved on the line after
LOSS = '''import torch, torch.nn as nn
counts = [10.0, 2.0, 1.0]
{make}
loss_fn = nn.{loss}
model = nn.Linear(4, 3).to("cuda")
x, y = torch.randn(5, 4, device="cuda"), {target}
print(float(loss_fn(model(x), y)))
'''


@pytest.mark.parametrize("make, loss, target, name, factory", [
    ("class_weights = torch.tensor([sum(counts) / c for c in counts])", "CrossEntropyLoss(weight=class_weights)",
     'torch.randint(0, 3, (5,), device="cuda")', "class_weights", "torch.tensor"),
    ("pos = torch.ones(3) * 2", "BCEWithLogitsLoss(pos_weight=pos)", 'torch.rand(5, 3, device="cuda")', "pos",
     "torch.ones"),
])
def test_a_loss_weight_left_on_the_cpu_is_named_by_its_maker_not_the_models_move(
        tmp_path: Path, make: str, loss: str, target: str, name: str, factory: str) -> None:
    src = LOSS.format(make=make, loss=loss, target=target)
    (tmp_path / "app.py").write_text(src)
    doc = run_json(tmp_path / "app.py", "cuda")
    made, moved = _line(src, make), _line(src, "model = nn.Linear")
    [p] = doc["problems"]
    assert f"(made by {factory} at app.py:{made} as `{name}`)" in p["message"], p["message"]
    assert f"app.py:{moved}" not in (p.get("trace") or ""), p["trace"]  # the model's .to moved no tensor of the loss
    _applied_is_clean(tmp_path, doc, "cuda")

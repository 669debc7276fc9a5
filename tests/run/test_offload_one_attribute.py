"""One plain tensor attribute of one class, met in many of its modules, is one cause in ``torchdoctor run``'s report:
a per-layer offloader (``m.to(device)`` around each leaf's call) never moves ``QLinear.scale`` (a plain attribute),
and both quantized layers meet it on the cpu; the report says ``QLinear.scale`` once with its modules, and its one
fix registers it as a buffer where ``__init__`` builds it (hunt Y7)."""

from __future__ import annotations

from pathlib import Path

from support.apps import run_json

APP = '''import torch, torch.nn as nn, torch.nn.functional as F


class QLinear(nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.scale = lin.weight.detach().abs().amax(1, keepdim=True) / 448
        self.weight = nn.Parameter((lin.weight.detach() / self.scale).to(torch.float8_e4m3fn), requires_grad=False)
        self.bias = lin.bias
    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype) * self.scale.to(x.dtype), self.bias)


def offload(model, device):
    for m in model.modules():
        if isinstance(m, (QLinear, nn.LayerNorm, nn.Embedding)):
            def wrapped(*a, _m=m, _f=m.forward, **k):
                _m.to(device); out = _f(*a, **k); _m.to("cpu"); return out
            m.forward = wrapped


te = nn.Sequential(nn.Embedding(64, 16), nn.LayerNorm(16), QLinear(nn.Linear(16, 32)), nn.GELU(),
                   QLinear(nn.Linear(32, 16))).eval()
offload(te, torch.device("cuda"))
with torch.no_grad():
    print(te(torch.randint(0, 64, (2, 5), device="cuda")).shape)
'''


def test_one_plain_attribute_of_one_class_in_two_layers_is_one_cause(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    doc = run_json(app, "cuda")
    assert sorted(p["path"] for p in doc["problems"]) == ["2.scale", "4.scale"]
    [cause] = doc["causes"]
    assert cause["path"] == "QLinear.scale" and sorted(cause["problems"]) == ["2.scale", "4.scale"], cause
    assert cause["message"].startswith("QLinear.scale, a plain tensor attribute, is on cpu in 2 QLinear modules while ")
    [fix] = doc["fixes"]
    assert "register_buffer('scale'" in fix["code"] and fix["proven"], fix

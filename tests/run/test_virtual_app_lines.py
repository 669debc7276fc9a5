"""Lines point at the user's program, and one cause reads as one finding (issue 40, point 5): a re-created
sd-scripts layout (``library/`` and ``networks/`` next to the training script are the app's own packages) whose
LoRA network was never moved gives ONE finding, "the LoRA network was not moved", with the count, a few paths as
the program holds them (``network.loras.0.lora_down.weight``, never ``….forward.__self__.…``) and the training
script's line, under ``torchdoctor run --device cuda:1`` in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

from run.test_run_cli import run, write

LORA = """
    from torch import nn


    class LoRAModule(nn.Module):
        def __init__(self, base, rank=2):
            super().__init__()
            self.lora_down = nn.Linear(base.in_features, rank, bias=False)
            self.lora_up = nn.Linear(rank, base.out_features, bias=False)
            self.org_forward = base.forward

        def apply_to(self, base):
            base.forward = self.forward

        def forward(self, x):
            return self.org_forward(x) + self.lora_up(self.lora_down(x))


    class LoRANetwork(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.targets = [m for m in model.modules() if isinstance(m, nn.Linear)]
            self.loras = nn.ModuleList(LoRAModule(t) for t in self.targets)

        def apply_to(self):
            for lora, base in zip(self.loras, self.targets):
                lora.apply_to(base)
"""

UTIL = """
    import torch


    def get_device():
        return torch.device("cuda")


    def forward_step(model, x):
        return model(x)
"""

TRAIN = """
    import torch
    from torch import nn
    from library import train_util
    from networks import lora

    torch.cuda.set_device(1)  # the user's choice of GPU: device 0 stays current otherwise, as on real hardware
    device = train_util.get_device()
    model = nn.Sequential(*(nn.Linear(8, 8) for _ in range(12))).requires_grad_(False)
    network = lora.LoRANetwork(model)
    network.apply_to()
    model.to(device)  # the planted bug: network.to(device) forgotten
    with torch.no_grad():
        out = train_util.forward_step(model, torch.randn(4, 8, device=device))
    print("out", out.device)
"""


def test_a_network_left_behind_is_one_finding_at_the_scripts_line(tmp_path: Path) -> None:
    write(tmp_path / "networks" / "__init__.py", "")
    write(tmp_path / "networks" / "lora.py", LORA)
    write(tmp_path / "library" / "__init__.py", "")
    write(tmp_path / "library" / "train_util.py", UTIL)
    script = write(tmp_path / "train_network.py", TRAIN)
    proc = run("--device", "cuda:1", str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # problems recorded
    assert "out cuda:1" in proc.stdout
    summary = proc.stderr[proc.stderr.index("torchdoctor run:"):]
    findings = [line for line in summary.splitlines() if line.startswith("[")]
    assert len(findings) == 1, summary
    assert findings[0].startswith("[device] network: the LoRA network was not moved: `network.to(device)` "
                                  "(network.to('cuda:1')): 24 tensors of `network`, patched into the model's "
                                  "forward, are on cpu while the run is on cuda:1; e.g. "
                                  "network.loras.0.lora_down.weight, network.loras.0.lora_up.weight"), summary
    assert "recorded at train_network.py:14 in <module>" in summary  # the script's line, not networks/lora.py
    problems = summary.split("\nFix", 1)[0]  # the fix lines (printed since C3) are the virtual run's own: see below
    assert "__self__" not in problems and "networks/lora.py" not in problems

    doc_proc = run("--device", "cuda:1", "--json", str(script), cwd=tmp_path)
    doc = json.loads(doc_proc.stdout[doc_proc.stdout.index("\n{") + 1:])
    paths = [p["path"] for p in doc["problems"]]
    assert len(paths) == 24 and all(p.startswith("network.loras.") and "__self__" not in p for p in paths)
    assert {p["where"] for p in doc["problems"]} == {"train_network.py:14 in <module>"}

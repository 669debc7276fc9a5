"""The program's output is the program's: under ``torchdoctor run`` its traceback has no torchdoctor frame between
its own (the virtual devices' backward wrapper), torchdoctor's own warnings (a trace that cannot read a
TorchScript module's state) are one line in the summary and never a traceback in the program's stream, and
``trace`` of a program written for a GPU this machine lacks says how to run it here (hunt T15b, T21, T27).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from run.test_run_cli import ENV, TIMEOUT, run, write

HOOK_RAISES = """
    import torch
    model = torch.nn.Linear(4, 4).to("cuda:0")
    def hook(grad):
        raise ValueError("boom in the hook")
    out = model(torch.ones(2, 4, device="cuda:0"))
    out.register_hook(hook)
    out.sum().backward()
"""


def test_the_programs_traceback_has_no_torchdoctor_frame_between_its_own(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", HOOK_RAISES)
    proc = run("--color", "never", "--device", "cuda:0", str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    shown = proc.stderr[:proc.stderr.index("torchdoctor run:")]
    assert 'app.py", line 8, in <module>' in shown and 'app.py", line 5, in hook' in shown
    assert "ValueError: boom in the hook" in shown
    assert "torchdoctor" not in shown.replace("torchdoctor run", "")  # no frame of ours, inner or outer
    assert "torch/autograd" in shown  # torch's own frames stay, as python shows them


SCRIPTED = """
    import logging, torch
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    class RelPos(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q = torch.nn.Linear(4, 4)
            self.table = torch.randn(9, 4)  # a plain attribute: the tracer bakes it as a constant
        def forward(self, x):
            return self.q(x) + self.table[: x.shape[1]]
    traced = torch.jit.trace(RelPos().eval(), (torch.randn(1, 5, 4),), check_trace=False)
    traced = traced.to("cpu")
    print("out", traced(torch.randn(1, 5, 4)).shape)
    logging.getLogger("torchdoctor.trace").warning("torchdoctor.trace: could not look at X", exc_info=ValueError("odd"))
"""


def test_torchdoctors_own_warnings_are_a_line_in_the_summary_never_a_traceback(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", SCRIPTED)
    proc = run("--color", "never", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "out torch.Size([1, 5, 4])" in proc.stdout
    assert "Traceback" not in proc.stderr and "torchdoctor/_" not in proc.stderr
    summary = proc.stderr[proc.stderr.index("torchdoctor run:"):]
    assert "note: could not look at X (ValueError: odd) (torchdoctor's own limit" in summary


NEEDS_CUDA = """
    import torch
    model = torch.nn.Linear(4, 4).cuda()
    print(model(torch.ones(1, 4, device="cuda")))
"""


def test_trace_of_a_gpu_program_on_a_machine_without_one_says_how_to_run_it_here(tmp_path: Path) -> None:
    if __import__("torch").cuda.is_available():  # pragma: no cover - the message is for machines without one
        return
    script = write(tmp_path / "app.py", NEEDS_CUDA)
    proc = subprocess.run([sys.executable, "-m", "torchdoctor", "trace", "--moves", str(script), "--flag"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 1, proc.stderr
    assert "Torch not compiled with CUDA enabled" in proc.stderr
    assert (f"torchdoctor trace: this program asks for cuda, which this machine's torch does not have: "
            f"`torchdoctor run --device cuda:0 {script} --flag` runs it here on a virtual cuda:0") in proc.stderr
    assert "torchdoctor/_trace" not in proc.stderr  # the trace's wrappers of Module.to are not the program's frames
    assert proc.stderr.strip().splitlines()[-1].startswith("torchdoctor trace: this program asks for cuda")


FP16_SCALER = """
    import torch
    m = torch.nn.Linear(8, 8).half()  # "mixed precision" by casting the model
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    loss = m(torch.ones(2, 8, dtype=torch.float16)).float().sum()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
"""


def test_a_gradscaler_on_float16_weights_is_one_explained_error(tmp_path: Path) -> None:
    """Hunt T11b: the program's traceback, then the explained error (never "no placement error")."""
    script = write(tmp_path / "app.py", FP16_SCALER)
    proc = run("--color", "never", str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    summary = proc.stderr[proc.stderr.index("torchdoctor run:"):]
    assert "1 placement error(s) met" in summary and "no placement error" not in summary
    assert "[dtype_mismatch] ValueError: Attempting to unscale FP16 gradients." in summary
    assert "raised at app.py:8 in <module>" in summary
    assert "culprit weight: f16[8,8]@cpu" in summary
    assert ".float()  # float32 master weights" in summary.split("fix:", 1)[1]



RESUMED = """
    import io, torch, torch.nn as nn

    class Masked(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3):
            super().__init__(params, dict(lr=lr))
        @torch.no_grad()
        def step(self):
            for g in self.param_groups:
                for p in g["params"]:
                    st = self.state[p]
                    if "lr_mask" not in st: st["lr_mask"] = torch.full_like(p, g["lr"])
                    p.add_(-st["lr_mask"] * p.grad.sign())
        def state_dict(self):
            sd = super().state_dict(); sd["lr_masks"] = [self.state[p]["lr_mask"] for p in self.param_groups[0]["params"]]
            return sd
        def load_state_dict(self, sd):
            masks = sd.pop("lr_masks"); super().load_state_dict(sd)
            for p, m in zip(self.param_groups[0]["params"], masks):
                self.state[p]["lr_mask"] = m.clone()  # not moved to p.device

    def step(m, opt):
        opt.zero_grad(); m(torch.randn(4, 8, device="cuda:0")).square().mean().backward(); opt.step()

    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)).to("cuda:0")
    opt = Masked(m.parameters()); step(m, opt)
    buf = io.BytesIO(); torch.save(opt.state_dict(), buf); buf.seek(0)
    opt2 = Masked(m.parameters()); opt2.load_state_dict(torch.load(buf, map_location="cpu"))  # a resumed run
    step(m, opt2)
"""


def test_the_fix_block_says_each_line_once(tmp_path: Path) -> None:
    """A resumed optimizer whose four state tensors were loaded on cpu (wochenlong/lora-scripts-next#320's
    mechanism) gets each fix line once, never one identical `# pass the tensors made on cpu as tensor.to('cuda:0')`
    per tensor (hunt U12: four)."""
    script = write(tmp_path / "app.py", RESUMED)
    proc = run("--color", "never", "--device", "cuda:0", str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    summary = proc.stderr[proc.stderr.index("torchdoctor run:"):]
    block = summary[summary.index("\nFix"):].splitlines()[1:]
    code = [line for line in block if line.startswith("    ") and line.strip()]
    assert code and len(code) == len(set(code)), summary

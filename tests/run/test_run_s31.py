"""Whole programs from the thirty-first session.

- A float32 projector's output handed to a bfloat16 LM inline (``lm(inputs_embeds=projector(torch.randn(...)))``,
  no local between them): the program's line names no tensor to cast, so the fix fell back to casting the LM's
  ``o_proj`` weights to float32 (undoing the program's own ``.to(device, torch.bfloat16)``) beside an unproven
  projector cast. The call's output is cast where it is handed over now, proven, and no model weight is cast out of
  the dtype the program chose for it.
- A diffusers scheduler's timesteps left on the cpu (``set_timesteps(5)`` with no ``device=``), iterated and handed
  to a model whose ``nn.Embedding`` reads them: the fix was a comment, ``# pass input 1 (t) as tensor.to('cuda:0')``.
  It is the program's call now, ``model(x, t.to(device))``, a proven patch that says where ``t`` came from.
- The classic ``x.to(device)`` on a line of its own (``Tensor.to`` returns a new tensor): the fix went to the factory
  (``torch.randn(..., device=device)``) and left the dead line. The fix is that line assigned now, ``x =
  x.to(device)``, for moves and casts (``feats.half()``) alike.
- An upcast attention (``(q.float() @ k.float().transpose(-1, -2))``) whose float32 probabilities meet bfloat16
  ``v``: the patch rewrote one of the line's two casts (``q.to(torch.bfloat16) @ k.float()``) and the patched
  program failed a line earlier. The fix keeps the island and casts its result back where it meets ``v``.
- A text encoder's outputs cached on the cpu (sd-scripts' cache) and handed twice to one call (``unet(latents,
  enc[None], enc[None])``): the patch moved the key only, and the patched program failed on the value. Both are
  moved in one patch now.
- ``out.pin_memory()`` of a tensor on the GPU raises on a real GPU ("cannot pin 'CUDAFloatType' only dense CPU
  tensors can be pinned") and passed silently under ``run``: it raises there too now, and is named.
- A router kept in float32 with ``torch.autocast(..., enabled=False)`` inside a bfloat16 autocast region, fed the
  region's bfloat16 output: the fix was a note about "a cache or state filled before" the cast. It is the block's
  input cast where the block reads it now (``self.router(h.float())``), proven, the island kept.
- ``nn.DataParallel(net, device_ids=[0, 1])`` with ``net`` left on the cpu: the culprit was the input (on cuda:0,
  where it must be) and the fix moved it to the cpu, printed though its own re-run failed. The error says where the
  parameters must be (``device_ids[0]``); they are the culprits now and the fix moves them there, proven.
- A layer attached after accelerate's ``cpu_offload`` has no hook: the fix was "keep the hooks and give them cuda:0",
  which they already had. The layer is moved as any module now, proven.
- An optimizer stepped once on the cpu (a warm-up) before ``model.to(device)``: the fix said the state "stays where it
  was loaded" (nothing loads it) and had no patch. It names the step and reloads the state after the move
  (``opt.load_state_dict(opt.state_dict())``, which puts each state tensor on its parameter's device), a patch.
- ``torch._scaled_mm`` in float8 on an A100 profile: the advice said the GPU "cannot hold" float8 and to cast before
  the move. An A100 holds float8; it has no float8 matmul kernel (capability 8.9+). The advice says so now.
- A decoder's upsample done in float32 on purpose (``h = F.interpolate(h.float(), ...)``) then a bfloat16 conv: the
  patch rewrote the cast to bfloat16, removing the precision the line is for. The line's value is cast back to
  ``h``'s dtype now (``....to(h.dtype)``), proven at the conv.
- Float ids into an ``nn.Embedding``: beside the raised error's proven fix (``emb(ids.long())``) the report printed
  "# no fix found" for the op the virtual run recorded. A raised error's proven fix covers it now.
- An embedding table kept on the cpu inside the model, its output moved by the very line that calls it
  (``self.table(ids).to(device)``), given ids on the device: the fix moved the table to the device (undoing the
  program's choice). The line's own move says the table computes where it is: the ids are moved to it there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from run.test_run_cli import run, write
from run.test_run_hunt26 import _applied_clean, _report

PROJECTOR_INLINE = """
    import torch
    import torch.nn as nn
    from transformers import LlamaConfig, LlamaForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    lm = LlamaForCausalLM(cfg).to(device, torch.bfloat16)
    projector = nn.Linear(24, 32).to(device)
    with torch.no_grad():
        out = lm(inputs_embeds=projector(torch.randn(1, 6, 24, device=device)))
    print(tuple(out.logits.shape))
"""


def test_a_projector_called_inline_has_its_output_cast_where_the_lm_is_handed_it(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    write(tmp_path / "app.py", PROJECTOR_INLINE)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith("out = lm(inputs_embeds=projector(torch.randn(1, 6, 24, device=device))"
                                  ".to(lm.dtype))  # at app.py:12: LlamaForCausalLM computes in bfloat16 on purpose"), \
        fix["code"]
    assert "projector(...) (float32) is made for another component" in fix["code"], fix["code"]
    assert fix["proven"], fix["tried"]
    assert "float32)" not in "".join(f["code"].split("#")[0] for f in report["fixes"])  # no weight cast to float32
    _applied_clean(tmp_path, report)


SCHEDULER_TIMESTEPS = """
    import torch
    import torch.nn as nn
    from diffusers import DDPMScheduler

    device = "cuda" if torch.cuda.is_available() else "cpu"

    class Denoiser(nn.Module):
        def __init__(self):
            super().__init__()
            self.temb = nn.Embedding(1000, 8)
            self.net = nn.Linear(8, 8)

        def forward(self, x, t):
            return self.net(x + self.temb(t))

    model = Denoiser().to(device)
    sched = DDPMScheduler(num_train_timesteps=1000)
    sched.set_timesteps(5)
    x = torch.randn(2, 8, device=device)
    with torch.no_grad():
        for t in sched.timesteps:
            eps = model(x, t)
            x = sched.step(eps, t, x).prev_sample
    print(tuple(x.shape))
"""


def test_a_scheduler_timestep_left_on_the_cpu_is_moved_where_the_program_hands_it_to_the_model(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    write(tmp_path / "app.py", SCHEDULER_TIMESTEPS)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"] == ("# input 1 (t): on the cpu, taken from sched.timesteps at app.py:22 and handed to model at "
                           "app.py:23 as it is: move it there (t.to(device))"), fix["code"]
    assert fix["proven"], fix["tried"]
    assert "-        eps = model(x, t)\n+        eps = model(x, t.to(device))" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


DROPPED_MOVE = """
    import torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 1))
    model.to(device)
    x = torch.randn(5, 10)
    x.to(device)  # meant to move x
    print(tuple(model(x).shape))
"""

DROPPED_CAST = """
    import torch
    import torch.nn as nn


    def main(device):
        model = nn.Linear(8, 4).to(device).half()
        feats = torch.randn(3, 8, device=device)
        feats.half()
        return model(feats)


    print(tuple(main("cuda" if torch.cuda.is_available() else "cpu").shape))
"""


@pytest.mark.parametrize(("source", "line", "fixed"), [(DROPPED_MOVE, 7, "x = x.to(device)"),
                                                       (DROPPED_CAST, 9, "feats = feats.half()")])
def test_a_move_whose_result_the_program_drops_is_fixed_at_that_line(tmp_path: Path, source: str, line: int,
                                                                    fixed: str) -> None:
    write(tmp_path / "app.py", source)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    name, _, call = fixed.partition(" = ")
    assert fix["code"].startswith(f"{fixed}  # app.py:{line}: Tensor.{call.split('.')[1].split('(')[0]} returns a new "
                                  f"tensor and never changes {name} in place"), fix["code"]
    assert fix["proven"], fix["tried"]
    assert f"+{' ' * (4 if 'feats' in name else 0)}{fixed}" in report["patch"], report["patch"]
    assert not [x for x in report["patch"].splitlines() if x.startswith(("+", "-")) and "randn" in x], report["patch"]
    _applied_clean(tmp_path, report)


UPCAST_ATTENTION = """
    import torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"

    class Attn(nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)
            self.o = nn.Linear(d, d)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, -1)
            scores = (q.float() @ k.float().transpose(-1, -2)) / q.shape[-1] ** 0.5
            probs = scores.softmax(-1)
            return self.o(probs @ v)

    m = Attn().to(device, torch.bfloat16)
    print(tuple(m(torch.randn(2, 5, 16, device=device, dtype=torch.bfloat16)).shape))
"""


def test_an_upcast_island_is_kept_and_its_result_cast_back_where_it_meets_the_data(tmp_path: Path) -> None:
    write(tmp_path / "app.py", UPCAST_ATTENTION)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith("return self.o(probs.to(v.dtype) @ v)  # app.py:15: probs is float32 from "
                                  "app.py:13, which casts both operands up on purpose"), fix["code"]
    assert fix["proven"], fix["tried"]
    assert "q.float() @ k.float()" not in "".join(x for x in report["patch"].splitlines() if x.startswith("+"))
    _applied_clean(tmp_path, report)


CACHED_TWICE = """
    import torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    text_encoder = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 16)).to(device)
    unet = nn.MultiheadAttention(16, 2, batch_first=True).to(device)
    captions = [torch.randint(0, 100, (7,)) for _ in range(2)]
    cache = []
    with torch.no_grad():
        for ids in captions:
            cache.append(text_encoder(ids.to(device)).to("cpu"))
    for enc in cache:
        latents = torch.randn(1, 9, 16, device=device)
        out, _ = unet(latents, enc[None], enc[None])
    print(tuple(out.shape))
"""


def test_one_parked_tensor_handed_twice_to_a_call_is_moved_in_both_places(tmp_path: Path) -> None:
    write(tmp_path / "app.py", CACHED_TWICE)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith("# input 1 (key), input 2 (value): parked on the cpu by the program"), fix["code"]
    assert fix["proven"], fix["tried"]
    assert "+    out, _ = unet(latents, enc[None].to(device), enc[None].to(device))" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


PINNED_ON_DEVICE = """
    import torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(8, 8).to(device)
    with torch.no_grad():
        out = model(torch.randn(4, 8, device=device))
    staged = out.pin_memory() if torch.cuda.is_available() else out
    print(float(staged.sum()))
"""


def test_pinning_a_tensor_already_on_the_device_fails_as_on_a_gpu_and_is_named(tmp_path: Path) -> None:
    write(tmp_path / "app.py", PINNED_ON_DEVICE)
    proc = run("--device", "cuda:0", "app.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "RuntimeError: cannot pin 'CUDAFloatType' only dense CPU tensors can be pinned" in proc.stderr + proc.stdout
    said = proc.stdout + proc.stderr
    assert "pin_memory() was called on a tensor that is not on the CPU" in said, said
    assert "raised at app.py:7" in said, said


AUTOCAST_OFF = """
    import torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(16, 16)
            self.router = nn.Linear(16, 4)

        def forward(self, x):
            h = self.body(x)
            with torch.autocast(device_type=h.device.type, enabled=False):
                logits = self.router(h)
            return logits.softmax(-1)

    m = Head().to(device)
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
        out = m(torch.randn(4, 16, device=device))
    print(out.dtype)
"""


def test_a_block_run_with_autocast_off_gets_its_input_cast_where_it_reads_it(tmp_path: Path) -> None:
    write(tmp_path / "app.py", AUTOCAST_OFF)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith("logits = self.router(h.float())  # app.py:14: autocast is off in this block "
                                  "(app.py:13), so it computes in float32 while h comes bfloat16"), fix["code"]
    assert fix["proven"], fix["tried"]
    _applied_clean(tmp_path, report)


DATA_PARALLEL_ON_CPU = """
    import torch, torch.nn as nn
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    if torch.cuda.device_count() > 1:
        net = nn.DataParallel(net, device_ids=[0, 1])
        dev = "cuda:0"
    else:
        dev = "cpu"
    x = torch.randn(6, 8, device=dev)
    print(tuple(net(x).shape))
"""


def test_a_data_parallel_model_left_on_the_cpu_is_the_culprit_not_its_input(tmp_path: Path) -> None:
    write(tmp_path / "app.py", DATA_PARALLEL_ON_CPU)
    proc = run("--device", "cuda:0", "--count", "2", "app.py", cwd=tmp_path)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1, said
    assert "culprit module.0.weight: f32[16,8]@cpu  (expected cuda:0)" in said, said
    assert "culprit input 0" not in said and "tensor.to('cpu')" not in said, said
    assert "net.module[0].weight.data = net.module[0].weight.data.to(dev)" in said, said
    assert "fix proven" in said, said


ATTACHED_AFTER_OFFLOAD = """
    import torch, torch.nn as nn
    from accelerate import cpu_offload
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")

    class Denoiser(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(8, 16)
            self.out = nn.Linear(16, 8)
            self.adapter = None

        def forward(self, x):
            h = torch.relu(self.inp(x))
            if self.adapter is not None:
                h = h + self.adapter(h)
            return self.out(h)

    model = Denoiser()
    if device.type == "cuda":
        cpu_offload(model, execution_device=device)
    model.adapter = nn.Linear(16, 16)
    print(tuple(model(torch.randn(2, 8, device=device)).shape))
"""


def test_a_layer_attached_after_cpu_offload_is_moved_not_left_to_hooks_it_does_not_have(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    write(tmp_path / "app.py", ATTACHED_AFTER_OFFLOAD)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith("torchdoctor.move(model.adapter, device)"), fix["code"]
    assert "give them" not in fix["code"] and fix["proven"], fix


STEPPED_BEFORE_MOVE = """
    import torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 8)).sum().backward(); opt.step(); opt.zero_grad()
    model.to(device)
    for step in range(2):
        loss = model(torch.randn(4, 8, device=device)).pow(2).mean()
        loss.backward()
        opt.step(); opt.zero_grad()
    print(float(loss))
"""


def test_an_optimizer_stepped_before_the_move_has_its_state_reloaded_after_it(tmp_path: Path) -> None:
    write(tmp_path / "app.py", STEPPED_BEFORE_MOVE)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith("# opt.step() at line 6 made the state on cpu before model.to(device) at line 7"), \
        fix["code"]
    assert "stays where it was loaded" not in fix["code"] and fix["proven"], fix
    assert " model.to(device)\n+opt.load_state_dict(opt.state_dict())" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


SCALED_MM = """
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(16, 32, device=device)
    w = torch.randn(64, 32, device=device)
    sx, sw = x.abs().max() / 448, w.abs().max() / 448
    x8 = (x / sx).to(torch.float8_e4m3fn)
    w8 = (w / sw).to(torch.float8_e4m3fn)
    y = torch._scaled_mm(x8, w8.t(), scale_a=sx.float(), scale_b=sw.float(), out_dtype=torch.bfloat16)
    print(tuple(y.shape))
"""


def test_a_float8_matmul_on_a_gpu_without_its_kernel_says_it_holds_float8_but_cannot_compute_it(tmp_path: Path) -> None:
    write(tmp_path / "app.py", SCALED_MM)
    report = _report(run("--device", "cuda:0", "--profile", "a100", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith("# cuda:0 (capability 8.0) holds float8_e4m3fn tensors but has no float8_e4m3fn "
                                  "kernel for scaled_mm"), fix["code"]
    assert "get_device_capability() >= (8, 9)" in fix["code"] and "cannot hold" not in fix["code"], fix["code"]
    quiet = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))  # an H100 has the kernel
    assert quiet["ok"], quiet["problems"]


UPSAMPLE_IN_FLOAT32 = """
    import torch, torch.nn as nn, torch.nn.functional as F
    device = "cuda" if torch.cuda.is_available() else "cpu"

    class Upsample(nn.Module):
        def __init__(self, ch):
            super().__init__()
            self.conv = nn.Conv2d(ch, ch, 3, padding=1)

        def forward(self, h):
            h = F.interpolate(h.float(), scale_factor=2.0, mode="nearest")
            return self.conv(h)

    dec = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), Upsample(8), nn.Conv2d(8, 3, 3, padding=1))
    dec = dec.to(device, torch.bfloat16)
    with torch.no_grad():
        img = dec(torch.randn(1, 4, 8, 8, device=device, dtype=torch.bfloat16))
    print(tuple(img.shape))
"""


def test_a_call_computed_in_float32_on_purpose_has_its_value_cast_back_at_its_line(tmp_path: Path) -> None:
    write(tmp_path / "app.py", UPSAMPLE_IN_FLOAT32)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith('h = F.interpolate(h.float(), scale_factor=2.0, mode="nearest").to(h.dtype)  # '
                                  "app.py:11: h.float() computes F.interpolate in float32 on purpose"), fix["code"]
    assert fix["proven"], fix["tried"]
    _applied_clean(tmp_path, report)


FLOAT_IDS = """
    import torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    emb = nn.Embedding(100, 8).to(device)
    ids = torch.randint(0, 100, (2, 6), device=device)
    keep = torch.rand(2, 6, device=device) > 0.2
    ids = ids * keep.float()
    print(tuple(emb(ids).shape))
"""


def test_a_raised_error_s_proven_fix_is_never_printed_beside_no_fix_found(tmp_path: Path) -> None:
    write(tmp_path / "app.py", FLOAT_IDS)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    codes = [f["code"] for f in report["fixes"]]
    assert not [c for c in codes if c.startswith("# no fix found")], codes
    assert any(c.startswith("print(tuple(emb(ids.long()).shape))") and f["proven"]
               for c, f in zip(codes, report["fixes"])), report["fixes"]


TABLE_KEPT_ON_CPU = """
    import torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"

    class Recommender(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(5000, 16)
            self.mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

        def place(self, device):
            self.mlp.to(device)
            return self

        def forward(self, ids):
            rows = self.table(ids).to(device)
            return self.mlp(rows.mean(1))

    rec = Recommender().place(device)
    ids = torch.randint(0, 5000, (4, 10), device=device)
    print(tuple(rec(ids).shape))
"""


def test_a_layer_whose_output_the_line_moves_keeps_its_place_and_gets_its_input_moved(tmp_path: Path) -> None:
    write(tmp_path / "app.py", TABLE_KEPT_ON_CPU)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith("rows = self.table(ids.to(next(self.table.parameters()).device)).to(device)  # "
                                  "app.py:16: the line moves self.table's output to device as it returns"), fix["code"]
    assert fix["proven"], fix["tried"]
    assert "table.weight.data" not in fix["code"]
    _applied_clean(tmp_path, report)
    write(tmp_path / "app.py", TABLE_KEPT_ON_CPU.replace("self.table(ids)", "self.table(ids.cpu())"))
    assert _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))["ok"]  # the right program: quiet

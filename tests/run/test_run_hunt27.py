"""Whole programs from the twenty-seventh session's hunt, each a mechanism the virtual run or its fix had wrong.

- A trainer that reloads a cpu checkpoint mid-run with ``model.load_state_dict(sd, assign=True)``: torch puts the
  checkpoint's cpu tensors in place of the model's parameters, and the optimizer built before keeps the old ones. A
  move of the model after the load would run without a crash while the optimizer steps tensors the forward no
  longer reads; the fix is that line without ``assign=True`` (a diff, proven), and applied, the run is clean. A
  model built on meta and loaded with ``assign=True`` (how such a model gets its weights) keeps its own fix.
- A module the program builds and places on the cpu in one line on purpose (InvokeAI's "run the text encoder on the
  cpu" toggle: ``te = Encoder().to(device)`` with ``device`` the cpu; a tiled VAE forced to the cpu by a node) and
  then calls with inputs it sent to the GPU: the inputs are moved to the module where the program calls it (with
  the placing line's device name in the same function, else the module's own device), every input the call gives
  on the GPU (a mask its output meets later too), a diff, proven; never a move of the module, which undoes the
  program's choice. A model trained on the device, moved to the cpu to save and used again keeps its move back.
- Two ControlNets loaded in float16 into a float32 pipeline whose latents are made with ``dtype=self.unet.weight.dtype``
  (diffusers#7562): the program chose the latents' dtype there (the unet reads them too), so the ControlNet is the
  odd one and is cast to the program's dtype, proven; never ``dtype=torch.float16`` written over the expression (the
  old patch, after which the unet failed). A factory with the dtype written out keeps its fix at the line.
- ComfyUI's TrainLoraNode: LoRA diff modules built on the cpu after the model was moved, held in a plain list
  (``m.weight_function = [diff]``, which ``Module.to`` never reaches) and trained: the fix is the line that builds
  them, moved to the layer whose sizes it reads (``LoraDiff(m.out_features, m.in_features).to(m.weight.device)``),
  a diff, never ``.data`` lines under an optimizer that holds the parameters.
- A text encoder that cached its device string when built (``self.device = "cpu"``) and is moved to the GPU by the
  pipeline to encode: its method's ``.to(self.device)`` is given the module's own device
  (``.to(next(self.parameters()).device)``), a diff, proven; before, only a comment said so.
- An EMA copy kept on a second GPU and updated with ``torch._foreach_lerp_`` before it ever ran a forward: its
  parameter is named as the program holds it (``ema.0.weight``), never "a tensor made in forward".
- A correct program that moves a Llama and its inputs to the device and calls ``generate`` inside
  ``torch.inference_mode()``: it runs clean (the run itself raised "Cannot set version_counter for inference tensor"
  on the mask's slice), and prints its tokens as on the machine.
- A loss built with class weights the program computed on the cpu (pytorch#122757): the loss is moved where it is
  built with the program's own device pick (``.to(device)``, never ``'cuda:0'``, which crashes the program's cpu
  fallback), and the weights are said to be computed from ``labels_all`` (never "made by torch.randint as
  labels_all": they are another tensor).
- A Llama placed on the program's ``offload_device`` and never loaded before a hand-written sampling loop on the GPU
  (ComfyUI_YuE#30): parked there, not kept there on purpose, so the model is moved where it is used, to the device
  of what it is given (``model.to(input_ids.device)(input_ids=...)``); the same model placed on a device the program
  keeps it on (``lm_device``) has its input moved to it, and the printed fix reads as its patch (``model.device``
  was rewritten to the program's global ``device``, a no-op).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from run.test_run_cli import run, write
from run.test_run_hunt26 import _applied_clean, _report

ASSIGN_MID_RUN = """
    import torch, torch.nn as nn
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train(n):
        for _ in range(n):
            x = torch.randn(4, 8, device=device)
            loss = (model(x) - x).pow(2).mean()
            loss.backward(); opt.step(); opt.zero_grad()

    train(1)
    sd = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(sd, strict=True, assign=True)  # resume
    train(1)
"""

META_ASSIGN = """
    import torch, torch.nn as nn
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    sd = {k: torch.randn(v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(sd, assign=True)
    model(torch.randn(2, 8, device="cuda"))
"""

TE_ON_CPU = """
    import torch, torch.nn as nn

    def gpu():
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.out = nn.Embedding(50, 16), nn.Linear(16, 16)
        def forward(self, input_ids, attention_mask):
            return self.out(self.embed(input_ids)) * attention_mask[..., None]

    def encode(te_on_cpu=True):
        device = torch.device("cpu") if te_on_cpu else gpu()
        te = Encoder().to(device)
        ids = torch.tensor([[3, 4, 5]]).to(gpu())
        mask = torch.ones_like(ids).to(gpu())
        cond = te(ids, mask)
        return cond.to(gpu(), torch.bfloat16)

    print(encode().shape)
"""

TILED_FORCED = """
    import torch, torch.nn as nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
        def forward(self, x):
            return self.conv(x)

    class Tiled:
        def __init__(self, net):
            self.net = net
        def __call__(self, x):
            device = torch.device("cuda")
            out = torch.zeros(1, 4, 8, 8, device=device)
            for i in (0, 4):
                tile = x[:, :, i:i + 4].to(device)
                out[:, :, i:i + 4] = self.net(tile)
            return out

    vae = Encoder().to("cpu")  # a "force VAE device" node
    print(Tiled(vae)(torch.rand(1, 3, 8, 8)).device)
"""

SAVED_THEN_USED = """
    import torch, torch.nn as nn
    model = nn.Linear(4, 4).to("cuda")
    model(torch.randn(2, 4, device="cuda"))
    torch.save(model.cpu().state_dict(), "ck.pt")
    model(torch.randn(2, 4, device="cuda"))
"""

CONTROLNET_FP16 = """
    import torch, torch.nn as nn

    class ControlNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3, padding=1)
        def forward(self, sample):
            return self.conv(sample)

    class Pipe:
        def __init__(self, controlnet):
            self.unet = nn.Conv2d(4, 4, 3, padding=1).to("cuda")
            self.controlnet = controlnet.to("cuda")
        def __call__(self):
            latents = torch.randn(1, 4, 8, 8, device="cuda", dtype=self.unet.weight.dtype)
            res = self.controlnet(latents)
            return self.unet(latents) + res

    pipe = Pipe(nn.Sequential(ControlNet(), ControlNet()).to(torch.float16))
    print(pipe().dtype)
"""

LORA_IN_A_LIST = """
    import torch, torch.nn as nn, torch.nn.functional as F

    class CastLinear(nn.Linear):
        weight_function = []
        def forward(self, x):
            w = self.weight.to(x.device)
            for f in self.weight_function:
                w = f(w)
            return F.linear(x, w, self.bias.to(x.device))

    class LoraDiff(nn.Module):
        def __init__(self, out_f, in_f):
            super().__init__()
            self.up = nn.Parameter(torch.zeros(out_f, 2))
            self.down = nn.Parameter(torch.randn(2, in_f))
        def __call__(self, w):
            return w + self.up @ self.down

    model = nn.Sequential(CastLinear(4, 8), nn.GELU(), CastLinear(8, 4)).requires_grad_(False).to("cuda")
    diffs = []
    for m in model.modules():
        if isinstance(m, CastLinear):
            d = LoraDiff(m.out_features, m.in_features)
            m.weight_function = [d]
            diffs.append(d)
    opt = torch.optim.AdamW([p for d in diffs for p in d.parameters()], lr=1e-3)
    x = torch.randn(2, 4, device="cuda")
    F.mse_loss(model(x), x).backward()
    opt.step()
"""


def test_lora_diffs_held_in_a_list_are_moved_where_they_are_built(tmp_path: Path) -> None:
    write(tmp_path / "app.py", LORA_IN_A_LIST)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    (fix,) = report["fixes"]
    assert fix["proven"] and ".data" not in fix["code"], fix
    assert "+        d = LoraDiff(m.out_features, m.in_features).to(m.weight.device)\n" in report["patch"], report
    _applied_clean(tmp_path, report)

CACHED_DEVICE = """
    import torch, torch.nn as nn

    class TextEncoder(nn.Module):
        def __init__(self, device):
            super().__init__()
            self.device = device
            self.emb = nn.Embedding(20, 8)
        def encode(self, tokens):
            ids = torch.as_tensor(tokens).to(self.device)
            return self.emb(ids)

    te = TextEncoder("cpu")
    te.to("cuda")
    print(te.encode([[1, 2, 3]]).device)
"""


def test_a_stale_cached_device_in_a_module_method_is_its_own_device(tmp_path: Path) -> None:
    write(tmp_path / "app.py", CACHED_DEVICE)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    (fix,) = report["fixes"]
    assert fix["proven"], fix
    assert "+        ids = torch.as_tensor(tokens).to(next(self.parameters()).device)\n" in report["patch"], report
    _applied_clean(tmp_path, report)

EMA_SECOND_GPU = """
    import copy, torch, torch.nn as nn
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4)).to("cuda:0")
    ema = copy.deepcopy(model).to("cuda:1").requires_grad_(False)

    @torch.no_grad()
    def update():
        torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.01)

    model(torch.randn(2, 4, device="cuda:0")).sum().backward()
    update()
"""


def test_an_ema_copy_no_forward_ran_is_named_as_the_program_holds_it(tmp_path: Path) -> None:
    write(tmp_path / "app.py", EMA_SECOND_GPU)
    report = _report(run("--device", "cuda:1", "--json", "app.py", cwd=tmp_path))
    paths = [p["path"] for p in report["problems"]]
    assert paths and all(p.startswith("ema.") for p in paths), report["problems"]
    assert not any("made in forward" in p["message"] for p in report["problems"]), report["problems"]

GENERATE_INFERENCE = """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    model = LlamaForCausalLM(cfg).eval().to(device)
    enc = {"input_ids": torch.tensor([[0, 1, 5, 9]]), "attention_mask": torch.tensor([[0, 1, 1, 1]])}
    enc = {k: v.to(model.device) for k, v in enc.items()}
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=2, do_sample=False)
    print(out[0, :4])
"""


def test_generate_under_inference_mode_runs_clean(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    write(tmp_path / "app.py", GENERATE_INFERENCE)
    proc = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    report = _report(proc)
    assert report["ok"] and report["exit_code"] == 0, (report, proc.stderr[-2000:])
    assert "tensor([0, 1, 5, 9], device='cuda:0')" in proc.stdout, proc.stdout[:500]

LOSS_WEIGHTS = """
    import torch, torch.nn as nn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(8, 3).to(device)
    labels_all = torch.randint(0, 3, (32,))
    counts = torch.bincount(labels_all, minlength=3).float() + 1
    class_weights = counts.sum() / (3 * counts)
    loss_fn = nn.CrossEntropyLoss(weight=class_weights)
    x, y = torch.randn(8, 8).to(device), labels_all[:8].to(device)
    print(float(loss_fn(model(x), y)))
"""


def test_a_loss_built_with_host_weights_is_moved_with_the_programs_device_pick(tmp_path: Path) -> None:
    write(tmp_path / "app.py", LOSS_WEIGHTS)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    (problem,) = report["problems"]
    assert "(computed on the host from `labels_all`, made by torch.randint at app.py:5)" in problem["message"], problem
    assert "+loss_fn = nn.CrossEntropyLoss(weight=class_weights).to(device)\n" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)
    assert subprocess.run([sys.executable, "app.py"], cwd=tmp_path, capture_output=True, timeout=120).returncode == 0

LM_PLACED = """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    {name} = torch.device("cpu")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = LlamaForCausalLM(cfg).eval().to({name})

    def stage(prompt):
        ids = torch.tensor([prompt], device=device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, -1]
        return logits

    print(stage([1, 4, 8]).shape)
"""


@pytest.mark.parametrize("name", ["offload_device", "lm_device"])
def test_a_model_parked_on_the_offload_device_is_loaded_where_it_is_used(tmp_path: Path, name: str) -> None:
    pytest.importorskip("transformers")
    write(tmp_path / "app.py", LM_PLACED.format(name=name))
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    (fix,) = report["fixes"]
    assert fix["proven"], fix
    want = "model.to(ids.device)(input_ids=ids)" if name == "offload_device" else "model(input_ids=ids.to(model.device))"
    assert fix["code"].startswith(f"logits = {want}.logits[:, -1]  # at app.py:13"), fix["code"]
    assert f"+        logits = {want}.logits[:, -1]\n" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


def test_a_component_in_another_dtype_than_the_program_reads_is_cast(tmp_path: Path) -> None:
    write(tmp_path / "app.py", CONTROLNET_FP16)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    (fix,) = report["fixes"]
    assert fix["proven"], fix
    assert fix["code"].startswith("torchdoctor.move(pipe.controlnet, torch.float32)  # torch.randn at app.py:16 makes "
                                  "input 0 (input) in dtype="), fix
    assert "dtype=torch.float16" not in (report.get("patch") or ""), report["patch"]
    write(tmp_path / "app.py", CONTROLNET_FP16.replace("dtype=self.unet.weight.dtype", "dtype=torch.float32"))
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    assert "dtype=torch.float16" in report["patch"], report


def test_a_module_kept_on_the_cpu_by_the_program_gets_its_inputs_moved(tmp_path: Path) -> None:
    write(tmp_path / "app.py", TE_ON_CPU)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    (fix,) = report["fixes"]
    assert fix["proven"], fix
    assert fix["code"].startswith("cond = te(ids.to(device), mask.to(device))  # `te` is kept on cpu by the program "
                                  "(built and placed at app.py:16)"), fix
    assert "+    cond = te(ids.to(device), mask.to(device))\n" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


def test_a_module_forced_to_the_cpu_gets_its_tiles_on_its_own_device(tmp_path: Path) -> None:
    write(tmp_path / "app.py", TILED_FORCED)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    (fix,) = report["fixes"]
    assert fix["proven"] and "vae.to(" not in fix["code"] and "self.net.to(" not in fix["code"], fix
    assert "+            out[:, :, i:i + 4] = self.net(tile.to(next(self.net.parameters()).device))\n" in \
        report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


def test_a_model_moved_to_the_cpu_to_save_is_still_moved_back(tmp_path: Path) -> None:
    write(tmp_path / "app.py", SAVED_THEN_USED)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    assert not any("kept on cpu by the program" in f["code"] for f in report["fixes"]), report["fixes"]
    assert "{k: v.cpu() for k, v in model.state_dict().items()}" in report["patch"], report["patch"]


def test_a_load_with_assign_mid_run_is_fixed_at_its_line(tmp_path: Path) -> None:
    write(tmp_path / "app.py", ASSIGN_MID_RUN)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    fix = next(f for f in report["fixes"] if "assign=True at app.py:15" in f["code"])
    assert fix["proven"] and fix["code"].startswith("model.load_state_dict(sd, strict=True)  # "), fix
    assert "an optimizer built before holds the old ones" in fix["code"]
    assert not any(f["code"].startswith("torchdoctor.move(") for f in report["fixes"]), report["fixes"]
    assert "-model.load_state_dict(sd, strict=True, assign=True)  # resume\n" \
           "+model.load_state_dict(sd, strict=True)  # resume\n" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


def test_a_meta_model_loaded_with_assign_keeps_its_move(tmp_path: Path) -> None:
    write(tmp_path / "app.py", META_ASSIGN)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    assert not report["ok"]
    assert report["fixes"] and not any("assign=True" in f["code"] for f in report["fixes"]), report["fixes"]

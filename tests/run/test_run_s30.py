"""Whole programs from the thirtieth session: a model the program moved away and then used through a method.

- A diffusers ``AutoencoderKL`` offloaded between steps with ``vae.to("cpu")`` and used again with
  ``vae.decode(z)``: the modules that start under ``decode`` are called by the library, so the program's use of the
  model was not seen; the fix was ``torchdoctor.move(model, ...)`` (a name the program does not have) with "move it
  back after that line", and the summary said the tensors "were not moved with the rest of the model". The use is
  now the program's call of the model's method, the fix puts the program's own load (``vae.to(device)``) again
  before it, as a patch that applies and runs clean, and the summary says the whole model is on
  the cpu, with how many of its tensors the use read.
- The same with the program's own class, whose ``decode`` calls ``self.dec``: the fix is at the program's call of
  ``decode``, not inside the class.
- Fixes wrote ``'cuda:0'`` and ``torch.float16`` out in programs that name their device and dtype once (``device =
  "cuda" if torch.cuda.is_available() else "cpu"``): pasted, ``.to('cuda:0')`` breaks the program's own cpu
  fallback. They use the program's names now, in the code and in the patch.
- A layer attached after the model's move and cast got a second, generic "cast them where they are made" note for
  the tensors its move already casts.
- A text encoder kept on the cpu with its ids: the fix moved the encoder where it is built, as a patch whose own
  label said the encoder's first layer would then fail. Its output is moved where it is called now.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from run.test_run_cli import run, write
from run.test_run_hunt26 import _applied_clean, _report

KL_DECODE = """
    import torch
    from diffusers import AutoencoderKL

    device = "cuda"
    vae = AutoencoderKL(block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2)
    vae.to(device)
    img = torch.randn(1, 3, 16, 16, device=device)
    lat = vae.encode(img).latent_dist.sample()
    vae.to("cpu")  # offload between steps
    lat = lat * vae.config.scaling_factor
    out = vae.decode(lat / vae.config.scaling_factor).sample
    print(tuple(out.shape))
"""

OWN_DECODE = """
    import torch, torch.nn as nn

    class VAE(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Conv2d(3, 4, 3, padding=1)
            self.dec = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.SiLU(), nn.Conv2d(8, 3, 3, padding=1))

        def encode(self, x):
            return self.enc(x)

        def decode(self, z):
            return self.dec(z)

    def main(device):
        vae = VAE().to(device)
        lat = vae.encode(torch.randn(1, 3, 16, 16, device=device))
        vae.to("cpu")
        lat = lat * 0.5
        out = vae.decode(lat)
        print(tuple(out.shape))

    main("cuda:0" if torch.cuda.is_available() else "cpu")
"""


def test_a_library_model_moved_away_and_decoded_is_moved_back_at_the_program_s_call(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    write(tmp_path / "app.py", KL_DECODE)
    proc = run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path)
    report = _report(proc)
    codes = [f["code"] for f in report["fixes"]]
    # the program's own load call, put again before the use
    assert codes[0] == ("vae.to(device)  # before app.py:13: `vae` was moved to cpu at app.py:11, and app.py:13 uses it "
                        "again on cuda:0 without moving it back; load it before each use, as app.py:8 did once"), codes
    assert report["fixes"][0]["proven"], report["fixes"][0]["tried"]
    assert not any("torchdoctor.move(model" in c or "move it back after that line" in c for c in codes), codes
    [cause] = report["causes"]
    assert cause["message"].startswith("the AutoencoderKL model is on cpu (all its "), cause
    assert "read here) while the run is on cuda:0: it was left there" in cause["message"], cause
    assert "-out = vae.decode(lat / vae.config.scaling_factor).sample\n+vae.to(device)\n+out = vae.decode(" in \
        report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


def test_a_method_of_the_program_s_own_model_is_fixed_where_the_program_calls_it(tmp_path: Path) -> None:
    write(tmp_path / "app.py", OWN_DECODE)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    codes = [f["code"] for f in report["fixes"]]
    assert codes[0].startswith("out = vae.to(lat.device).decode(lat)  # at app.py:21: `vae` was moved to cpu at "
                               "app.py:19"), codes
    assert report["fixes"][0]["proven"], report["fixes"][0]["tried"]
    assert "-    out = vae.decode(lat)\n+    out = vae.to(lat.device).decode(lat)\n" in report["patch"]
    assert "self.dec.to(" not in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


# a plain tensor attribute (not a buffer): ``Module.to`` leaves it; the program picks its device with a cpu fallback
PLAIN_ATTRIBUTE = """
    import torch
    import torch.nn as nn

    device = "cuda" if torch.cuda.is_available() else "cpu"

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.bias2 = torch.zeros(8)

        def forward(self, x):
            return self.fc(x) + self.bias2

    net = Net().to(device)
    with torch.no_grad():
        print(tuple(net(torch.randn(2, 8, device=device)).shape))
"""

# a head held in a plain list (not a ModuleList): ``model.to`` never reaches it
LIST_HEADS = """
    import torch
    import torch.nn as nn

    device = "cuda" if torch.cuda.is_available() else "cpu"

    class MultiHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Linear(8, 16)
            self.heads = [nn.Linear(16, 2), nn.Linear(16, 3)]

        def forward(self, x):
            h = torch.relu(self.trunk(x))
            return [head(h) for head in self.heads]

    model = MultiHead().to(device)
    with torch.no_grad():
        print([tuple(o.shape) for o in model(torch.randn(4, 8, device=device))])
"""

# the program's dtype by name; a head built after the model's move and never cast
NAMED_DTYPE = """
    import torch
    import torch.nn as nn

    device = "cuda"
    dtype = torch.float16

    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device, dtype)
    head = nn.Linear(4, 2)
    x = torch.randn(2, 8, device=device, dtype=dtype)
    with torch.no_grad():
        y = head(net(x))
    print(tuple(y.shape))
"""

# a layer attached after the model was moved and cast: one cause, one fix (never a second, generic "cast them where
# they are made" note for the same tensors)
ATTACHED_LATE = """
    import torch
    import torch.nn as nn

    device = "cuda"
    dtype = torch.float16

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 16), nn.GELU())
            self.proj = None

        def forward(self, x):
            h = self.body(x)
            return self.proj(h) if self.proj is not None else h

    model = Net().to(device=device, dtype=dtype)
    model.proj = nn.Linear(16, 4)
    x = torch.randn(2, 8, device=device, dtype=dtype)
    with torch.no_grad():
        y = model(x)
    print(tuple(y.shape))
"""

# a text encoder kept on the cpu with its ids: its output is moved where it is called, never the encoder
KEPT_ENCODER = """
    import torch
    import torch.nn as nn

    device = "cuda" if torch.cuda.is_available() else "cpu"

    class TextEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 16)
            self.proj = nn.Linear(16, 16)

        def forward(self, ids):
            return self.proj(self.emb(ids))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(8, 16)
            self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x, ctx):
            return self.attn(self.inp(x), ctx, ctx)[0]

    te = TextEncoder()  # kept on the cpu (low VRAM)
    unet = UNet().to(device)
    ids = torch.randint(0, 100, (1, 5))
    with torch.no_grad():
        emb = te(ids)
        out = unet(torch.randn(1, 4, 8, device=device), emb)
    print(tuple(out.shape))
"""


def _cpu_run(tmp_path: Path) -> None:
    """The program as fixed, run by plain python on this machine: its own cpu fallback still works."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_fix_writes_the_program_s_device_name_not_cuda_0(tmp_path: Path) -> None:
    write(tmp_path / "app.py", PLAIN_ATTRIBUTE)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    codes = [f["code"] for f in report["fixes"]]
    assert codes[0] == "net.bias2.data = net.bias2.data.to(device)", codes
    assert not any("'cuda:0'" in c.split("  #", 1)[0] for c in codes), codes
    app = tmp_path / "app.py"
    app.write_text(app.read_text(encoding="utf-8") + codes[0] + "\nprint(net(torch.randn(2, 8, device=device)).sum())\n",
                   encoding="utf-8")
    _cpu_run(tmp_path)  # pasted as printed: the program's cpu fallback runs


def test_a_list_held_head_is_moved_with_the_program_s_device(tmp_path: Path) -> None:
    write(tmp_path / "app.py", LIST_HEADS)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    codes = [f["code"] for f in report["fixes"]]
    assert codes[0].startswith("torchdoctor.move(model.heads, device)  #"), codes
    assert report["fixes"][0]["proven"], report["fixes"][0]["tried"]
    [cause] = report["causes"]  # (a plain list has no .to: never `heads.to(...)` in the summary either)
    assert "it was not moved (torchdoctor.move(heads, 'cuda:0'))" in cause["message"], cause


def test_a_patch_writes_the_program_s_dtype_name(tmp_path: Path) -> None:
    write(tmp_path / "app.py", NAMED_DTYPE)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    assert "+head = nn.Linear(4, 2).to(device, dtype)\n" in report["patch"], report["patch"]
    assert [f["code"] for f in report["fixes"]][0].startswith("head.to(device, dtype)  # head (Linear, built at app.py:"), \
        report["fixes"]
    _applied_clean(tmp_path, report)


def test_a_layer_attached_after_the_move_is_one_cause_with_one_fix(tmp_path: Path) -> None:
    write(tmp_path / "app.py", ATTACHED_LATE)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    codes = [f["code"] for f in report["fixes"]]
    assert codes == ["torchdoctor.move(model.proj, device, dtype)  # none of its 2 tensors moved: it was left on cpu "
                     "in float32"], codes
    assert report["fixes"][0]["proven"], report["fixes"][0]["tried"]


def test_an_encoder_kept_on_the_cpu_with_its_inputs_has_its_output_moved(tmp_path: Path) -> None:
    write(tmp_path / "app.py", KEPT_ENCODER)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith("emb = te(ids).to(device)  # te and what it is given stay where the program keeps "
                                  "them (moved alone, its "), fix["code"]
    assert "would be given a tensor on cpu, not cuda:0): move what it returns to cuda:0 where it is called" in fix["code"]
    assert fix["proven"], fix["tried"]
    assert "-    emb = te(ids)\n+    emb = te(ids).to(device)\n" in report["patch"], report["patch"]
    assert "TextEncoder().to(" not in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)
    _cpu_run(tmp_path)


# a float32 ControlNet in a bfloat16 pipeline; the program casts the ControlNet's inputs to its dtype by name
CONTROLNET_INPUTS_BY_NAME = """
    import torch
    from diffusers import ControlNetModel, UNet2DConditionModel

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = dict(block_out_channels=(8, 16), layers_per_block=1, in_channels=4, cross_attention_dim=16,
               down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), attention_head_dim=2, norm_num_groups=4)
    unet = UNet2DConditionModel(sample_size=8, out_channels=4, up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), **cfg)
    controlnet = ControlNetModel(conditioning_embedding_out_channels=(4, 8), **cfg)
    unet.to(device, torch.bfloat16)
    controlnet.to(device)
    latents = torch.randn(1, 4, 8, 8, device=device, dtype=torch.bfloat16)
    cond = torch.randn(1, 3, 16, 16, device=device)
    text = torch.randn(1, 3, 16, device=device, dtype=torch.bfloat16)
    t = torch.tensor([10], device=device)
    with torch.no_grad():
        down, mid = controlnet(latents.to(controlnet.dtype), t, encoder_hidden_states=text.to(controlnet.dtype),
                               controlnet_cond=cond.to(controlnet.dtype), return_dict=False)
        out = unet(latents, t, encoder_hidden_states=text, down_block_additional_residuals=down,
                   mid_block_additional_residual=mid).sample
    print(out.dtype)
"""


def test_a_float32_controlnet_is_cast_and_proven_with_no_cast_of_the_integer_timestep(tmp_path: Path) -> None:
    # the ControlNet's inputs are cast to `controlnet.dtype` at the program's line: they follow the cast, so the
    # fix is proven at the ControlNet's layers' entries; the int64 timestep (which the models make float) is never
    # cast to bfloat16 ("pass input 1 (timestep) as tensor.to(torch.bfloat16)" rounds 999 to 1000)
    pytest.importorskip("diffusers")
    write(tmp_path / "app.py", CONTROLNET_INPUTS_BY_NAME)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    fixes = report["fixes"]
    assert [f["code"].split("  #", 1)[0] for f in fixes] == ["controlnet.to(torch.bfloat16)"], fixes
    assert fixes[0]["proven"], fixes[0]["tried"]
    assert not any("timestep" in f["code"] for f in fixes), fixes


# a forward hook that returns its module's output moved to the cpu to collect features
HOOK_RETURNS_MOVED = """
    import torch
    import torch.nn as nn

    DEVICE = "cpu"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)

    def collect(mod, inp, out):
        return out.to(DEVICE)

    model[0].register_forward_hook(collect)
    with torch.no_grad():
        y = model(torch.randn(3, 4, device=device))
    print(tuple(y.shape))
"""


def test_a_forward_hook_that_returns_the_output_moved_away_returns_it_as_it_is(tmp_path: Path) -> None:
    write(tmp_path / "app.py", HOOK_RETURNS_MOVED)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith("return out  # at app.py:10: `collect` is a forward hook, and what it returns "
                                  "replaces the module's output: `out.to(DEVICE)` sent the model's data to cpu"), fix
    assert fix["proven"], fix["tried"]
    assert "-    return out.to(DEVICE)\n+    return out\n" in report["patch"], report["patch"]
    _applied_clean(tmp_path, report)


# a LoRA weight re-initialised on the cpu after the model's move (get_peft_model moved the adapters before that)
LORA_RESET_ON_CPU = """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.to(device)
    model.base_model.model.model.layers[0].self_attn.q_proj.lora_A.default.weight.data = torch.randn(4, 32)
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, 64, (1, 7), device=device))
    print(tuple(out.logits.shape))
"""


def test_a_weight_replaced_after_the_move_never_names_an_earlier_move_as_the_cause(tmp_path: Path) -> None:
    # the adapters' last move (``model.to(device)``) brought them to the device: the line before it that peft's
    # get_peft_model moved them at is no "moved to cpu in place" cause
    pytest.importorskip("peft")
    write(tmp_path / "app.py", LORA_RESET_ON_CPU)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert "in place at app.py:" not in fix["code"] and "move it back after" not in fix["code"], fix["code"]
    assert fix["code"].endswith(".lora_A.default.weight.data.to(device)"), fix["code"]
    assert fix["proven"], fix["tried"]


# a float32 projector's output fed to a bfloat16 LM as inputs_embeds
PROJECTOR_INTO_LM = """
    import torch
    import torch.nn as nn
    from transformers import LlamaConfig, LlamaForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    lm = LlamaForCausalLM(cfg).to(device, torch.bfloat16)
    projector = nn.Linear(24, 32).to(device)
    feats = torch.randn(1, 6, 24, device=device)
    with torch.no_grad():
        embeds = projector(feats)
        out = lm(inputs_embeds=embeds)
    print(tuple(out.logits.shape))
"""


def test_a_float32_projector_into_a_bfloat16_lm_is_one_cause_and_one_fix_at_the_program_s_line(tmp_path: Path) -> None:
    # the layers that met the float32 stream are one cause (was one per layer: 13), and the fixes of transformers'
    # own cache line (`torch.tensor(..., dtype=key_states.dtype)` in cache_utils.py) are never printed beside it
    pytest.importorskip("transformers")
    write(tmp_path / "app.py", PROJECTOR_INTO_LM)
    report = _report(run("--device", "cuda:0", "--json", "app.py", cwd=tmp_path))
    [fix] = report["fixes"]
    assert fix["code"].startswith("out = lm(inputs_embeds=embeds.to(lm.dtype))  # at app.py:14"), fix["code"]
    assert fix["proven"], fix["tried"]
    first = report["causes"][0]["message"]
    assert first.startswith("tensors computed from aten.addmm in `<root>` from bias and weight are float32 while the "
                            "ops compute in bfloat16: one cause, "), first
    assert len(report["causes"]) <= 3, [c["message"] for c in report["causes"]]
    _applied_clean(tmp_path, report)

"""Each fix is proven by what it fixes, where it is made (issue 41 points 1, 2 and 5; hunt N1, N2, N4, S5, S13b):
a module the program holds apart from the model is moved where the program builds it, never by a ``model.<path>``
the model lacks; a cast of the caller's tensor that a later op promotes back is never proven at the failing op; an
argument made by a factory in the user's file is fixed at that call; a component the program appends after its own
cast is fixed when it exists; under ``call=`` a switch of dtype is advice. Every printed fix (a diff of the user's
file, or code) is applied and the program simulated again: it must be quiet."""

from __future__ import annotations

import functools
import importlib.util
import itertools
import textwrap
from pathlib import Path
from types import ModuleType
import torch
from torch import nn

import torchdoctor

BF16 = torch.bfloat16
_COUNT = itertools.count()


def _module(folder: Path, source: str) -> ModuleType:
    """The app as a module of a file of its own (the user's file a diff is written against), not in sys.modules."""
    path = folder / f"h1app{next(_COUNT)}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _apply(folder: Path, mod: ModuleType, diffs: list[str]) -> ModuleType:
    """The app's file with each one-line diff applied, loaded again under a new name."""
    text = Path(str(mod.__file__)).read_text()
    for d in diffs:
        old = [x[1:] for x in d.splitlines() if x.startswith("-") and not x.startswith("---")]
        new = [x[1:] for x in d.splitlines() if x.startswith("+") and not x.startswith("+++")]
        assert len(old) == len(new) == 1 and text.count(old[0]) == 1, d
        text = text.replace(old[0], new[0])
    return _module(folder, text)


CN_APP = """
import torch, torch.nn as nn
class CN(nn.Module):
    def __init__(self):
        super().__init__(); self.enc = nn.Linear(8, 8)
    def forward(self, hint): return self.enc(hint)
class ZImage(nn.Module):
    def __init__(self):
        super().__init__(); self.x_in = nn.Linear(8, 8); self.control_proj = nn.Linear(8, 8)
    def forward(self, x, control): return self.x_in(x) + self.control_proj(control)
class Pipe:
    def __init__(self, transformer): self.transformer = transformer; self._cn = None
    def load_controlnet(self): self._cn = CN()
    def __call__(self, x, hint): return self.transformer(x, control=self._cn(hint))
def app(m):
    pipe = Pipe(m); pipe.transformer.to("cuda:0"); pipe.load_controlnet()
    hint = torch.rand(1, 8)
    return pipe(torch.randn(1, 8, device="cuda:0"), hint)
"""


def test_a_module_held_by_the_pipeline_is_moved_where_it_is_built_never_by_a_model_path(tmp_path: Path) -> None:
    mod = _module(tmp_path, CN_APP)
    report = torchdoctor.simulate(mod.ZImage(), device="cuda:0", call=mod.app)
    text = report.text()
    assert "model.enc" not in text, text  # the model has no `enc`: the CN the pipeline holds has
    first = report.fixes[0]
    assert first.kind == "apart" and first.code.startswith("self._cn.to('cuda:0')  # self._cn (CN, built at "), text
    assert "is held by the program, not by the model: model.to never moves it (enc.bias, enc.weight)" in first.code
    assert first.diff is not None and "+    def load_controlnet(self): self._cn = CN().to('cuda:0')" in first.diff
    assert all(f.proven for f in report.fixes), [(f.code, f.tried) for f in report.fixes]
    fixed = _apply(tmp_path, mod, [f.diff for f in report.fixes if f.diff])
    again = torchdoctor.simulate(fixed.ZImage(), device="cuda:0", call=fixed.app)
    assert again.ok, again.text()


TIMESTEP_APP = """
import math, torch, torch.nn as nn
class K5(nn.Module):
    def __init__(self):
        super().__init__(); self.time_mlp = nn.Linear(8, 8); self.x_in = nn.Linear(8, 8)
    def forward(self, hidden_states, timestep):
        freqs = torch.exp(-math.log(10000) * torch.arange(4, dtype=torch.float32, device=timestep.device) / 4)
        args = timestep[:, None] * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return self.x_in(hidden_states) + self.time_mlp(emb)
def app(m):
    m.to("cuda:0", torch.bfloat16)
    t = torch.tensor([999.0], device="cuda:0")
    return m(hidden_states=torch.randn(1, 8, device="cuda:0", dtype=torch.bfloat16), timestep=t)
"""


def test_a_cast_of_the_caller_s_timestep_that_a_later_op_promotes_back_is_never_proven_alone(tmp_path: Path) -> None:
    mod = _module(tmp_path, TIMESTEP_APP)
    report = torchdoctor.simulate(mod.K5(), device="cuda:0", dtype=BF16, call=mod.app)
    # the timestep alone is no fix (bf16 timestep x fp32 freqs is fp32 again): never printed proven without the
    # maker of the fp32 frequencies beside it, and the two are proven together by a re-run, not at the op
    codes = [f.code for f in report.fixes]
    assert any("torch.arange" in c for c in codes), codes
    assert all(f.proven and f.rerun and not f.at_op for f in report.fixes), [(f.code, f.tried) for f in report.fixes]
    fixed = _apply(tmp_path, mod, [f.diff for f in report.fixes if f.diff])
    again = torchdoctor.simulate(fixed.K5(), device="cuda:0", dtype=BF16, call=fixed.app)
    assert again.ok, again.text()
    # a block (run, the marker) cannot re-run: its fix of the far timestep is unproven, saying why
    with torchdoctor.virtual_devices("cuda:0", dtype=BF16, raise_on_exit=False) as sim:
        mod.app(mod.K5())
    assert sim.problems and not any(f.proven for f in sim.fixes), [(f.code, f.tried) for f in sim.fixes]


def test_the_far_argument_s_cast_is_not_judged_at_the_op() -> None:
    from torchdoctor._virtual.atop import Case, Operand, prove_at_ops
    from torchdoctor._virtual.prove import Fix
    from torchdoctor._rules.profile import DeviceProfile
    from torchdoctor._rules import registry

    x = torch.empty(1, 8, dtype=torch.float32, device="meta")
    w = torch.empty(8, 8, dtype=BF16, device="meta")
    far = Operand(x, ("far kwarg timestep",), False)
    near = Operand(w, ("time_mlp.weight",), True)
    case = Case.__new__(Case)
    case.func, case.op, case.at, case.want = torch.ops.aten.mm.default, "aten.mm.default", None, None
    case.before = case.after = ([far, near], {})
    fix = Fix("# pass kwarg timestep as tensor.to(torch.bfloat16)", "input", BF16, "kwarg timestep",
              sets=(("kwarg timestep", BF16),))
    [out] = prove_at_ops([fix], [case], registry, DeviceProfile.for_device("cuda"))
    assert not out.proven and not out.at_op
    assert out.tried.startswith("it changes kwarg timestep, which reaches the failing op only through other ops")


SIGMA_APP = """
import torch, torch.nn as nn
SCHED = [1.0, 0.75, 0.5, 0.25]
class DiT(nn.Module):
    def __init__(self):
        super().__init__(); self.img_in = nn.Linear(8, 8)
    def forward(self, hidden_states): return self.img_in(hidden_states)
def app(m):
    m.to("cuda:0", torch.bfloat16)
    latents = torch.randn(2, 4, 8, device="cuda:0", dtype=torch.bfloat16)
    sigmas = torch.tensor(SCHED, device="cuda:0")[torch.tensor([1, 2])].view(-1, 1, 1)
    return m((1.0 - sigmas) * latents)
"""


def test_an_argument_promoted_by_a_factory_of_the_caller_is_fixed_at_that_call_with_a_diff(tmp_path: Path) -> None:
    mod = _module(tmp_path, SIGMA_APP)
    report = torchdoctor.simulate(mod.DiT(), device="cuda:0", dtype=BF16, call=mod.app)
    [fix] = report.fixes
    assert fix.code == "# torch.tensor made it in float32: pass dtype= (torch.tensor(..., dtype=torch.bfloat16))"
    assert fix.proven and fix.rerun, fix.tried
    assert fix.diff is not None and \
        "+    sigmas = torch.tensor(SCHED, device=\"cuda:0\", dtype=torch.bfloat16)[torch.tensor([1, 2])]" in fix.diff
    fixed = _apply(tmp_path, mod, [fix.diff])
    assert torchdoctor.simulate(fixed.DiT(), device="cuda:0", dtype=BF16, call=fixed.app).ok


class _Motion(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(h))


class _UNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv_in, self.blocks = nn.Linear(8, 8), nn.ModuleList([nn.Linear(8, 8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for b in self.blocks:
            h = b(h)
        return h


def _inject(m: nn.Module, fix: str | None = None) -> torch.Tensor:
    m.to("cuda:0", torch.float16)
    m.blocks.append(_Motion().to("cuda:0"))  # appended after the cast: it stays float32
    if fix is not None:
        exec(fix, {"model": m, "torch": torch})  # noqa: S102 - the printed fix, as the user pastes it
    return m(torch.randn(2, 8, device="cuda:0", dtype=torch.float16))


def test_a_component_appended_after_the_cast_is_fixed_and_proven_once_it_exists() -> None:
    report = torchdoctor.simulate(_UNet(), device="cuda:0", dtype=torch.float16, call=_inject)
    [fix] = report.fixes
    assert fix.code.startswith("model.blocks[1].to(torch.float16)  # every floating tensor of blocks.1 is float32")
    assert fix.proven and "IndexError" not in fix.tried, fix.tried
    again = torchdoctor.simulate(_UNet(), device="cuda:0", dtype=torch.float16,
                                 call=functools.partial(_inject, fix=fix.code))
    assert again.ok, again.text()


def test_a_path_the_model_never_gets_leaves_the_fix_unproven_saying_what_it_raised() -> None:
    from torchdoctor._virtual.prove import Fix, applied_when_there

    model = _UNet()
    fix = Fix("model.blocks[5].to(torch.float16)", "path")
    try:
        with applied_when_there(model, [fix]):
            model(torch.randn(2, 8))
    except IndexError as exc:
        assert "out of range" in str(exc)
    else:
        raise AssertionError("a fix never applied must raise what it raised")


def _no_bf16(m: nn.Module) -> torch.Tensor:
    m.to("cuda:0", torch.bfloat16)  # the app casts the model itself
    return m(torch.randn(1, 3, 8, 8, device="cuda:0", dtype=torch.bfloat16))


def test_under_call_a_switch_of_dtype_is_advice_at_the_app_s_cast_not_a_model_to() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.GELU(), nn.Conv2d(8, 8, 3))  # a P100 has no bf16 convolution
    report = torchdoctor.simulate(model, device="cuda:0", dtype=BF16, profile="p100", call=_no_bf16)
    [fix] = report.fixes
    assert fix.kind == "note" and not fix.proven and "model.to(" not in fix.code.split("#", 1)[0]
    assert "use torch.float16 instead (m.to(device, torch.float16))" in fix.code
    assert fix.tried == "not re-run: call= casts the model itself, so a cast before it would be undone"


class _CosyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from transformers import Qwen2Config, Qwen2Model

        self.llm = Qwen2Model(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1))
        self.speech_embedding = nn.Embedding(10, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.llm(inputs_embeds=self.speech_embedding(tokens)).last_hidden_state


def _cosy(m: nn.Module, fix: str | None = None) -> torch.Tensor:
    m.llm.to("cuda:0", BF16)
    m.speech_embedding.to("cuda:0")  # the node's own embedding, left in float32
    if fix is not None:
        exec(fix, {"model": m, "torch": torch})  # noqa: S102 - the printed fix, as the user pastes it
    return m(torch.tensor([[1, 2, 3]], device="cuda:0"))


def test_a_library_s_own_upcast_is_never_advised_an_edit_the_component_fix_is_proven() -> None:
    torch.manual_seed(0)
    report = torchdoctor.simulate(_CosyLM(), device="cuda:0", dtype=BF16, call=_cosy)
    text = report.text()
    assert not report.ok and "speech_embedding" in text
    assert not any("modeling_qwen2" in f.code or "site-packages" in f.code for f in report.fixes), text
    code = "\n".join(f.code for f in report.fixes if not f.code.startswith("#"))
    assert code.startswith("model.speech_embedding.") and all(f.proven for f in report.fixes), text
    again = torchdoctor.simulate(_CosyLM(), device="cuda:0", dtype=BF16, call=functools.partial(_cosy, fix=code))
    assert again.ok, again.text()


LOKR_APP = """
import torch, torch.nn as nn, torch.nn.functional as F
class LoKr(nn.Module):
    def __init__(self, org):
        super().__init__(); self.w1 = nn.Parameter(torch.randn(2, 2) * 0.01); self.w2 = nn.Parameter(torch.zeros(4, 4))
        self.org_forward = org.forward; org.forward = self.forward
    def forward(self, x): return self.org_forward(x) + F.linear(x, torch.kron(self.w1, self.w2))
class Block(nn.Module):
    def __init__(self):
        super().__init__(); self.attn = nn.Linear(8, 8); self.mlp = nn.Linear(8, 8)
    def forward(self, x): return self.mlp(torch.relu(self.attn(x)))
def app(m):
    m.to("cuda:0", torch.bfloat16).requires_grad_(False)
    network = nn.ModuleList([LoKr(m.attn), LoKr(m.mlp)]).to("cuda:0")
    opt = torch.optim.AdamW(network.parameters(), lr=1e-4)
    loss = F.mse_loss(m(torch.randn(2, 8, device="cuda:0", dtype=torch.bfloat16)).float(), torch.zeros(2, 8, device="cuda:0"))
    loss.backward(); opt.step()
    return loss
"""


def test_a_network_patched_into_the_forward_is_cast_where_the_program_builds_it(tmp_path: Path) -> None:
    from torchdoctor._virtual.apart import moved, network_fix, patched_into

    mod = _module(tmp_path, LOKR_APP)
    model = mod.Block()
    network = nn.ModuleList([mod.LoKr(model.attn), mod.LoKr(model.mlp)])  # patched into attn's and mlp's forward
    culprits = [(f"{layer}.forward.__self__.{w}", f"{layer}.forward.__self__.{w}", "dtype", BF16)
                for layer in ("attn", "mlp") for w in ("w1", "w2")]
    fix = network_fix(culprits, patched_into(model))
    assert fix is not None and fix.kind == "apart" and fix.label == "LoKr", fix
    assert fix.code.startswith("network.to(torch.bfloat16)  # 4 tensors of the LoKr modules patched into the model's "
                               "forward are held by the program as network (built at "), fix.code
    assert fix.diff is not None and \
        '+    network = nn.ModuleList([LoKr(m.attn), LoKr(m.mlp)]).to("cuda:0", torch.bfloat16)' in fix.diff, fix.diff
    fixed = _apply(tmp_path, mod, [fix.diff])
    assert torchdoctor.simulate(fixed.Block(), device="cuda:0", dtype=BF16, call=fixed.app).ok
    # the re-run's way of applying it: each LoKr the model does not hold is cast as its patched layer starts
    model.to(BF16)  # the model's own .to never reaches the network
    assert {p.dtype for p in network.parameters()} == {torch.float32}
    with moved(model, [fix]):
        model(torch.randn(2, 8, dtype=BF16))
    assert {p.dtype for p in network.parameters()} == {BF16}


NOISE_APP = """
import torch, torch.nn as nn
class UNet(nn.Module):
    def __init__(self):
        super().__init__(); self.norm = nn.GroupNorm(2, 4)
    def forward(self, x): return self.norm(x)
def app(m):
    m.to("cuda:0")
    g = torch.Generator().manual_seed(0)
    latent = torch.zeros(1, 4, 8, 8)
    noise = torch.randn(1, 4, 8, 8, generator=g)
    return m(latent + noise * 14.6)
"""


def test_a_tensor_computed_from_two_factories_is_fixed_where_it_is_passed_not_at_either_factory(
        tmp_path: Path) -> None:
    """``latent + noise * s``: neither factory alone puts the sum on the device (the other operand stays behind: hunt
    T1), so the maker named is the sum at its line and the fix moves what is passed, proven the same in a block (run,
    the marker) as in simulate; applied, the program runs clean."""
    mod = _module(tmp_path, NOISE_APP)
    report = torchdoctor.simulate(mod.UNet(), device="cuda:0", call=mod.app)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as block:
        mod.app(mod.UNet())
    for fixes, text in ((report.fixes, report.text()), (block.fixes, str(block.error()))):
        codes = [f.code for f in fixes]
        assert not any("torch.zeros" in c or "torch.randn" in c for c in codes), codes
        assert "made by Tensor.add at " in text and ".py:12)" in text, text  # the line of the sum
        assert codes == ["# pass input 0 (x) as tensor.to('cuda:0')"] and all(f.proven for f in fixes), codes
    fixed = _module(tmp_path, NOISE_APP.replace("m(latent + noise * 14.6)",
                                                          "m((latent + noise * 14.6).to('cuda:0'))"))
    assert torchdoctor.simulate(fixed.UNet(), device="cuda:0", call=fixed.app).ok

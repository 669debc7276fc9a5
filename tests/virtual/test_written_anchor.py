"""An op that writes one of its operands (in place: ``losses.masked_fill_(mask, 0)``, ``index_put_``,
``masked_scatter_``; an ``out=`` tensor) keeps the written tensor where the program holds it: at a device mismatch
the operand it reads is the odd one out, and the run goes on with the op on the written tensor's device. In a model a
device map splits over two GPUs, a tensor made from the caller's argument (``labels``) meeting one made from the
model's weights (the losses of ``lm_head`` on the last GPU) is the odd one too; the run never carries the loss, its
backward and the gradients to the first GPU (no gradient finding real hardware never reaches), and never moves a
layer the device map's hooks place (``model.lm_head.weight.data = ….to('cuda:0')`` would split ``lm_head`` from the
inputs its hook moves to cuda:1 on every call)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdoctor


def _pairs(sim: object) -> list[tuple[str, str, str]]:
    return [(p.op or "", p.found, p.expected) for p in sim.problems]  # type: ignore[attr-defined]


def test_in_place_ops_and_out_keep_the_written_tensor() -> None:
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        x = torch.zeros(4, device="cuda").cpu()  # the program keeps these on the cpu
        x.index_put_((torch.tensor([0, 1]),), torch.ones(2, device="cuda"))
        y = torch.zeros(4, device="cuda").cpu()
        y.masked_scatter_(torch.tensor([True, False, True, False]), torch.ones(4, device="cuda"))
        out = torch.zeros(4)
        torch.add(torch.ones(4, device="cuda"), 1.0, out=out)
        after = (x + y + out).device  # the program's tensors stay on the cpu: nothing after them moves
    assert _pairs(sim) == [("aten.index_put_.default", "cuda:0", "cpu"),
                           ("aten.masked_scatter_.default", "cuda:0", "cpu"), ("aten.add.out", "cuda:0", "cpu")]
    assert after.type == "cpu"


def test_a_model_tensor_read_into_a_copy_kept_elsewhere_names_the_copy() -> None:
    # an EMA kept on the cpu reading the cuda weights: the model is where it belongs; the problem names the EMA
    # (as the program holds it), and the op still writes into the EMA on the cpu
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        m = nn.Linear(4, 2)
        shadow = [p.detach().clone() for p in m.parameters()]
        m.to("cuda")
        with torch.no_grad():
            for s, p in zip(shadow, m.parameters()):
                s.lerp_(p, 0.1)
        kept = shadow[0].device
    assert {(p.found, p.expected) for p in sim.problems} == {("cpu", "cuda:0")}, sim.problems
    assert kept.type == "cpu"


def _chunked_ce(logits: torch.Tensor, labels: torch.Tensor, chunk: int = 4, **kwargs: object) -> torch.Tensor:
    logits, labels = logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1)
    losses = torch.cat([F.cross_entropy(c.float(), lab.clamp(min=0), reduction="none")
                        for c, lab in zip(logits.split(chunk), labels.to(logits.device).split(chunk))])
    losses.masked_fill_(labels == -100, 0.0)
    return losses.sum() / (labels != -100).sum()


def test_a_split_llama_masks_with_the_callers_labels(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    dm = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1,
          "model.rotary_emb": 1, "lm_head": 1}
    with torchdoctor.virtual_devices("cuda:0", count=2, raise_on_exit=False) as sim:
        model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, device_map=dm)
        model.loss_function = _chunked_ce
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 64, (2, 6), device="cuda:0")
        labels = ids.clone()
        labels[:, :2] = -100
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        where = loss.device
    # both failing ops of the loss, each blaming what the labels made; the loss is made on cuda:1, with lm_head (the
    # root's hook hands it back on the input's device), and no gradient ends up on cuda:0
    assert _pairs(sim) == [("aten.masked_fill_.Scalar", "cuda:0", "cuda:1"), ("aten.div.Tensor", "cuda:0", "cuda:1")]
    assert all("labels (an argument of the LlamaForCausalLM call" in p.message for p in sim.problems), sim.problems
    assert str(where) == "cuda:0" and not any(p.path.endswith(".grad") for p in sim.problems)
    codes = [f.code for f in sim.fixes]
    assert not any("lm_head" in c or c.startswith("torchdoctor.move(") for c in codes), codes
    [inplace] = [f for f in sim.fixes if f.code.startswith("losses.masked_fill_(")]
    assert inplace.code.startswith("losses.masked_fill_((labels == -100).to(losses.device), 0.0)  # ")
    assert "writes into its self on cuda:1" in inplace.code and inplace.diff is not None


class _Head(nn.Module):
    """A model of two parts and its own loss in the forward (the caller's target meets the head's output)."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out = self.head(self.body(x))
        return (out - target).pow(2).mean()


def test_a_model_dispatched_by_hand_meets_the_callers_target() -> None:
    accelerate = pytest.importorskip("accelerate")
    with torchdoctor.virtual_devices("cuda:0", count=2, raise_on_exit=False) as sim:
        model = accelerate.dispatch_model(_Head(), device_map={"body": 0, "head": 1})
        loss = model(torch.randn(2, 4, device="cuda:0"), torch.randn(2, 3, device="cuda:0"))
        loss.backward()
        where = loss.device
    # the root's hook leaves the target on cuda:0 (its execution device); the head's output is on cuda:1
    assert _pairs(sim) == [("aten.sub.Tensor", "cuda:0", "cuda:1")], sim.problems
    assert "target (an argument of the _Head call" in sim.problems[0].message, sim.problems[0].message
    assert str(where) == "cuda:0" and not any(p.path.endswith(".grad") for p in sim.problems)


def test_the_rules_aim_at_the_written_tensor() -> None:
    # what guard's fixer moves (offenders) and where (target): never the written tensor, which would write a copy
    from torchdoctor._rules import registry

    with torchdoctor.virtual_devices("cuda", raise_on_exit=False):
        a, out = torch.ones(2, device="cuda"), torch.empty(2)
        [into] = registry.find(torch.ops.aten.add.out, (a, a), {"out": out})
        [self_kept] = registry.find(torch.ops.aten.add_.Tensor, (out, a), {})
    assert (str(into.target), into.offenders) == ("cpu", ((0, -1), (1, -1))), into
    assert "the out= tensor kwarg out on cpu" in into.problem.message
    assert (str(self_kept.target), self_kept.offenders) == ("cpu", ((1, -1),)), self_kept


def test_foreach_ops_are_checked_index_by_index() -> None:
    # a foreach op's slow path runs ``self[i].lerp_(other[i], w)``: index i of its lists must agree; one list over two
    # GPUs is fine, and ``_foreach_copy_`` copies across devices
    with torchdoctor.virtual_devices("cuda", count=2, raise_on_exit=False) as sim:
        params = [torch.ones(3, device="cuda:0"), torch.ones(3, device="cuda:1")]
        torch._foreach_mul_(params, 0.5)
        torch._foreach_add_(params, [torch.ones(3, device="cuda:0"), torch.ones(3, device="cuda:1")])
        torch._foreach_copy_(params, [torch.zeros(3), torch.zeros(3)])
    assert sim.ok, sim.problems
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        params = list(nn.Linear(3, 2).to("cuda").parameters())
        shadow = [p.detach().cpu() for p in params]  # an EMA's shadow taken to the cpu (a checkpoint's copy)
        torch._foreach_lerp_(shadow, params, 0.1)
        kept = shadow[0].device
    assert [(p.op, p.found, p.expected) for p in sim.problems] == [("aten._foreach_lerp_.Scalar", "cpu", "cuda:0")]
    assert kept.type == "cpu"  # the shadow is written where the program keeps it


def test_diffusers_ema_made_before_the_move_is_moved() -> None:
    training_utils = pytest.importorskip("diffusers.training_utils")
    with torchdoctor.virtual_devices("cuda", raise_on_exit=False) as sim:
        unet = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.SiLU(), nn.Conv2d(8, 4, 3, padding=1))
        ema_unet = training_utils.EMAModel(unet.parameters(), decay=0.999, foreach=True)
        unet.to("cuda")  # the EMA's shadow stays on the cpu: ``ema_unet.to(device)`` is left out
        unet(torch.randn(1, 4, 8, 8, device="cuda")).mean().backward()
        ema_unet.step(unet.parameters())
    assert sim.problems and all(p.path.startswith("ema_unet.shadow_params[") for p in sim.problems), sim.problems
    codes = [f.code for f in sim.fixes]
    assert codes[0].startswith("ema_unet.to('cuda:0')") and not any("unet[" in c for c in codes), codes

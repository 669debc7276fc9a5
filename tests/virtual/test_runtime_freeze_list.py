"""A program that keeps ``Parameter`` objects from before ``model.to(device)`` — a freeze list, a list handed to
``clip_grad_norm_`` — sees on real hardware the very objects the model holds (``Module.to`` keeps them). In a
virtual run ``Module.to`` builds new ones around the twins; what the program does with the old ones reaches the new
ones, so freezing them freezes the model's, as it would on the device (before, training silently updated them)."""

from __future__ import annotations

import torch
from torch import nn

import torchdoctor


def _frozen_then_trained(device: str) -> tuple[bool, int, list[str], nn.Module, list[nn.Parameter]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    frozen = [p for n, p in model.named_parameters() if n.startswith("0.")]  # taken before the move
    model.to(device)
    for p in frozen:
        p.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    before = model[0].weight.detach().cpu().clone()
    model(torch.randn(8, 4, device=device)).sum().backward()
    opt.step()
    kept = torch.equal(before, model[0].weight.detach().cpu())
    return kept, len(opt.param_groups[0]["params"]), [str(p.device) for p in frozen], model, frozen


def test_a_freeze_list_taken_before_the_move_freezes_the_model_as_on_the_cpu() -> None:
    want = _frozen_then_trained("cpu")
    assert want[:2] == (True, 2)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        kept, trained, devices, model, frozen = _frozen_then_trained("cuda")
    assert sim.problems == [], [p.message for p in sim.problems]
    assert (kept, trained) == (True, 2)  # was (False, 4): the frozen layer trained
    assert devices == ["cuda:0", "cuda:0"]  # what the program reads of them is what the model holds
    # the run is over: the program's old objects are plain Parameters again, the model's keep their state
    assert [type(p) for p in frozen] == [nn.Parameter, nn.Parameter]
    assert [p.requires_grad for p in model.parameters()] == [False, False, True, True]


def test_grads_and_in_place_updates_through_a_list_from_before_the_move() -> None:
    def run(device: str) -> list[object]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        held = list(model.parameters())
        model.to(device)
        model(torch.randn(8, 4, device=device)).sum().backward()
        norm = float(torch.nn.utils.clip_grad_norm_(held, 0.5))  # clips the model's grads, not None ones
        after = float(model[0].weight.grad.norm().cpu())
        with torch.no_grad():
            held[1].mul_(0)  # the model's bias
        held[2].requires_grad = False
        return [round(norm, 4), round(after, 4), float(model[0].bias.detach().abs().sum().cpu()),
                model[1].weight.requires_grad]

    want = run("cpu")
    with torchdoctor.virtual_devices("cuda:1", raise_on_exit=False) as sim:
        got = run("cuda:1")
    assert sim.problems == []
    assert got == want
    assert want[2:] == [0.0, False]


def test_a_transformers_model_frozen_by_a_list_from_before_the_move() -> None:
    from transformers import BertConfig, BertModel

    def run(device: str) -> list[bool]:
        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=16, max_position_embeddings=16)
        model = BertModel(cfg)
        embeddings = list(model.embeddings.parameters())
        model.to(device)
        for p in embeddings:
            p.requires_grad = False
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        before = model.embeddings.word_embeddings.weight.detach().cpu().clone()
        ids = torch.randint(0, 32, (2, 6), device=device)
        model(input_ids=ids).last_hidden_state.pow(2).mean().backward()
        opt.step()
        return [torch.equal(before, model.embeddings.word_embeddings.weight.detach().cpu()),
                model.embeddings.word_embeddings.weight.grad is None]

    want = run("cpu")
    assert want == [True, True]
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        got = run("cuda")
    assert sim.problems == []
    assert got == want

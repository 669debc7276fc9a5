"""A layer a device map's hooks place (accelerate's ``AlignDevicesHook`` on each module of a model split over two
GPUs) is never moved by hand in a fix: ``model.lm_head.weight.data = ….to('cuda:0')`` would split ``lm_head`` from
the inputs its hook moves to cuda:1 on every call. A trainer's loss patched into the model that masks cuda:1 losses
with cuda:0 labels (unsloth's chunked cross-entropy under ``device_map``) is fixed at the mask: the labels are the odd
operand, the losses stay where the model's split put them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import torchdoctor


def fast_cross_entropy(logits, labels, chunk=4, **kwargs):  # type: ignore[no-untyped-def]
    logits, labels = logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1)
    losses = torch.cat([F.cross_entropy(c.float(), lab.clamp(min=0), reduction="none")
                        for c, lab in zip(logits.split(chunk), labels.to(logits.device).split(chunk))])
    losses.masked_fill_(labels == -100, 0.0)
    return losses.sum() / (labels != -100).sum()


def test_a_layer_a_device_map_places_is_never_moved_by_hand(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    dm = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1,
          "model.rotary_emb": 1, "lm_head": 1}
    with torchdoctor.virtual_devices("cuda:0", count=2, raise_on_exit=False) as s:
        model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, device_map=dm)
        model.loss_function = fast_cross_entropy
        ids = torch.randint(0, 64, (2, 6), device="cuda:0")
        labels = ids.clone()
        labels[:, :2] = -100
        model(input_ids=ids, labels=labels)
    [masked] = [p for p in s.problems if p.op == "aten.masked_fill_.Scalar"]
    # the mask made from the caller's labels is the odd one out, never the model's side (lm_head's cuda:1 losses)
    assert (masked.found, masked.expected) == ("cuda:0", "cuda:1") and "labels (an argument of the " \
        "LlamaForCausalLM call" in masked.message, masked.message
    assert not any("lm_head" in p.path or ".grad" in p.path for p in s.problems), [p.message for p in s.problems]
    codes = [f.code for f in s.fixes]
    assert not [c for c in codes if "lm_head.weight.data" in c or c.startswith("torchdoctor.move(")], codes
    assert "losses.masked_fill_((labels == -100).to(losses.device), 0.0)" in " ".join(codes), codes

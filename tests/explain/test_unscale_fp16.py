"""``ValueError: Attempting to unscale FP16 gradients.`` (GradScaler on a model trained in float16 itself: hunt T22,
QwenAudio/FunMusic#28, bitsandbytes#945, fairscale#834) is a dtype error with float32 master weights as its fix."""

from __future__ import annotations

import json

from torchdoctor._explain.api import classify, explain

TRACEBACK = '''Traceback (most recent call last):
  File "train.py", line 88, in <module>
    scaler.unscale_(optimizer)
  File "/usr/lib/python3.10/site-packages/torch/amp/grad_scaler.py", line 338, in unscale_
    optimizer_state["found_inf_per_device"] = self._unscale_grads_(
  File "/usr/lib/python3.10/site-packages/torch/amp/grad_scaler.py", line 260, in _unscale_grads_
    raise ValueError("Attempting to unscale FP16 gradients.")
ValueError: Attempting to unscale FP16 gradients.'''


def test_unscale_fp16_gradients_is_explained_in_every_quoting() -> None:
    noisy_log = "epoch 1 step 12 loss 0.41 lr 2e-05\n" * 20_000 + TRACEBACK + "\n"
    for text in (TRACEBACK.splitlines()[-1], TRACEBACK, json.dumps(TRACEBACK), noisy_log):
        found = explain(text)
        assert found and found[0].signature == "dtype.unscale_fp16", found
        top = found[0]
        assert top.category == "dtype_mismatch" and "GradScaler" in top.what_happened
        assert "model = model.float()  # master weights in float32" in top.fixes[0][1]
        assert "torch.autocast(" in top.fixes[0][1] and "bfloat16" in top.fixes[1][0]
        assert top.confirm_with == 'torchdoctor.scan(model, dtype="float32")'
    assert classify("ValueError: Attempting to unscale FP16 gradients.") == "dtype_mismatch"

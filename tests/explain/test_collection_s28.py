"""Issue 41 point 7, session 28: the nineteenth collection's figures (100 real texts of 100 threads, drawn in session 27
from other plain queries and frozen before explain ran on them: ``test_collection_s27b.py`` holds the draw, its rule
and the labels' hash; twelve are no device or dtype error).

Measured once before any change (explain as committed at a7f50ba): 65 of 100 right first, 66 in the top two (65.0 % /
66.0 %); of the 88 device / dtype texts 53 and 54 (60.2 % / 61.4 %); the twelve unrelated quiet; the 13 held out by
hash 8 and 8. After the families of ``_explain/sigs_nineteen.py``: 88 first and 89 in the top two.
"""

from __future__ import annotations

import pathlib

import pytest

from torchdoctor import explain
from support.holdout import (collection as _collection, first as _first, fix_codes as _fixes, quotings as _quotings,
                             ranked as _ranked, right_in_every_quoting as _every)


HERE = pathlib.Path(__file__).parent
# right in the top two only (test_explain.TOP2_OTHER) or not at all (KNOWN_MISSES; the held-out three are measured only)
TOP2 = {"device__vllm_2108.txt"}
KNOWN = {"backend_op__intel-extension-for-pytorch_865.txt", "device__elastic-ai.creator_267.txt",
         "device__pytorch_geometric_9479.txt", "no_accel__pytorch_143996.txt",
         "no_accel__pytorch_157775.txt", "no_accel__pytorch_194576.txt", "no_accel__stable-diffusion-webui_14461.txt",
         "backend_op__intel-extension-for-pytorch_338.txt", "device__pytorch-lightning_17806.txt",
         "unsupported_dtype__FAMBench_40.txt"}


COLLECTION = _collection("19")


def test_nineteenth_collection_accuracy() -> None:
    """After: 88 of 100 right first and 89 in the top two, each in plain, JSON, HTML, quoted-reply, backticks, Windows
    line ends and repr (an unrelated text is right when nothing is said); the eleven left say nothing. Session 29's
    sigs_twenty reads a GPU said not to be found in Chinese: 89 first (FasterLivePortrait#57), ten left."""
    assert len(COLLECTION) == 100
    right = 0
    for path, meta, body in COLLECTION:
        if path.name in KNOWN:
            assert _ranked(body)[:1] != [meta["category"]], path.name  # a new right answer: update the figures
            continue
        _every(path.name, meta["category"], body, TOP2)
        right += path.name not in TOP2
    assert right == 89


# --- camelCase identifiers: found in a long log as in a paste -------------------------------------------------------
@pytest.mark.parametrize(("line", "want"), [
    ("CUDA error at src/nms_kernel.cu:103 code=209(cudaErrorNoKernelImageForDevice) \"cudaGetLastError()\"",
     ("no_accelerator", "no_accel.arch_code")),
    ("torch._inductor.exc.LoweringException: AssertionError: \n  target: aten.cumsum.default\n  args[0]: TensorBox("
     "StorageBox(\n    InputBuffer(name='arg0_1', layout=FixedLayout('mps', torch.float32, size=[4, 8])\n  ))",
     ("backend_op_missing", "backend_op.inductor_mps")),
])
def test_a_camel_case_identifier_is_found_in_a_long_log(line: str, want: tuple[str, str]) -> None:
    noise = "".join(f"step {i}: loss 0.{i:04d} lr 3e-4\n" for i in range(12_000))  # past the exact path
    assert len(noise) > 1 << 18
    assert _first(line) == want
    assert _first(noise + line + "\n" + noise[:4000]) == want


def test_inductor_lowering_off_mps_is_not_read_as_mps() -> None:
    text = ("torch._inductor.exc.LoweringException: NotImplementedError: \n  target: aten.foo.default\n  args[0]: "
            "TensorBox(StorageBox(InputBuffer(name='arg0_1', layout=FixedLayout('cuda:0', torch.float16, size=[4]))))")
    assert _ranked(text) == []


# --- Python's False in a coloured log --------------------------------------------------------------------------------
def test_false_coloured_by_rich_hides_nothing() -> None:
    noise = "".join(f"epoch {i} done\n" for i in range(20_000))
    line = "torch.cuda.is_available() returns \x1b[1;36mFalse\x1b[0m on the cluster node"
    assert _first(line)[0] == "no_accelerator"
    assert _first(noise + line + "\n" + noise[:2000])[0] == "no_accelerator"


# --- the legacy input / weight message cut before its types -----------------------------------------------------------
def test_legacy_input_weight_message_cut_before_its_types() -> None:
    cut = ("  File \"train.py\", line 88, in step\n    out = self.conv(x)\nRuntimeError: Expected tensor for argument #1 "
           "'input' to have the same type as tensor for argument #2 'weight'; but type torch.cuda.Fl")
    assert _first(cut) == ("input_weight_type_mismatch", "input_weight.legacy")
    full = ("RuntimeError: Expected tensor for argument #1 'input' to have the same type as tensor for argument #2 "
            "'weight'; but type torch.FloatTensor does not equal torch.cuda.FloatTensor (while checking arguments for "
            "cudnn_convolution)")
    assert "the input is on cpu, the weight on cuda" in explain(full)[0].what_happened


# --- a low-precision CUTLASS kernel this GPU cannot start ------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "  File \"/opt/ao/float8/float8_ops.py\", line 61, in addmm_float8_unwrapped\n    output = torch._scaled_mm(\n"
    "RuntimeError: cutlass cannot initialize",
    "RuntimeError: cutlass cannot implement",
])
def test_cutlass_cannot_initialize(text: str) -> None:
    for how, quoted in _quotings(text).items():
        assert _first(quoted) == ("unsupported_dtype_on_device", "unsupported.cutlass_init"), how
    assert "fp8" in _fixes(text)


# --- words where the message is missing (weak) -----------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "Loading the released weights on a laptop fails. Passing map_location to torch.load fixed it for me.",
    "load_checkpoint() should use `map_location` so that a GPU checkpoint opens on a CPU-only box",
    "The loader calls torch.load without map_location, so evaluation without a GPU crashes",
])
def test_map_location_named_as_the_fix(text: str) -> None:
    for how, quoted in _quotings(text).items():
        assert _first(quoted) == ("deserialize_device", "partial.map_location_words"), how


def test_map_location_in_code_is_no_advice() -> None:
    text = ("  File \"eval.py\", line 12, in <module>\n    sd = torch.load(path, map_location='cpu')\n"
            "_pickle.UnpicklingError: invalid load key, 'v'.")
    assert _ranked(text) == []


@pytest.mark.parametrize(("text", "want"), [
    ("Inference crashes on a T4: the card does not support FP8, so the float8 checkpoint cannot run",
     ("unsupported_dtype_on_device", "partial.fp8_gpu_words")),
    ("Training on an RTX 3090 (no native FP8) with --fp8 stops at the first step",
     ("unsupported_dtype_on_device", "partial.fp8_gpu_words")),
    ("The tensors are on different GPUs after I set device_map, and the loss step fails",
     ("device_mismatch", "partial.device_words_unmoved")),
    ("After the refactor some tensors are still on CPU while the model runs on cuda:0",
     ("device_mismatch", "partial.device_words_unmoved")),
])
def test_words_without_the_message(text: str, want: tuple[str, str]) -> None:
    for how, quoted in _quotings(text).items():
        assert _first(quoted) == want, how

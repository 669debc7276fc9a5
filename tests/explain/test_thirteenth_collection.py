"""Issue 41 point 7, session 23: the thirteenth collection (50 real pastes from 50 repositories no collection had
used, held out whole) and the families its first run missed, each pinned here on the library's own wording (raised
for real where the CPU can raise it, read from the installed library's source where it cannot) or on other
wordings of the family, in MPS and XPU spellings and in several quotings — never on the held-out text."""

from __future__ import annotations

import html
import json
import pathlib
import re
import traceback

import pytest
import torch

from torchdoctor import explain

from support.holdout import HELD, meta as _meta, ranked as _ranked, first as _first


def _quotings(text: str) -> dict[str, str]:
    return {
        "plain": text,
        "json": json.dumps({"error": text}),  # an app's error answer
        "json in json": json.dumps({"body": json.dumps({"exception_message": text})}),
        "html": "<pre>" + html.escape(text) + "</pre>",  # a web page's source
        "quote": "\n".join("> " + line for line in text.split("\n")),  # a markdown reply
        "backticks": "`" + text + "`",
        "crlf": text.replace("\n", "\r\n"),  # a Windows log
        "repr": repr(text),  # printed from Python
    }


def test_thirteenth_collection_accuracy() -> None:
    """Labelled before explain ran on any of it (labels frozen by hash), each text with its thread's URL, collected in
    two batches, each frozen and run once before any change: 38 of 42 and 4 of 8 first and in the top two (42 of 50,
    84 %; every miss of the first batch was 'nothing recognised'). After the families of sigs_thirteen: 50 of 50."""
    held = [(m, b) for m, b in map(_meta, HELD) if m.get("collection") == "13"]
    assert len(held) >= 50 and len({m["source"].partition("#")[0].lower() for m, _ in held}) >= 50
    assert all(m["url"].startswith("https://github.com/") for m, _ in held)
    ranked = [(m["category"], _ranked(b)) for m, b in held]
    top1 = sum(r[:1] == [c] for c, r in ranked) / len(ranked)
    top2 = sum(c in r[:2] for c, r in ranked) / len(ranked)
    assert top1 >= 0.97 and top2 >= 0.97, (top1, top2)


def test_the_thirteenth_collection_reads_the_same_in_every_quoting() -> None:
    checked, wrong = 0, []
    for meta, body in map(_meta, HELD):
        if meta.get("collection") != "13" or _ranked(body)[:1] != [meta["category"]]:
            continue
        for how, text in _quotings(body).items():
            checked += 1
            if _ranked(text)[:1] != [meta["category"]]:
                wrong.append((meta["source"], how))
    assert checked >= 49 * 8 and not wrong, wrong


# --- FSDP: its own wordings, read from the installed torch (FSDP needs an accelerator to raise them) -----------------
def _fsdp_messages() -> list[str]:
    from torch.distributed import fsdp

    root = pathlib.Path(fsdp.__file__).parent
    source = "".join((root / name).read_text(encoding="utf-8") for name in ("_runtime_utils.py", "_init_utils.py"))
    found = []
    for pieces in re.findall(r"raise RuntimeError\(\s*((?:f?\"[^\"\n]*\"\s*)+)\)", source):
        text = "".join(re.findall(r"f?\"([^\"\n]*)\"", pieces))
        if "has parameters on" in text or "got params on" in text or "CPU and GPU params" in text:
            found.append(text)
    return found


def test_fsdp_wordings_of_the_installed_torch() -> None:
    messages = _fsdp_messages()
    assert len(messages) >= 4 and any("CPU offloading enabled" in m for m in messages)
    fill = {"handle.flat_param.device": "cuda:0", "state.compute_device": "cuda:0", "devices": "{device(type='cpu'), "
            "device(type='cuda', index=0)}"}
    for template in messages:
        text = "RuntimeError: " + re.sub(r"\{([^}]+)\}", lambda m: fill.get(m.group(1), "cuda:0"), template)
        for how, quoted in _quotings(text).items():
            assert _first(quoted) == ("mixed_device_model", "mixed.fsdp_param_device"), (how, quoted)
        for dev in ("mps:0", "xpu:0"):
            assert _first(text.replace("cuda:0", dev))[0] == "mixed_device_model"


def test_fsdp_names_where_the_parameters_are() -> None:
    d = explain("RuntimeError: An FSDP-managed module with parameter CPU offloading enabled has parameters on "
                "xpu:0. Make sure to not move the module from CPU when offloading parameters.")[0]
    assert "xpu:0" in d.what_happened and "CPU offloading" in d.likely_causes[0]
    assert "offload_params=True" in d.text()


# --- torch's autocast refusing bfloat16: raised by torch, its GPU check forced (no CUDA GPU here) -------------------
def test_autocast_bf16_raised_by_torch_comes_before_what_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(RuntimeError) as info:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pass
    assert "does not support bfloat16" in str(info.value)
    paste = "".join(traceback.format_exception(info.value))
    assert _first(paste) == ("unsupported_dtype_on_device", "unsupported.autocast_bf16")
    # the error a workaround then met (input cast to float16, biases still float32) does not take its place
    later = (paste + "\nIf I cast my input to float16 then:\nRuntimeError: Input type (c10::Half) and bias type "
             "(float) should be the same\n")
    assert _first(later)[1] == "unsupported.autocast_bf16"
    assert "compute capability 8.0" in explain(paste)[0].likely_causes[0]


# --- torch.utils.cpp_extension without a CUDA toolkit ---------------------------------------------------------------
def test_cuda_home_raised_by_cpp_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    with pytest.raises(OSError) as info:
        cpp_extension._join_cuda_home("bin", "nvcc")
    paste = "".join(traceback.format_exception(info.value))
    for how, quoted in _quotings(paste).items():
        assert _first(quoted) == ("no_accelerator", "noaccel.cuda_home"), how
    assert "export CUDA_HOME" in explain(paste)[0].text()


# --- sparse tensors on MPS / XPU ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    # PyTorch's message, with the curly quotes a forum or an editor puts in
    "NotImplementedError: Could not run ‘aten::_sparse_coo_tensor_with_dims_and_tensors’ with arguments from the "
    "‘SparseMPS’ backend. This could be because the operator doesn’t exist for this backend",
    "`NotImplementedError: Could not run 'aten::empty.memory_format' with arguments from the 'SparseXPU' backend.`",
    # the message retold: a dispatch key where a dtype would be
    "the conversion fails because `aten::empty.memory_format` is not implemented for `SparseMPS`",
    "aten::_to_dense is not implemented for 'SparseXPU' here",
])
def test_a_sparse_tensor_on_mps_or_xpu(text: str) -> None:
    d = explain(text)[0]
    assert d.category == "backend_op_missing" and "sparse" in d.likely_causes[0].lower(), (d.signature, text)


def test_a_dispatch_key_is_not_read_as_a_dtype() -> None:
    assert _first('RuntimeError: "addmm_impl_cpu_" not implemented for \'Half\'')[1] == "unsupported.kernel"
    assert _first("`aten::add.out` is not implemented for `SparseMPS`")[1] == "backend.sparse_device"


# --- the words of these families when PyTorch's message is missing ---------------------------------------------------
@pytest.mark.parametrize("text, category, signature", [
    ("Unsupported ops on MPS: aten::_linalg_eigh", "backend_op_missing", "partial.op_unsupported_words"),
    ("## op not supported on XPU: aten::_fft_c2c", "backend_op_missing", "partial.op_unsupported_words"),
    ("[MPS] unsupported ops in MPS backend (grid_sampler_3d)", "backend_op_missing", "partial.op_unsupported_words"),
    ("BFloat16 Unsupported on MPS (macOS Sequoia 15.1.1, Intel, AMD)", "unsupported_dtype_on_device",
     "partial.dtype_device_words"),
    ("macOS Sequoia 15.1.1 with MPS and PyTorch (BFloat16 Unsupported)", "unsupported_dtype_on_device",
     "partial.dtype_device_words"),
    ("XPU: unsupported float64 in the rotary embedding on an Arc A770", "unsupported_dtype_on_device",
     "partial.dtype_device_words"),
    ("Attempting to use CUDA on an M2 MacBook Air fails", "no_accelerator", "partial.cuda_on_mac"),
    ("trying to initialize cuda on macOS 14 (apple silicon)", "no_accelerator", "partial.cuda_on_mac"),
    ("CUDA available? False\nTraceback (most recent call last):\n  File \"run.py\", line 3, in <module>\n",
     "no_accelerator", "partial.cuda_reported_false"),
])
def test_words_of_a_family_without_its_message(text: str, category: str, signature: str) -> None:
    for how, quoted in _quotings(text).items():
        assert _first(quoted) == (category, signature), (how, quoted)


@pytest.mark.parametrize("words, message, signature", [
    ("Unsupported ops on MPS", "NotImplementedError: The operator 'aten::_linalg_eigh' is not currently implemented "
     "for the MPS device.", "backend.mps_not_implemented"),
    ("unsupported bfloat16 with MPS", "RuntimeError: Expected all tensors to be on the same device, but found at least "
     "two devices, mps:0 and cpu!", "device.expected_same"),
    ("Is CUDA supported by this system?False", "AssertionError: Torch not compiled with CUDA enabled",
     "no_accel.not_compiled"),
])
def test_words_never_outrank_the_message(words: str, message: str, signature: str) -> None:
    assert _first(words + "\n" + message)[1] == signature


def test_words_of_no_placement_family() -> None:
    for text in ("Is CUDA available: False", "We support MPS now; unsupported ops fall back to the CPU.",
                 "bf16 is unsupported in this exporter", "the MPS backend: 12 ops unsupported"):
        found = explain(text)
        assert not found or found[0].signature not in ("partial.op_unsupported_words", "partial.dtype_device_words",
                                                       "partial.cuda_reported_false"), (text, found[0].signature)


def test_every_anchor_of_these_families_has_a_key() -> None:
    """An anchor without a key (``prefilter.key_of``) is one more search of the whole text for every text."""
    from torchdoctor._explain import catalog, sigs_thirteen
    from torchdoctor._explain.prefilter import key_of

    names = set(re.findall(r'_sig\("([\w.]+)"', pathlib.Path(sigs_thirteen.__file__).read_text(encoding="utf-8")))
    ours = [s for s in catalog.signatures() if s.name in names]
    assert len(ours) == len(names) >= 8
    assert [a for s in ours for a in s.anchors if not key_of(a)] == []

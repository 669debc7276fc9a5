"""Issue 41 point 7, session 26c: the seventeenth collection (120 real pastes from 120 threads, labelled and frozen
before explain ran: Chinese prose, Windows / Conda and notebook pastes, buried and cut messages, errors wrapped by
Lightning, DeepSpeed, ONNX export, Torch-TensorRT and FSDP, sparse and complex tensors, integer targets, torch 0.4-1.x
wordings, and twelve texts that are no device or dtype error at all) and the families its first run missed, each
pinned here on other wordings of the family (other ops, devices, dtypes, libraries), never on a collection text.

Run once before any change, on the explain of the sixteenth collection's change: 100 of 120 right first and in the
top two (83.3 %; the twelve unrelated texts quiet; the held-out 24: 21 and 21). After the change: 117 of 120, in
every quoting below; the three left are ``test_explain.KNOWN_MISSES`` (their only words hold no prefilter key).
"""

from __future__ import annotations

import pathlib

import pytest

from torchdoctor import explain
from support.holdout import frozen_and_split
from support.holdout import (collection as _collection, first as _first, fix_codes as _fixes, quotings as _quotings,
                             ranked as _ranked)


HERE = pathlib.Path(__file__).parent
# sha256 of the collection's sorted "source|category" lines, taken before explain ran on any of its texts
FROZEN = "dd29af14f807f6cca0ee44f5e4eedcc73e056e4cead736a7954f3f025033bcaf"
KNOWN = {"dtype__DeepSpeed_4885.txt", "dtype__pytorch-book_83.txt", "no_accel__rocm-gfx803_2.txt"}


COLLECTION = _collection("17")


def test_labels_frozen_and_split_by_the_fixed_rule() -> None:
    """The labels are those frozen before explain ran; a device or dtype text is held out when the sha256 of its
    source line starts below "33" (the third collection's rule); the texts of no such family live in unrelated/."""
    frozen_and_split(COLLECTION, 120, FROZEN, queried=False)
    assert sum(p.parent.name == "holdout" for p, _, _ in COLLECTION) == 24


def test_seventeenth_collection_accuracy() -> None:
    """117 of 120 right first (an unrelated text is right when nothing is said), each in plain, JSON, HTML,
    quoted-reply, backticks, Windows line ends and repr."""
    for path, meta, body in COLLECTION:
        if path.name in KNOWN:
            continue
        for how, text in _quotings(body).items():
            got = _ranked(text)
            assert (got == [] if meta["category"] == "none" else got[:1] == [meta["category"]]), (path.name, how, got)
    assert sum(_ranked(b) == [] for p, _, b in COLLECTION if p.name in KNOWN) == 3  # still nothing recognised


# --- texts of no device or dtype family: explain must not claim one ----------------------------------------------
@pytest.mark.parametrize("text", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB "
    "of which 1.12 GiB is free.",
    "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x2048 and 1024x10)",
    "RuntimeError: CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported at "
    "some other API call, so the stacktrace below might be incorrect.",
    "RuntimeError: The size of tensor a (77) must match the size of tensor b (154) at non-singleton dimension 1",
])
def test_errors_of_no_device_or_dtype_family_get_no_diagnosis(text: str) -> None:
    for how, quoted in _quotings(text).items():
        assert _ranked(quoted) == [], how


# --- a sparse tensor's indices and values on two devices ----------------------------------------------------------
def test_sparse_indices_and_values_on_two_devices() -> None:
    text = ('  File "gcn.py", line 31, in adj\n    A = torch.sparse_coo_tensor(idx, val, (n, n))\nRuntimeError: '
            "device of indices (1) must match device of values (0)")
    for how, quoted in _quotings(text).items():
        assert _first(quoted) == ("device_mismatch", "device.sparse_parts"), how
    assert "indices on device 1" in explain(text)[0].what_happened
    assert "torch.cuda.device(values.device)" in _fixes(text)


# --- a CUDA-only op's own check of its input -----------------------------------------------------------------------
@pytest.mark.parametrize("text, what", [
    ("RuntimeError: Expected query.is_cuda() to be true, but got false.  (Could this error message be improved?  If "
     "so, please report an enhancement request to PyTorch.)", "query.is_cuda()"),
    ('RuntimeError: r.is_cuda() INTERNAL ASSERT FAILED at "../aten/src/ATen/native/sparse/cuda/SparseCUDATensorMath'
     '.cu":123, please report a bug to PyTorch.', "r.is_cuda()"),
    ("RuntimeError: points must be a CUDA tensor", "points"),
    ("RuntimeError: [Error thrown at core/runtime/execute_engine.cpp:99] Expected input tensors to have device cuda, "
     "found device cpu", "cpu where cuda:0"),
])
def test_a_cuda_only_op_given_a_tensor_elsewhere(text: str, what: str) -> None:
    for how, quoted in _quotings(text).items():
        assert _first(quoted) == ("device_mismatch", "device.is_cuda_check"), how
    assert what in explain(text)[0].what_happened


# --- torch 0.4-1.x wordings ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("RuntimeError: Expected object of type torch.cuda.FloatTensor but found type torch.cuda.DoubleTensor for "
     "argument #2 'weight'", ("dtype_mismatch", "dtype.legacy_type")),
    ("RuntimeError: expected backend CUDA and dtype Half but got backend CUDA and dtype Float",
     ("dtype_mismatch", "dtype.legacy_type")),
    ("RuntimeError: Expected object of type torch.cuda.FloatTensor but found type torch.FloatTensor for argument #2 "
     "'target'", ("device_mismatch", "device.legacy_type")),
    ("RuntimeError: Expected object of type torch.LongTensor but found type torch.cuda.LongTensor for argument #3 "
     "'index'", ("device_mismatch", "device.legacy_type")),
    ("RuntimeError: expected backend CPU and dtype Float but got backend CUDA and dtype Float",
     ("device_mismatch", "device.legacy_type")),
])
def test_legacy_type_wordings_are_filed_by_what_differs(text: str, want: tuple[str, str]) -> None:
    for how, quoted in _quotings(text).items():
        assert _first(quoted) == want, how


def test_embedding_indices_message_retyped_without_quotes() -> None:
    text = ("RuntimeError: expected tensor for argument #1 indices to have scalar type Long; but got torch.IntTensor "
            "instead")
    assert _first(text) == ("dtype_mismatch", "dtype.index_type")
    assert ".long()" in _fixes(text)


# --- FakeTensor, data-parallel wrappers -----------------------------------------------------------------------------
def test_fake_tensor_cross_check_of_devices() -> None:
    text = ("torch._subclasses.fake_tensor.MetadataMismatchError: Devices cuda:0 and cpu are not equal! "
            "(aten.index_put.default)")
    for how, quoted in _quotings(text).items():
        assert _first(quoted) == ("mixed_device_model", "mixed.fake_metadata"), how
    assert "aten.index_put.default" in explain(text)[0].what_happened


@pytest.mark.parametrize("text", [
    "AssertionError: DistributedDataParallel's input module must be on the same type of devices, but input module "
    "parameters locate in {'cuda', 'cpu'}.",
    "AssertionError: Different devices for the bucket and the param, cannot proceed: cuda:1 - cpu",
])
def test_a_data_parallel_wrapper_over_a_model_on_several_devices(text: str) -> None:
    for how, quoted in _quotings(text).items():
        assert _first(quoted) == ("mixed_device_model", "mixed.wrapper_devices"), how
    assert "nn.ModuleList" in _fixes(text)


# --- the build: a device type torch does not know, no CUDA bindings, NCCL's dtypes ---------------------------------
def test_a_device_type_this_torch_does_not_know() -> None:
    text = ("RuntimeError: Expected one of cpu, cuda, ipu, xpu, mkldnn, opengl, opencl, ideep, hip, ve, fpga, ort, "
            "xla, lazy, vulkan, mps, meta, hpu, mtia, privateuseone device type at start of device string: dml")
    for how, quoted in _quotings(text).items():
        assert _first(quoted) == ("no_accelerator", "no_accel.device_string"), how
    fixes = _fixes(text)
    assert "import torch_npu" in fixes and "whl/xpu" not in fixes  # the list of types names no platform


def test_torch_without_cuda_bindings() -> None:
    text = "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'"
    assert _first(text) == ("no_accelerator", "no_accel.torch_c_cuda")
    assert "_cuda_setDevice" in explain(text)[0].what_happened


def test_nccl_refusing_a_dtype() -> None:
    text = "RuntimeError: Input tensor data type is not supported for NCCL process group: Bool"
    for how, quoted in _quotings(text).items():
        assert _first(quoted) == ("unsupported_dtype_on_device", "unsupported.nccl_dtype"), how
    assert "view_as_real" in _fixes(text)


# --- weak: words and frames where the message is missing ------------------------------------------------------------
def test_a_cast_named_in_words_is_weak() -> None:
    text = "Bug: the trainer casts fp32 weights to bf16 before the optimizer step and training crashes"
    assert _first(text) == ("dtype_mismatch", "partial.cast_words")
    assert _first(text + "\nRuntimeError: expected scalar type Float but found BFloat16") == (
        "dtype_mismatch", "dtype.scalar_type")  # quiet where the message is there


def test_a_cuda_deserialization_error_named_in_words() -> None:
    text = "Loading the checkpoint fails with a CUDA deserialization error on my laptop"
    assert _first(text) == ("deserialize_device", "partial.deserialize_words")
    assert 'map_location="cpu"' in _fixes(text)


def test_frames_cut_inside_torch_load_of_a_nested_storage() -> None:
    text = ('Traceback (most recent call last):\n  File "eval.py", line 12, in <module>\n    feats = pickle.load(f)\n'
            '  File "/opt/conda/lib/python3.10/site-packages/torch/storage.py", line 337, in _load_from_bytes\n'
            "    return torch.load(io.BytesIO(b))\n")
    assert _first(text) == ("deserialize_device", "frames.load_from_bytes")


def test_frames_cut_inside_the_dataloader_sampler() -> None:
    text = ('  File "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py", line 673, in _next_data\n'
            "    index = self._next_index()  # may raise StopIteration\n"
            '  File "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py", line 620, in _next_index\n'
            "    return next(self._sampler_iter)\n")
    assert _first(text) == ("device_mismatch", "frames.sampler_generator")
    assert 'generator=torch.Generator(device="cuda")' in _fixes(text)

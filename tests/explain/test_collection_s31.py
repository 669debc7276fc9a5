"""Issue 41 point 7, session 31: the twenty-first collection (61 real texts of 61 threads, labelled and frozen before
explain ran on any of them; seven are no device or dtype error).

How the texts were drawn: the GitHub issue threads the ``search`` tool returns (corpus "issues", twelve results a
query, best first) for this fixed list of queries, in this order, aimed at families and wordings the earlier
collections did not target (torch.compile / AOTInductor / Triton, FSDP2 and optimizer offload, ONNX and TensorRT
export, xformers and SDPA dtypes, MPS float64 and bfloat16, XPU / ROCm / NPU / DirectML, LLM serving, audio, video,
vision, RL and GNN libraries, torch 2.5-2.9-era messages):

  q1 torch.compile dynamo inductor error device cuda cpu tensor 2025; q2 FSDP2 DTensor device mesh error tensors on
  different devices; q3 optimizer state offload cpu exp_avg device error step Expected all tensors; q4 ONNX export
  dtype error float16 bfloat16 not supported; q5 TensorRT export error dtype not supported torch_tensorrt; q6 Triton
  kernel error Pointer argument cannot be accessed from Triton (cpu tensor?); q7 xformers memory_efficient_attention
  dtype error query float32 bfloat16 requirement; q8 Cannot convert a MPS Tensor to float64 dtype as the MPS framework
  doesn't support float64; q9 MPS bfloat16 not supported macOS 13 error; q10 ROCm HIP Expected all tensors to be on
  the same device hip:0 cpu; q11 Intel XPU IPEX oneAPI RuntimeError torch 2.6 xpu error; q12 torch_npu Ascend error
  tensors npu:0 cpu dtype; q13 torch_directml privateuseone error RuntimeError; q14 vLLM error Bfloat16 is only
  supported on GPUs with compute capability of at least 8.0; q15 llama-cpp-python exllamav2 error tensor device cuda
  cpu; q16 whisper RuntimeError dtype Half Float transcribe fp16; q17 bark f5-tts tts error Expected all tensors to
  be on the same device cuda cpu 2025; q18 wan2.1 hunyuan ltx video RuntimeError dtype mismatch float8 bfloat16 2025;
  q19 SAM2 depth anything RuntimeError dtype bfloat16 device mps; q20 ultralytics yolo RuntimeError Expected all
  tensors to be on the same device Input type cuda; q21 stable-baselines3 gymnasium RuntimeError tensors device cuda
  cpu dtype Double Float; q22 torch_geometric dgl RuntimeError device mismatch cuda cpu graph; q23 torch 2.6
  weights_only torch.load error map_location cuda checkpoint 2025; q24 torch.amp autocast error dtype device_type
  unsupported RuntimeError 2025; q25 FSDP mixed precision error dtype bfloat16 float32 flat param must have same dtype;
  q26 scaled_dot_product_attention Expected query, key, and value to have the same dtype error 2025; q27 accelerate
  device_map auto offload meta device error tensors 2025 NotImplementedError Cannot copy out of meta; q28 torch.export
  AOTInductor aoti error device cuda cpu mismatch 2025; q29 Could not run aten with arguments from the CUDA backend
  NotImplementedError 2025 torchvision nms; q30 Blackwell RTX 50 torch 2.7 cu128 error tensors dtype device 2025
  RuntimeError; q31 ROCm RX 9070 gfx1201 pytorch HIP error 2025 RuntimeError; q32 sglang vllm kv cache dtype fp8 error
  not supported RuntimeError 2025. For the texts of no such family: u1 CUDA out of memory Tried to allocate video
  generation 2025; u2 mat1 and mat2 shapes cannot be multiplied error 2025; u3 ImportError cannot import name from
  diffusers 2025 error; u4 CUDA error device-side assert triggered index out of bounds 2025 training; u5 size mismatch
  for copying a param with shape checkpoint error 2025.

The order rule is the twentieth's (``test_collection_s29.py``) with three results a query (two for u1-u5), for the
session's time: for each query in turn, the first three results in rank order are taken, except a thread some
collection already holds (its ``# source:`` or ``# url:`` anywhere in tests/explain), one an earlier query took, a
thread whose excerpt shows no date of 2024-2026, and a text that is no error (a feature request, a pull request that
names no error, a thread whose shown text holds no message and no cause to file it by, an error of a program that
does not run PyTorch, or, for q1-q32, an error of no device or dtype family). q1, q2, q8, q9, q10, q20, q23, q31 and
u5 gave nothing that passed (the MPS float64 / bfloat16, ROCm, YOLO and map_location results were all held already,
the rest undated, feature requests or pull requests without an error). The text is the thread's title, then its
first post and replies as the search shows them (author and date lines left out; a long environment dump or
traceback cut after its first lines). Each file's ``# query:`` line names the query that found it. Labels: the
thread's settled cause, else the error text; the texts of no such family are labelled ``none`` and live in
``unrelated/``.
"""

from __future__ import annotations

from support.holdout import collection as _collection
from support.holdout import frozen_and_split

# sha256 of the collection's sorted "source|category" lines, taken before explain ran on any of its texts
FROZEN = "ab1ea73ce94816fd621f669c08f8c9cdbd781cdcff8b8db46189efbb461dd8f6"

COLLECTION = _collection("21")


def test_labels_frozen_and_split_by_the_fixed_rule() -> None:
    """The labels are those frozen before explain ran; a device or dtype text is held out when the sha256 of its
    source line starts below "33" (the third collection's rule); the texts of no such family live in unrelated/."""
    frozen_and_split(COLLECTION, 61, FROZEN)
    assert sum(p.parent.name == "holdout" for p, _, _ in COLLECTION) == 11

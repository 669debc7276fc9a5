"""Context rules for ``explain`` (data): words in the traceback and facts from the message that rank causes and
categories. A rule with a ``category`` and a weight above 1.0 re-files the error (the signature's own category
weighs 1.0); below 1.0 it offers that category as an alternative. See ``causes.ContextRule``.
"""

from __future__ import annotations

from torchdoctor._explain.causes import ContextRule, register_rule
from torchdoctor._explain.context import MAC

__all__ = ["ACCEL", "BNB", "COMFY", "IPEX", "PEFT", "WEBUI"]


def _rule(name: str, words: tuple[str, ...] = (), flags: tuple[str, ...] = (), applies_to: tuple[str, ...] = (),
          category: str | None = None, unless: tuple[str, ...] = (), weight: float = 1.5, why: str = "",
          **boosts: float) -> None:
    register_rule(ContextRule(name, words, flags, applies_to, category,
                              tuple((k.replace("__", "."), v) for k, v in boosts.items()), unless, weight, why))


_DEV, _DT, _IW = "device_mismatch", "dtype_mismatch", "input_weight_type_mismatch"
_MIX, _Q, _NA = "mixed_device_model", "quantization_device", "no_accelerator"
_BO, _UD, _DS = "backend_op_missing", "unsupported_dtype_on_device", "deserialize_device"
BNB = ("bitsandbytes", "params4bit", "int8params", "quant_state", "linear4bit", "linear8bitlt", "matmul_4bit",
       "dequantize_4bit", "matmul8bitlt", "load_in_4bit", "load_in_8bit", "bnb_4bit", "bnb.nn", ".scb",
       "functional_linear_4bits", "nf4", "qlora", "kbit_training", "detected 4-bit loading", "detected 8-bit loading")
GPTQ = ("auto_gptq", "gptq", "awq", "exllama", "marlin", "quantize_model", "quantkit", "optimum/quanto",
        "hqq", "torchao")
PEFT = ("/peft/", "peft_model", "get_peft_model", "loralayer", "lora_a", "lora_b", "tuners/lora", "peftmodel",
        "from peft", "lora_up", "lora_down", "lora_te_", "enable_lora")
ACCEL = ("accelerate/hooks.py", "_hf_hook", "aligndeviceshook", "dispatch_model", "device_map", "big_modeling",
         "hf_device_map", "new_forward")
IPEX = ("intel_extension_for_pytorch", "torch_ipex", "ipex.optimize", "ipex_llm", "ipex-llm", "bigdl",
        "xpu.optimize", "intel-extension-for-pytorch", "import ipex")
COMFY = ("comfyui", "comfy/", "custom_nodes", "!!! exception during processing", "ksampler", "comfy.")
WEBUI = ("sdnext", "sd.next", "vladmandic", "| sd |", "stable-diffusion-webui", "sd_hijack", "extensions-builtin",
         "webui", "modules/processing.py", "sd_samplers")
VAE = ("vae", "autoencoder_kl", "autoencoderkl", "first_stage_model", "decode_first_stage", "encode_first_stage",
       "taesd", "tiled_decode")
_ONE_GPU = "the model is split over several GPUs"

# Categories: a rule's weight adds to its category's score; the best score is the diagnosis, the rest alternatives.
_rule("meta_device", flags=("meta",), applies_to=(_DEV,), category=_MIX, weight=2.0,
      why="one of the devices is meta: a placeholder without data (offloading, init_empty_weights)",
      md__offload_meta=3.0, md__meta_to=2.5)
_rule("bnb_cpu", BNB, ("cpu_and_accel",), (_DEV,), _Q, why="bitsandbytes frames: a quantized layer's state on "
      "another device", q__bnb_state_cpu=3.0)
_rule("bnb_two_gpus", BNB, ("two_accels",), (_DEV,), _Q, why="bitsandbytes frames in a model split over GPUs",
      q__bnb_multi_gpu=4.0)
_rule("bnb_device", BNB, (), (_DEV,), _Q, why="bitsandbytes frames in the traceback", q__bnb_state_cpu=2.0)
_rule("gptq_device", GPTQ, (), (_DEV,), _Q, why="GPTQ/AWQ quantization frames in the traceback",
      q__gptq_device=3.0)
_rule("quant_config", ("quantization_config", "bitsandbytesconfig", "8bit", "4bit", "int8", "int4"), (), (_DEV,),
      _Q, weight=0.5, why="the log loads a quantized model")
_rule("accelerate_mixed", ACCEL + ("offload",), (), (_DEV,), _MIX, weight=0.6,
      why="accelerate hooks / device_map in the traceback: a model dispatched or offloaded over devices")
# two GPUs alone say nothing of quantization (hunt U9: a plain split read as "quantized" at 0.90 beside 0.95): a
# small nudge; bitsandbytes / GPTQ frames or a quantization config are what make it the reading
_rule("two_gpus_alt", flags=("two_accels",), applies_to=(_DEV,), category=_Q, weight=0.1,
      why="quantized models loaded with device_map='auto' over several GPUs fail this way")
_rule("index_op", ("index_select", "gather", "embedding", "index"), ("cpu_and_accel",), (_DEV,),
      "cpu_gpu_indexing", weight=0.4, why="the failing op indexes a tensor with another tensor")
_rule("aten_backend_absent", flags=("backend_absent",), applies_to=(_BO,), category=_NA, weight=6.0,
      why="the backend is missing from this torch build altogether", na__backend_not_in_build=6.0)
_rule("load_backend", ("torch/serialization.py", "_rebuild_device_tensor", "unpickler.load()", "import_ir_module",
                      "torch.jit.load("), (), (_BO, _NA), _DS,
      weight=7.0, why="torch.load is restoring the tensors: the file holds tensors of a device this process lacks",
      ds__cpu_only_load=6.0)
_rule("extension_cpu_torch", flags=("have_cpu",), applies_to=(_BO,), category=_NA, weight=2.0,
      why="the installed torch is a CPU-only build", na__cpu_build=6.0)
_rule("ipex_op", flags=("op_ipex",), applies_to=(_BO,), bo__ipex_xpu_op_on_cpu=4.0)
_rule("torchvision_op", flags=("op_torchvision",), applies_to=(_BO,), unless=("mps",), bo__torchvision_mismatch=4.0)
_rule("scaled_mm_op", flags=("op_scaled_mm",), applies_to=(_BO,), bo__scaled_mm_cpu=4.0)
_rule("xformers_cpu", ("device=cpu", "device=torch.device('cpu')"), (), (_BO,), bo__xformers_cpu_inputs=4.0)
_rule("xformers_build", ("build with cuda support", "built with cuda support", "operator wasn't built",
                         "xformers can't load"), (), (_BO,), bo__xformers_build=3.5)
_rule("xformers_dtype", ("dtype=torch.float32 (supported", "dtype=torch.bfloat16 (supported"), (), (_BO,), _UD,
      weight=0.6, why="the kernels listed refuse this dtype", ud__kernel_missing=0.5)
_rule("fp8_dtype", flags=("fp8",), applies_to=(_DT, _IW), dt__fp8_storage=4.0)
_rule("bnb_dtype", BNB, (), (_DT, _IW), dt__bnb_compute_dtype=3.0)
_rule("peft_device", PEFT, (), (_DEV, _Q), dev__peft_adapter_device=2.5)
_rule("peft_dtype", PEFT, (), (_DT, _IW), dt__peft_adapter_dtype=3.0)
_rule("peft_meta", PEFT, (), (_MIX,), md__peft_meta=4.0)
_rule("accelerate_two_gpus", ACCEL, ("two_accels",), (_DEV,), dev__two_gpus_device_map=3.0)
_rule("accelerate_cpu", ACCEL, ("cpu_and_accel",), (_DEV,), dev__offloaded_cpu=3.0)
_rule("accelerate_dtype", ACCEL, (), (_DT, _IW), dt__accelerate_hook_dtype=2.5)
_rule("accelerate_meta", ACCEL, (), (_MIX,), md__offload_meta=2.5)
_rule("two_gpus", flags=("two_accels",), applies_to=(_DEV,), dev__two_gpus_device_map=3.0, dev__inputs_not_moved=0.5)
_rule("generator", ("generator",), (), (_DEV,), dev__generator_device=4.0)
_rule("model_offload", ("enable_model_cpu_offload", "model_cpu_offload", "model cpu offload", "cpu_offload_with_hook"),
      (), (_DEV,), dev__offload_outside_hooks=4.0)
_rule("model_offload_meta", ("enable_model_cpu_offload", "model cpu offload"), (), (_MIX,), md__offload_meta=1.0)
_rule("prompt_weighting", ("compel", "lpw_stable_diffusion", "long prompt weighting"), (), (_DEV,),
      dev__offload_outside_hooks=2.5)
_rule("sequential_offload", ("sequential_cpu_offload", "sequential cpu offload"), (), (_MIX,), md__offload_meta=3.0)
_rule("sequential_offload_dev", ("sequential_cpu_offload", "sequential cpu offload"), (), (_DEV,),
      dev__offload_outside_hooks=2.0)
_rule("generate", (".generate(", "generation/utils.py", "greedy_search", "generate("), ("cpu_and_accel",), (_DEV,),
      dev__generate_inputs=2.0)
_rule("ipex_device", IPEX, (), (_DEV,), dev__ipex_partial=3.0)
_rule("xpu_device", flags=("xpu", "cpu_and_accel"), applies_to=(_DEV,), dev__ipex_partial=2.5)
_rule("ipex_backend", IPEX, (), (_BO,), bo__ipex_xpu_op_on_cpu=2.0)
_rule("ipex_mixed", IPEX, (), (_MIX,), md__ipex_optimize_mixed=1.0)
_rule("ipex_not_linked", IPEX, (), (_NA,), na__not_linked=1.0)
_rule("comfy_device", COMFY, (), (_DEV,), unless=("to_numpy",), dev__comfy_custom_node=2.5)
_rule("comfy_dtype", COMFY, (), (_DT, _IW), unless=("fp64",), dt__comfy_node_dtype=3.0)
# float64 is never ComfyUI's compute dtype: the node made that tensor itself (issue 40, point 6)
_rule("comfy_fp64", COMFY, ("fp64",), (_DT, _IW), dt__node_float64=6.0)
_rule("webui_device", WEBUI, (), (_DEV,), unless=("to_numpy",), dev__app_offload=2.5)
_rule("webui_dtype", WEBUI, (), (_DT, _IW), unless=("fp64",), dt__webui_upcast=3.0)
# the same for an extension of a web UI: its float64 tensor is its own (issue 40, point 6)
_rule("webui_fp64", WEBUI + ("extensions/",), ("fp64",), (_DT, _IW), dt__extension_float64=6.0)
_rule("sd_scripts", ("sd-scripts", "train_network.py", "sdxl_train", "train_util.py", "kohya"), (), (_DT, _IW),
      dt__module_partially_cast=1.5)
_rule("diffusers_dtype", ("diffusers/", "unet_2d_condition", "diffusionpipeline", "stablediffusion", "pipelines/"),
      ("float32",), (_DT, _IW), dt__pipeline_latents=3.0)
_rule("vae_dtype", VAE, ("iw_dtype",), (_DT, _IW), dt__vae_dtype=5.0)
_rule("module_to", ("in _apply", "in convert", "self._apply(convert)", "return t.to(", "model.to("), (), (_MIX,),
      md__meta_to=2.0)
_rule("conv_weights_behind", flags=("weights_behind",), applies_to=(_DEV,), dev__module_not_moved=1.0)
_rule("iw_device", flags=("iw_device",), applies_to=(_IW,), iw__model_not_on_device=3.0)
_rule("iw_device_alt", flags=("iw_device",), applies_to=(_IW,), unless=("iw_dtype",), category=_DEV, weight=0.6,
      why="only the devices differ: the plain device-mismatch family")
_rule("iw_dtype", flags=("iw_dtype",), applies_to=(_IW,), dt__input_not_cast=1.0, iw__model_not_on_device=-2.0)
_rule("iw_dtype_alt", flags=("iw_dtype",), applies_to=(_IW,), unless=("iw_device",), category=_DT, weight=0.7,
      why="only the dtypes differ: the plain dtype-mismatch family")
_rule("iw_operand", flags=("iw_operand",), applies_to=(_IW,), category=_DT, weight=1.6,
      why="the layer's weights were cast and its input was not: a float32 (or integer) input met reduced-precision "
      "weights", dt__input_not_cast=4.0)
_rule("operand_cast", flags=("ab_dtypes",), applies_to=(_DT,), dt__operand_cast=2.2)
# the text says which side is the input (``direction``): cast the side that differs, never the input "to the
# model's dtype" when only the layer stayed behind (that cast does nothing in a model of the input's dtype)
# below the causes that frames name (peft, a VAE, ComfyUI ...: 3.0 and more), above the plain operand cast
_rule("layer_odd", flags=("layer_odd",), applies_to=(_IW, _DT), dt__layer_not_cast=2.9, dt__input_not_cast=-20.0,
      dt__operand_cast=-2.0)
_rule("input_odd", flags=("input_odd",), applies_to=(_IW, _DT), dt__input_cast=7.0)
_rule("weight_storage", flags=("weight_storage",), applies_to=(_IW, _DT), unless=("fp8",), category=_DT, weight=1.6,
      why="the layer's weights are in a storage dtype (integer): quantized weights computed with as they are",
      dt__storage_weight=9.0, dt__input_not_cast=-20.0, dt__operand_cast=-20.0)
_rule("weight_storage_fp8", flags=("weight_storage", "fp8"), applies_to=(_IW, _DT), dt__input_not_cast=-20.0,
      dt__operand_cast=-20.0)
_rule("out_cast", flags=("out_cast",), applies_to=(_DT,), dt__out_cast=5.0)
_rule("cpu_half_kernel", flags=("cpu", "half"), applies_to=(_DT,), category=_UD, weight=0.5,
      why="half precision on the CPU lacks many kernels")
_rule("cpu_build", ("+cpu", "cpu-only", "cpu only", "cuda used to build pytorch: none", "is cuda available: false",
                    "cpu版本", "cpu version"), (), (_UD, _NA, _DS), ud__cpu_only_build=3.5, na__cpu_build=2.0,
      ds__gpu_invisible=1.0)
_rule("gpu_present", ("nvidia-smi", "driver version", "geforce", "rtx", "is_available() is true", "available() :true"),
      (), (_NA, _DS), ds__gpu_invisible=2.5, na__cpu_build=1.0)
_rule("mac", MAC, (), (_NA,), unless=("windows", "xpu"), na__mac=3.0,
      na__cpu_build=-2.5)  # a Mac has no CUDA build to install: never "install a CUDA build" there
_rule("xpu_build", flags=("xpu",), applies_to=(_NA,), na__xpu_build=5.0, na__cpu_build=-2.5)
# an Intel GPU named in words (an IPEX image, an Arc card): a CUDA build is no answer there either
_rule("intel_gpu", ("ipex", "intel arc", "arc a770", "arc a750", "arc b580", "oneapi"), (), (_NA,),
      na__xpu_build=5.0, na__cpu_build=-2.5)
_rule("directml", ("directml", "torch_directml", r"\bamd\b", "radeon"), (), (_NA,), na__directml=5.0)  # not AMD64
_rule("hardcoded_cuda", (".cuda()", "device='cuda'", 'device="cuda"', "use_gpu", ".cuda("), (), (_NA,),
      na__hardcoded_cuda=1.5)
_rule("mps_bf16", flags=("mps", "bf16"), applies_to=(_UD,), ud__mps_bf16=4.0)
_rule("mps_kernel", flags=("kernel_mps",), applies_to=(_UD,), ud__kernel_missing=2.0)
_rule("gpu_kernel", flags=("kernel_cuda",), applies_to=(_UD,), ud__kernel_missing=2.5)
# a float8 tensor at a kernel: float8 stores, it does not compute (no round trip through float32 back to float8);
# a CUDA or XPU kernel is no sign of a CPU-only torch
for _kernel in ("kernel_cpu", "kernel_cuda", "kernel_xpu"):
    _rule(f"fp8_{_kernel}", flags=(_kernel, "fp8"), applies_to=(_UD,), unless=("mps",), ud__fp8_kernel=6.0,
          ud__kernel_missing=-4.0, ud__half_on_cpu=0.0 if _kernel == "kernel_cpu" else -2.0)
_rule("fp8_block_swap", ("block swap", "swapping", "cpu donor", "distorch", "donor"), (), (_BO,), bo__scaled_mm_cpu=1.0)
_rule("ordinal_launch", ("torchrun", "local_rank", "world_size", "nproc", "launch", "rank"), (), (_NA,),
      na__ordinal=1.0)
_rule("stft_window", ("stft", "hann_window", "hamming_window", "window on", "and window", "window="), (), (_DEV,),
      dev__stft_window=3.5)  # not "window" alone: "ComfyUI_windows_portable" holds it
_rule("mps_fp8", flags=("fp8", "mps"), applies_to=(_UD,), ud__mps_fp8=6.0, ud__mps_bf16=-4.0)
_rule("frames_to_mps", (r"\bmps\b", "/users/", "/applications/", "macos", "apple"), ("frames_only",), (_MIX,), _UD,
      weight=1.6,
      why="Module.to() on a Mac: float64 / bfloat16 / float8 tensors cannot move to mps", ud__mps_fp64=2.0)
# "Blockwise quantization only supports 16/32-bit floats, but got X": packed uint8 / int8 is a weight quantized
# twice; a float dtype is a bitsandbytes that cannot quantize it there
for _flag in ("bf16", "half", "fp8", "fp64"):
    _rule(f"bnb_quantize_{_flag}", flags=(_flag,), applies_to=(_Q,), q__bnb_quantize_float=5.0, q__bnb_requantize=-5.0)
_rule("bnb_requantize_offload", ("sequential_cpu_offload", "sequential cpu offload", "cpu_offload", "offload"),
      ("uint8",), (_Q,), q__bnb_offload_requantize=4.0)


"""Causes of dtype errors, kernels missing for a dtype or a backend, and missing accelerators: data.

Same template rules as ``causes_device``.
"""

from __future__ import annotations

from torchdoctor._explain.causes import define_cause as _c

__all__: list[str] = []

_GUARD = "with torchdoctor.guard(model):\n    model(*inputs)"
_MOVE = ("Move everything (parameters, buffers, plain tensor attributes) and verify",
         "torchdoctor.move(model, device={tq})")
_SCAN = "torchdoctor.scan(model«, device={tq}»)"
_SCAN_DT = "torchdoctor.scan(model«, dtype=\"{low}\"»)"

# --- dtype ----------------------------------------------------------------------------------------------------
_c("dt.input_not_cast",
   "A layer's weights and its input (or the two operands) are in different dtypes[, {a} and {b}]: the model or "
   "this layer was cast, the input was not (or the other way round).",
   _SCAN_DT,
   ("Cast the input to the layer's dtype", "x = x.to(next(model.parameters()).dtype)"),
   ("Or run the forward under autocast",
    'with torch.autocast(x.device.type, dtype={low_t}):\n    out = model(x)'))
# The text names which side is the layer's input and which its weights ("Input type (X) and bias type (Y)",
# "mat1 and mat2 ... X and Y"): the fix casts the side that differs, to the dtype the text gives the other side
# (``direction``); never the input "to the model's dtype", a no-op when only this layer stayed behind.
_c("dt.layer_not_cast",
   "The layer's input is {a} but its {param} is {b}: the model was cast to {a} and this layer (or its {param}) "
   "stayed {b}: a loader or a patch that kept it in {b}, a module kept in float32 on purpose, or one attached "
   "after the cast.", 'torchdoctor.scan(model, dtype="{a}")',
   ("Cast that layer, {param} included, to its input's dtype ({a}; its {param} is {b})",
    "layer.to({a_t})  # layer: the module whose {param} is {b}; its input is already {a}"),
   # a component kept in its own dtype on purpose (a VAE upcast by force_upcast, one loaded at the app's dtype)
   # is fixed at the call that feeds it: diffusers' own fix in every such report
   ("Or, where that layer's part is kept in {b} on purpose (a VAE upcast, a component loaded in its own dtype), "
    "cast its input to it where the call passes it",
    "out = part(x.to({b_t}))  # e.g. vae.decode(latents.to(vae.dtype))"),
   ("Or cast the whole model to one dtype once, after every part is attached", "model.to({a_t})"),
   ("Or run the forward under autocast", "with torch.autocast(x.device.type, dtype={low_t}):\n    out = model(x)"))
_c("dt.storage_weight",
   "The layer's {param} is stored as {b} (packed or quantized weights: a GGUF, bitsandbytes, GPTQ or int8 "
   "checkpoint) and reached a plain layer that computes with it as it is: the quantized state dict was loaded "
   "into a plain model, or the layer that dequantizes it was replaced. The {a} input is right; {b} is a storage "
   "dtype, never one to cast activations to.", 'torchdoctor.scan(model)',
   ("Load the checkpoint with the library that quantized it (it dequantizes per call), not into a plain model",
    "model = AutoModelForCausalLM.from_pretrained(name)  # applies the quantization_config the checkpoint carries"),
   ("Or dequantize the weight in the layer's forward before computing with it",
    "w = dequantize(self.weight).to(x.dtype)  # the quantization library's dequantize for this format"))
_c("dt.input_cast",
   "The layer's {param} is {b} but its input is {a}: the model (or this layer) was cast to {b} and the input was "
   "not (images and numpy arrays arrive as float32, float64 or uint8).", 'torchdoctor.scan(model, dtype="{b}")',
   ("Cast the input to the layer's dtype ({b}; the input is {a})",
    "x = x.to({b_t})  # x: the input of the layer whose {param} is {b}"),
   ("Or run the forward under autocast", "with torch.autocast(x.device.type, dtype={low_t}):\n    out = model(x)"))
_c("dt.operand_cast",
   "One operand is {a} while the operation expects {b}, the dtype of its other operands: that operand (a "
   "tensor built in another dtype, a buffer, a matrix passed to an extension) was not cast.", _GUARD,
   ("Cast the odd operand to the expected dtype", "t = t{b_method}  # t: the operand that is {a}"),
   # the text cannot tell which side is odd: a VAE or a norm kept in float32 on purpose is met the other way
   ("Or, where the {a} side is kept in {a} on purpose (a VAE or a norm upcast), cast the {b} operand to it instead",
    "x = x{a_method}  # x: the operand that is {b}"),
   ("Find which model tensor is off", _SCAN_DT))
_c("dt.out_cast",
   "An in-place op (x += y, add_, mul_, clamp_ with float bounds) or an out= tensor would store a {a} result in "
   "a {b} tensor; in-place ops keep the left side's dtype and refuse a narrowing cast.", _GUARD,
   ("Make the left side the result's dtype before the in-place op", "x = x.to({a_t})  # then x.add_(y) works"),
   ("Or keep it {b} and cast the other side (or the result)", "x = (x + y){b_method}"))
_c("dt.fp8_storage",
   "The weights are stored in {fp_eight} (an fp8 base model: --fp8_base, weight_dtype fp8_e4m3fn, a float8 "
   "checkpoint) and reached a plain matmul without being upcast: float8 is a storage dtype, every layer must "
   "cast its weight to the compute dtype (or use a scaled fp8 matmul).", 'torchdoctor.scan(model, dtype="bfloat16")',
   ("Upcast the fp8 weight to the input's dtype inside the layer",
    "w = self.weight.to(x.dtype)\nout = torch.nn.functional.linear(x, w, self.bias)"),
   ("Or load this model (or the layer that failed) in its input's dtype ({fp_eight_into}) instead of fp8",
    "model.to(torch.{fp_eight_into})"))
_c("dt.mask_dtype",
   "The attention mask was passed as it came from the tokenizer (int64) or was built in another float dtype than "
   "the query.", _GUARD, ("Give sdpa a bool mask", "attn_mask = attention_mask.bool()"),
   ("Or an additive mask in the query's dtype", "attn_mask = attn_mask.to(query.dtype)"))
_c("dt.index_cast",
   "Token ids, labels or positions were made floating point: a blanket cast of the inputs (inputs.to(dtype), "
   "batch.half(), a collate that builds one float tensor) also cast the integer indices, or they were computed "
   "with float arithmetic.", _GUARD,
   ("Cast only the floating-point inputs",
    "inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}"),
   ("Or make the indices integer again where they are built", "input_ids = input_ids.long()"))
_c("dt.write_source",
   "A tensor kept in one dtype (a KV cache, an fp32 buffer, a preallocated output) is filled with values "
   "computed in another: the model or a layer was cast after the buffer was made, or the other way round.",
   _GUARD, ("Cast the values to the destination's dtype", "dest[index] = values.to(dest.dtype)"),
   ("Or create the buffer in the model's dtype", "buf = torch.zeros(shape, dtype=x.dtype, device=x.device)"))
_c("dt.module_partially_cast",
   "Part of the model is[ {low}][ and part is {high}] in another dtype: a submodule loaded or created after the cast, or one kept in "
   "float32 on purpose whose output feeds a {low} layer.", _SCAN_DT,
   ("Cast the whole model once, after every part is attached", "model.to({low_t})"),
   ("Find the tensors in the odd dtype", _SCAN_DT))
_c("dt.peft_adapter_dtype",
   "A LoRA adapter's dtype differs from the activations: peft keeps adapters in float32 over a half-precision base "
   "(autocast_adapter_dtype) and casts the input to lora_A's dtype, so lora_A/lora_B or the base output in "
   "different dtypes fail.", _SCAN_DT,
   ("Keep adapters in the base model's dtype", "model = get_peft_model(model, config, autocast_adapter_dtype=False)"),
   ("Or cast the adapted model once", "model.to({low_t})"))
_c("dt.bnb_compute_dtype",
   "A bitsandbytes 4/8-bit layer computes in its compute dtype (bnb_4bit_compute_dtype, float16 for 8-bit) "
   "while the rest of the model, the LoRA adapter or the norms kept in float32 use another one.",
   _SCAN_DT,
   ("Use one dtype for the model and the quantization compute dtype",
    "cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)\n"
    "model = AutoModelForCausalLM.from_pretrained(name, quantization_config=cfg, {dtype_kw}=torch.bfloat16)"),
   ("Or train under autocast", 'with torch.autocast("cuda", dtype=torch.bfloat16):\n    loss = model(**batch).loss'))
_c("dt.accelerate_hook_dtype",
   "An accelerate hook moved the activations to the layer's device but not to its dtype; the layer (often a "
   "LayerNorm) holds another dtype than its input.", _SCAN_DT,
   ("Load every module with one torch_dtype",
    'model = AutoModelForCausalLM.from_pretrained(name, {dtype_kw}={low_t}, device_map="auto")'),
   ("Or run the forward under autocast", 'with torch.autocast("cuda", dtype={low_t}):\n    out = model(**inputs)'))
_c("dt.cpu_norm_mixed",
   "A half-precision model (or module) is running on the CPU: the GPU was not used, or this module was left "
   "behind or offloaded, and the CPU norms refuse an input and weights in different dtypes.", "torchdoctor env",
   ("Run the module in float32 on the CPU", "module.float()"),
   ("Or put it on the GPU it was meant for", 'module.to("cuda")'))
_c("dt.comfy_node_dtype",
   "A custom node[ ({plugin}, at {plugin_at})] feeds tensors in another dtype than the model ComfyUI loaded (its "
   "hint/image/embedding is float32 while the model runs in half precision, or its own module was cast "
   "differently).", "torchdoctor env",
   ("Run ComfyUI in one precision to confirm", "python main.py --force-fp32"),
   ("Update the custom node that failed[ ({plugin_at})]", "git -C {node_dir} pull"))
_c("dt.webui_upcast",
   "The web UI runs the model in half precision while an extension / LoRA patch feeds float32 (upcast or "
   "no-half settings disagree between UNet, VAE and the patch).", "torchdoctor env",
   ("Run fully in float32 to confirm", "--no-half --no-half-vae"),
   ("Or upcast consistently", "--upcast-sampling"))
_c("dt.pipeline_latents",
   "The pipeline's latents or conditioning are in another dtype than the UNet/transformer[ ({a} and {b})]: a "
   "component loaded with another torch_dtype, or a custom pipeline that does not cast.", _SCAN_DT,
   ("Load every component with the same torch_dtype",
    'pipe = DiffusionPipeline.from_pretrained(name, torch_dtype={low_t})'),
   ("Cast inputs to the component's dtype", "latents = latents.to(pipe.unet.dtype)"))
_c("dt.vae_dtype",
   "The VAE's weights are in another dtype than the latents it decodes or the images it encodes[ ({a} input, "
   "{b} {param})]: the VAE was loaded, upcast (force_upcast, --no-half-vae) or cast separately from the rest "
   "of the pipeline.", "torchdoctor.scan(pipe.vae«, dtype=\"{a}\"»)",
   ("Give the VAE the latents' dtype«: {a}»", "pipe.vae.to({a_t})"),
   ("Or cast the latents to the VAE's dtype before decoding",
    "latents = latents.to(pipe.vae.dtype)\nimage = pipe.vae.decode(latents / pipe.vae.config.scaling_factor).sample"))
_c("dt.bf16_no_scaler",
   "The parameters being trained are bfloat16 (model.to(torch.bfloat16) or torch_dtype=torch.bfloat16), so their "
   "gradients are bfloat16, and a GradScaler unscales them with a kernel that has no bfloat16. bfloat16 has "
   "float32's range: it needs no loss scaling.", 'torchdoctor.scan(model, dtype="bfloat16")',
   ("Drop the GradScaler for bfloat16 training",
    "scaler = torch.amp.GradScaler(enabled=False)  # or call loss.backward() and optimizer.step() directly"),
   ("Or keep float32 weights and compute in bfloat16 under autocast",
    'model = model.float()\nwith torch.autocast("cuda", dtype=torch.bfloat16):\n    loss = model(x)'))
_c("dt.fp16_master_weights",
   "The parameters being trained are float16 (model.half(), .to(torch.float16) or torch_dtype=torch.float16), so "
   "their gradients are float16 too; GradScaler refuses to unscale those. Mixed precision keeps the weights in "
   "float32 and computes in float16 under autocast; bfloat16 training needs no GradScaler at all.",
   'torchdoctor.scan(model, dtype="float32")',
   ("Keep float32 weights and let autocast compute in float16",
    'model = model.float()  # master weights in float32\nwith torch.autocast("cuda", dtype=torch.float16):\n'
    '    loss = model(x)\nscaler.scale(loss).backward()'),
   ("Or train in bfloat16 and drop the GradScaler", "model = model.to(torch.bfloat16)  # no GradScaler: "
    "bfloat16 has float32's range"))
_c("iw.model_not_on_device",
   "The input is on {input_device} but the layer's weights are on {weight_device}: the model was not moved "
   "(or only partly), or the input was not.", _SCAN,
   ("Move the model to the input's device", "model.to({tq})"),
   ("Or move the input to the model's device", "x = x.to(next(model.parameters()).device)"), _MOVE)

# --- dtype not supported on the device ------------------------------------------------------------------------
_c("ud.half_on_cpu",
   "The model runs in {dtype} on the CPU, which has no {dtype} kernel for {kernel}: the GPU was not used "
   "(CPU-only torch, device left at cpu) or .half() is applied unconditionally.", "torchdoctor env",
   ("Use float32 on the CPU", "model = model.float()"),
   ("Or upgrade torch: newer releases have far more float16/bfloat16 CPU kernels", "pip install -U torch"),
   ("Choose the dtype from the device (float16 on a GPU: CUDA, MPS or XPU; float32 on the CPU)",
    'dtype = torch.float32 if device.type == "cpu" else torch.float16'),
   ("Check that this torch sees the GPU", "torchdoctor env"))
_c("ud.cpu_only_build",
   "A CPU-only build of torch is installed, so the half-precision model fell back to the CPU.", "torchdoctor env",
   ("Install a CUDA build of torch",
    "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu124"))
_c("ud.kernel_missing",
   "This device has no {dtype} kernel for {kernel}.", 'torchdoctor.simulate(model, device={tq})',
   ("Run this op in float32", "out = op(x.float()).to(x.dtype)"),
   ("Or upgrade torch (kernels for more dtypes arrive with new releases)", "pip install -U torch"),
   ("Pick a dtype the device supports", 'torchdoctor.recommend_dtype({tq})'))
# float8 stores weights; elementwise ops and most others have no float8 kernel on any device, so the tensor is
# upcast before the op and the result kept: "op(x.float()).to(x.dtype)" would hand the next op float8 again
_c("ud.fp8_kernel",
   "{fp_eight} is a storage dtype: {kernel} (like most ops) has no {fp_eight} kernel, so a float8 tensor reached "
   "an op without being upcast. Casting the result back to {fp_eight} makes the next op fail the same way.",
   'torchdoctor.scan(model, dtype="{fp_eight_into}")',
   ("Upcast the float8 tensor before the op and keep the result in the compute dtype",
    "x = x.to(torch.{fp_eight_into})  # then run the op; do not cast the result back to float8"),
   ("Or load the model (or the layer that failed) in {fp_eight_into} instead of float8",
    "model.to(torch.{fp_eight_into})"))
_c("ud.mps_fp64",
   "A float64 tensor (numpy arrays and Python floats default to float64) was moved to mps, which has no float64.",
   'torchdoctor.simulate(model, device="mps")',
   ("Cast to float32 before moving to mps", 't = t.to(torch.float32).to("mps")'),
   ("Make numpy inputs float32", 'torch.from_numpy(arr.astype("float32"))'))
_c("ud.mps_bf16",
   "bfloat16 needs macOS 14+, an M2 or newer and a recent PyTorch on MPS (and some kernels still lack it).",
   'torchdoctor.simulate(model, device="mps")',
   ("Use float16 on MPS", 'model = model.to("mps", torch.float16)'),
   ("Pick a dtype the device supports", 'torchdoctor.recommend_dtype("mps")'))
_c("ud.bf16_old_gpu",
   "The model computes in bfloat16 on a GPU below compute capability 8.0, which has no bf16 matmul kernels; "
   "float16 (with fp32 norms) or float32 runs there.",
   'torchdoctor.simulate(model, device="cuda", dtype="bfloat16", profile=torchdoctor.DeviceProfile('
   'type="cuda", capability=(7, 5)))',
   ("Compute in float16 on pre-Ampere GPUs", "model = model.to(torch.float16)"),
   ("With vLLM, ask for float16 explicitly", "vllm serve <model> --dtype=half  # LLM(model, dtype=\"half\") in Python"),
   ("Pick a dtype the device supports", 'torchdoctor.recommend_dtype("cuda")'))
_c("ud.scaled_mm_capability",
   "An fp8 'fast' / scaled-matmul mode is on, but torch._scaled_mm needs compute capability 8.9+ (RTX 40xx, "
   "H100); older GPUs can store fp8 weights but must compute in bf16/fp16.", "torchdoctor env",
   ("Turn off the fp8 fast / scaled-mm mode; keep fp8 only as storage",
    "# ComfyUI: weight_dtype fp8_e4m3fn instead of fp8_e4m3fn_fast"),
   ("Or compute in bfloat16", "model.to(torch.bfloat16)"))
_c("ud.complex_dtype",
   "torch.complex / torch.polar (complex rotary embeddings, FFT code) have no bfloat16 kernels; under bf16 "
   "autocast or a bf16 model their inputs arrive as bfloat16.", _GUARD,
   ("Build the complex tensor in float32", "z = torch.complex(real.float(), imag.float())"),
   ("Or run that block with autocast off", "with torch.autocast(x.device.type, enabled=False):\n    out = block(x.float())"))
_c("ud.flash_fp32",
   "FlashAttention kernels exist only for float16 and bfloat16, and the attention inputs are float32: the model "
   "was loaded without a dtype (from_pretrained defaults to float32), or a norm/upcast before attention turned the "
   "activations to float32.", _SCAN_DT,
   ("Load the model in bfloat16 (float16 on pre-Ampere GPUs)",
    'model = AutoModelForCausalLM.from_pretrained(name, {dtype_kw}=torch.bfloat16, '
    'attn_implementation="flash_attention_2"){dtype_note}'),
   ("Or cast q/k/v before the flash-attn call", "q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))"),
   ("Or use PyTorch's SDPA, which runs float32", 'attn_implementation="sdpa"'))
_c("ud.fp8_promotion",
   "float8 is a storage format here: an fp8 weight met a {other_dtype} tensor in an op that would need "
   "type promotion, which PyTorch refuses for float8.", 'torchdoctor.scan(model, dtype="bfloat16")',
   ("Upcast fp8 weights before computing", "w = weight.to(x.dtype)\nout = torch.nn.functional.linear(x, w)"),
   ("Or keep this module in bf16", "module.to(torch.bfloat16)"))

# --- backend op missing ---------------------------------------------------------------------------------------
_c("bo.kernel_device_only",
   "{op} has kernels only for other backends; its[ {backend}] inputs must move to a device that implements it.",
   'torchdoctor.simulate(model, device={tq})',
   ("Run this op where it has a kernel", 'x = x.to("{available_device}")'),
   ("See which device backends this torch build has", "torchdoctor env"))
_c("bo.ipex_xpu_op_on_cpu",
   "An IPEX fused op registered only for XPU ({op}) ran on CPU tensors: the model or inputs are on the CPU "
   "(or partly offloaded) while intel_extension_for_pytorch's XPU fusions are active; importing the XPU "
   "build of ipex in a CPU run also inserts them.", "torchdoctor env",
   ("Run the model and inputs on xpu", 'model = model.to("xpu")\ninputs = inputs.to("xpu")'),
   ("For a CPU-only run, drop the XPU build of IPEX", "# remove: import intel_extension_for_pytorch as ipex"))
_c("bo.torchvision_mismatch",
   "torchvision (or another extension) was built for a different torch or without[ {backend}] GPU kernels: a CPU "
   "or mismatched torchvision next to a GPU build of torch.", "torchdoctor env",
   ("Reinstall torch and torchvision together from one index",
    "pip install --force-reinstall torch torchvision --index-url https://download.pytorch.org/whl/cu124"),
   ("Check the versions", "torchdoctor env"))
# confirmed on the Mac itself: virtual mps does not know every op MPS lacks (torch._int_mm ran there and said ok)
_c("bo.mps_fallback",
   "{op} has no MPS kernel in this PyTorch.", _GUARD,
   ("Let unsupported ops fall back to the CPU", "export PYTORCH_ENABLE_MPS_FALLBACK=1"),
   ("Or run that step on the CPU", 'out = fn(x.cpu()).to("mps")'))
_c("bo.xformers_no_kernel",
   "xformers has no kernel for these inputs on this GPU: bf16 needs an A100-class GPU (compute 8.0+), some "
   "head sizes / bias layouts are unsupported, or xformers was built for another torch or CUDA.", "torchdoctor env",
   ("Use PyTorch's SDPA instead of xformers",
    "pipe.disable_xformers_memory_efficient_attention()  # or start without --xformers"),
   ("On pre-Ampere GPUs use float16", "pipe.to(torch.float16)"),
   ("Check the xformers build", "python -m xformers.info"),
   ("Install the xformers wheel built for your torch (same CUDA index as torch)",
    "pip install -U xformers --index-url https://download.pytorch.org/whl/cu124  # match torch's +cuXXX"))
_c("bo.xformers_cpu_inputs",
   "xformers' memory_efficient_attention runs only on CUDA, and the query/key/value are on the CPU[ ({dtype})]: "
   "the model (or this attention block) was not moved to the GPU.", _GUARD,
   ("Move the model and its inputs to the GPU", 'model.to("cuda")\nx = x.to("cuda")'),
   ("Or, on the CPU, use PyTorch's SDPA", "out = torch.nn.functional.scaled_dot_product_attention(q, k, v)"))
_c("bo.xformers_build",
   "This xformers has no CUDA kernels for this torch: it was built for another torch / CUDA version (or without "
   "CUDA), so every attention operator is listed as not built.", "torchdoctor env",
   ("Install the xformers wheel built for your torch (same CUDA index as torch)",
    "pip install -U xformers --index-url https://download.pytorch.org/whl/cu124  # match torch's +cuXXX"),
   ("Check which torch and CUDA xformers was built for", "python -m xformers.info"),
   ("Or drop xformers and use PyTorch's SDPA", "pip uninstall -y xformers"))
_c("bo.extension_mismatch",
   "A compiled extension[ ({lib})] was built for another torch or CUDA than the one installed[ (built for "
   "{built}, you have {have})]; its kernels do not load.", "torchdoctor env",
   ("Install the extension build that matches your torch (or torch that matches it)",
    "pip install -U --force-reinstall xformers torch --index-url https://download.pytorch.org/whl/cu124"),
   ("Or rebuild it against this torch", "pip install --no-build-isolation --no-binary :all: <extension>"),
   ("Check the versions", "torchdoctor env"))
_c("bo.scaled_mm_cpu",
   "fp8 scaled matmul (aten::_scaled_mm) only has a CUDA kernel; layers moved or offloaded to the CPU cannot run "
   "it.", 'torchdoctor.scan(model, device="cuda:0")',
   ("Keep fp8 layers on the GPU, or upcast them before offloading", "module.to(torch.bfloat16)"))

# --- no accelerator -------------------------------------------------------------------------------------------
_c("na.cpu_build",
   "The installed torch is a CPU-only build (the default wheel on some platforms, or conda's cpu variant).",
   "torchdoctor env",
   ("Install a CUDA build that matches your driver",
    "pip uninstall -y torch\npip install torch --index-url https://download.pytorch.org/whl/cu124"),
   ("Or pick the device at run time", "device = torchdoctor.pick_device()"))
_c("na.hardcoded_cuda",
   "The code hard-codes CUDA (.cuda(), device='cuda', use_gpu=True) on a machine without a usable NVIDIA GPU.",
   "torchdoctor env",
   ("Choose the device at run time (cuda > xpu > mps > cpu)", "device = torchdoctor.pick_device()\nmodel.to(device)"),
   ("Or run on the CPU", 'device = "cpu"'))
_c("na.mac",
   "This is a Mac: there is no CUDA; Apple GPUs are the 'mps' device.", "torchdoctor env",
   ("Use MPS on Apple silicon", 'device = "mps" if torch.backends.mps.is_available() else "cpu"'))
_c("na.no_driver",
   "No NVIDIA driver is loaded here (no NVIDIA GPU, a VM or container without GPU passthrough, or a broken "
   "driver install).", "torchdoctor env",
   ("Install (or repair) the NVIDIA driver, then check it sees the GPU",
    "nvidia-smi  # must list the GPU; driver: https://www.nvidia.com/Download/index.aspx"),
   ("Pick the device at run time", "device = torchdoctor.pick_device()"),
   ("In a container, expose the GPU", "docker run --gpus all <image>"))
_c("na.ordinal",
   "The code asks for a GPU index that is not visible: a hard-coded cuda:1, a local_rank/world_size larger "
   "than the GPU count, or CUDA_VISIBLE_DEVICES limiting the list.", "torchdoctor env",
   ("Use an index that exists", 'device = torch.device("cuda:0")'),
   ("Or see how many GPUs this process has", 'python -c "import torch; print(torch.cuda.device_count())"'),
   ("Launch no more processes than GPUs (one per GPU)",
    "torchrun --nproc_per_node=$(nvidia-smi -L | wc -l) train.py  # or: CUDA_VISIBLE_DEVICES=0,1 with 2 processes"))
_c("na.arch_not_in_build",
   "The installed torch (or xformers / flash-attention / another compiled extension) was built without kernels "
   "for this GPU's compute capability: a new GPU (RTX 50xx, sm_120) with a wheel for an older CUDA, or an old "
   "GPU (GTX 10xx, sm_61) that a newer wheel dropped.", "torchdoctor env --probe",
   ("Compare the GPU's capability with the architectures the build has",
    'python -c "import torch; print(torch.cuda.get_device_capability(), torch.cuda.get_arch_list())"'),
   ("Install a build that covers this GPU (CUDA 12.8+ wheels for RTX 50xx)",
    "pip install --force-reinstall torch torchvision torchaudio --index-url https://download.pytorch.org/whl/cu128"))
_c("na.not_linked",
   "This torch build lacks the[ {backend}] device backend the code asked for: install a build of torch with it, "
   "or (older Intel setups) import intel_extension_for_pytorch before using 'xpu'.", "torchdoctor env",
   ("Pick the device at run time", "device = torchdoctor.pick_device()"),
   ("Intel GPUs with IPEX: import it first", "import torch\nimport intel_extension_for_pytorch as ipex"),
   ("Or install the XPU build of torch", "pip install torch --index-url https://download.pytorch.org/whl/xpu"))
_c("na.backend_not_in_build",
   "{op} has no[ {backend}] kernel at all in this build: the installed torch does not include that backend (a CPU "
   "or Mac build where a CUDA build was meant).",
   "torchdoctor env",
   ("Install a torch build with that backend",
    "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu124"),
   ("Or pick the device at run time", "device = torchdoctor.pick_device()"),
   ("On a Mac, use MPS instead of CUDA", 'device = "mps" if torch.backends.mps.is_available() else "cpu"'))
_c("na.xpu_build",
   "This torch has no XPU support: it was installed from the default (CUDA or CPU) index, not the XPU one.",
   "torchdoctor env",
   ("Install the XPU build of torch", "pip install torch --index-url https://download.pytorch.org/whl/xpu"),
   ("Or pick the device at run time", "device = torchdoctor.pick_device()"))
_c("na.directml",
   "An AMD/Intel GPU on Windows runs through DirectML (torch-directml), which is not CUDA: code that asks for "
   "'cuda' fails there.", "torchdoctor env",
   ("Start the app in DirectML mode", "python main.py --directml"),
   ("Or use the DirectML device in code", "import torch_directml\ndevice = torch_directml.device()"))


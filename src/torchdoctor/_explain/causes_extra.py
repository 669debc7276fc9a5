"""Causes added for issue 29's misses: float16 overflow, an stft window left behind, float8 on MPS, quantized
models that transformers refuses to load with modules off the GPU (GPTQ ExLlama, bitsandbytes); and for issue 40
point 6, a plugin's own float64 tensor in ComfyUI or a web UI (an app-wide precision flag cannot change it)."""

from __future__ import annotations

from torchdoctor._explain.causes import define_cause as _c

__all__: list[str] = []

_c("dt.half_overflow",
   "A number outside float16's range (about ±65504) was written into a float16 tensor — a mask fill such as "
   "-1e10 or torch.finfo(torch.float32).min, or a constant like float(2**30): the model runs in float16 (often "
   "because the GPU has no bfloat16, or autocast chose it).",
   "torchdoctor env",
   ("Fill with the limit of the tensor's own dtype", "x = x.masked_fill(mask, torch.finfo(x.dtype).min)"),
   ("Or run the model in bfloat16 (float32 on GPUs without bf16)", "model = model.to(torch.bfloat16)"))
_c("dev.stft_window",
   "The stft window (torch.hann_window(...)) was made on the CPU, or kept as a plain attribute that "
   ".to() / .cuda() does not move, while the signal is on the GPU (or the other way round).",
   "with torchdoctor.guard(model): model(x)",
   ("Make the window on the signal's device", "window = torch.hann_window(win_length, device=x.device)"),
   ("Or register it as a buffer so that .to() moves it",
    'self.register_buffer("window", torch.hann_window(win_length), persistent=False)'))
_c("ud.mps_fp8",
   "float8 weights (Float8_e4m3fn / e5m2, the 'fp8' checkpoints) cannot be placed on MPS: Metal has no float8 "
   "type on any macOS or chip. This is not the bfloat16 / macOS 14 limit; a newer macOS does not help.",
   'torchdoctor.simulate(model, device="mps")',
   ("Load an fp16 (or bf16) checkpoint instead of the fp8 one, or upcast before moving",
    'model = model.to(torch.float16).to("mps")'),
   ("Pick a dtype the device supports", 'torchdoctor.recommend_dtype("mps")'))
_c("q.exllama_cpu",
   "device_map placed some modules of a GPTQ model on the CPU or the disk (no GPU visible, device_map=\"cpu\", "
   "or \"auto\" ran out of GPU memory), while the ExLlama / ExLlamaV2 kernels, transformers' default for 4-bit "
   "GPTQ, need the whole model on the GPU.", "torchdoctor env",
   ("Load every module on the GPU", 'model = AutoModelForCausalLM.from_pretrained(name, device_map={"": 0})'),
   ("Or turn the ExLlama kernels off (slower; the way to run on the CPU or with offloading)",
    "cfg = GPTQConfig(bits=4, use_exllama=False)  # older transformers: disable_exllama=True\n"
    'model = AutoModelForCausalLM.from_pretrained(name, quantization_config=cfg, device_map="auto")'))
_c("q.bnb_dispatch",
   "device_map=\"auto\" found too little GPU memory for the quantized model (or no usable GPU: a bitsandbytes or "
   "torch build without CUDA) and put modules on the CPU or the disk, which bitsandbytes layers cannot run on.",
   "torchdoctor env",
   ("Keep the modules that do not fit in float32 on the CPU, on purpose",
    "cfg = BitsAndBytesConfig(load_in_8bit=True, llm_int8_enable_fp32_cpu_offload=True)\n"
    'model = AutoModelForCausalLM.from_pretrained(name, quantization_config=cfg, device_map="auto")'),
   ("Or fit it on the GPU: 4-bit instead of 8-bit, or a smaller model",
    'cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16)'),
   ("Check that torch and bitsandbytes see the GPU", "torchdoctor env"))
_c("dt.node_float64",
   "The node's own code[ ({plugin_at})] made a float64 tensor (numpy arrays and Python floats are float64, and "
   "torch.from_numpy / torch.tensor keep that) and used it with the model's tensors. ComfyUI never computes in "
   "float64, so its precision flags do not reach this tensor: it must be made in the dtype it meets.",
   "torchdoctor env",
   ("Make the node's tensor in the dtype of the tensor it meets[ (at {plugin_at})]",
    "m = torch.from_numpy(matrix).to(device=x.device, dtype=x.dtype)  # or torch.tensor(..., dtype=x.dtype)"),
   ("Update the custom node that failed[ ({plugin_at})]", "git -C {node_dir} pull"))
# The web UIs' twin of causes_extra's dt.node_float64: an extension's own float64 tensor, which no precision flag
# of the app reaches (the app computes in float16, bfloat16 or float32, never float64).
_c("dt.extension_float64",
   "The extension's own code[ ({plugin_at})] made a float64 tensor (numpy arrays and Python floats are float64, "
   "and torch.from_numpy / torch.tensor keep that) and used it with the model's tensors. The web UI never "
   "computes in float64, so --no-half and its other precision flags do not reach this tensor: it must be made "
   "in the dtype it meets.",
   "torchdoctor env",
   ("Make the extension's tensor in the dtype of the tensor it meets[ (at {plugin_at})]",
    "m = torch.from_numpy(matrix).to(device=x.device, dtype=x.dtype)  # or torch.tensor(..., dtype=x.dtype)"),
   ("Update the extension that failed[ ({plugin_at})]", "git -C {ext_dir} pull"))
# bitsandbytes quantizes a Params4bit when it first moves to an accelerator and marks it quantized; a packed (uint8)
# weight that lost the mark is quantized again and refused: "Blockwise quantization only supports 16/32-bit floats"
_c("q.bnb_requantize",
   "A weight that bitsandbytes had already quantized (packed into uint8) was quantized again, because it lost its "
   "\"already quantized\" mark: it was re-wrapped or replaced by what .to() returned (Params4bit(w), "
   "w = w.to(...): older bitsandbytes returned an unmarked copy), moved to the CPU and back by offloading, "
   "or a pre-quantized checkpoint was loaded into a model that is quantized a second time.", "torchdoctor env",
   ("Upgrade bitsandbytes (newer releases keep the mark through .to()) and the libraries that move the weights",
    "pip install -U bitsandbytes accelerate transformers diffusers"),
   ("Move a quantized layer as a whole; never re-wrap its weight or keep a copy that .to() returned",
    "layer.to({tq})  # not: layer.weight = Params4bit(layer.weight) / w = w.to(...)"),
   ("Load a pre-quantized checkpoint (\"...-bnb-4bit\") without a second quantization_config",
    'model = AutoModelForCausalLM.from_pretrained(name, device_map={"": 0})  # its config already carries it'))
_c("q.bnb_offload_requantize",
   "CPU offloading moves each bitsandbytes layer to the CPU and back on every call (sequential offload, "
   "accelerate's cpu_offload); the packed 4-bit weights come back without their \"already quantized\" mark and "
   "are quantized again.", "torchdoctor env",
   ("Offload whole models, not single layers", "pipe.enable_model_cpu_offload()  # instead of enable_sequential_cpu_offload()"),
   ("Upgrade the libraries that move quantized weights", "pip install -U bitsandbytes accelerate diffusers"),
   ("Or, when it fits, keep the quantized model on the GPU without offloading", 'pipe.to("cuda")'))
_c("q.bnb_quantize_float",
   "This bitsandbytes cannot quantize {dtype} weights here: older releases and the CPU code quantize float32 only "
   "(bfloat16 arrived later), and float8 weights must be upcast before bitsandbytes quantizes them.",
   "torchdoctor env",
   ("Upgrade bitsandbytes", "pip install -U bitsandbytes"),
   ("Or quantize from float16 weights: load them in that dtype, then quantize",
    "model = AutoModelForCausalLM.from_pretrained(name, quantization_config=cfg, {dtype_kw}=torch.float16)"))

# The twelfth session's hunt (E3, E4): dtypes that a consumer of the tensor has no type for
_c("ud.numpy_dtype",
   "numpy has no {dtype} type: a {dtype} tensor was converted to numpy (.numpy(), np.asarray(t), np.array(t), or "
   "a library that calls them: saving an image or video, a plot, a metric), which fails whatever its device.",
   'torchdoctor.scan(model)',
   ("Cast to float32 before converting", "arr = t.detach().float().cpu().numpy()"),
   ("Or, for images, convert to uint8 first", "arr = (t.clamp(0, 1) * 255).to(torch.uint8).cpu().numpy()"))
_c("ud.xpu_fp64",
   "This Intel GPU (Arc and other consumer XPUs) has no float64 kernels, and a float64 tensor reached it: numpy "
   "arrays and Python floats default to float64, and torch.from_numpy / torch.arange(..., dtype=torch.float64) "
   "keep it (rotary embeddings are a common place).",
   # on the device itself: a virtual xpu computes float64 (Arc's lack of it is not simulated for every op)
   "with torchdoctor.guard(model):\n    model(*inputs)",
   ("Make that tensor float32 before it reaches xpu", "t = t.to(torch.float32)"),
   ("Make numpy inputs float32", 'torch.from_numpy(arr.astype("float32"))'))

# a torch build that refuses a dtype on its platform, and the FFT libraries' missing dtypes
_c("ud.dtype_platform",
   "This torch build refuses {dtype} on this GPU[ ({backend} below {need})]: the fp8 checkpoint's weights cannot even "
   "be created here, so they must be loaded (and computed) in bfloat16 or float16.",
   "torchdoctor env",
   ("Load the fp8 checkpoint's weights in bfloat16", "model = model.to(torch.bfloat16)"),
   ("Check which torch build and ROCm / CUDA version this environment has", "torchdoctor env"))
_c("ud.fft_dtype",
   "The FFT library (cuFFT on CUDA, MKL / pocketfft on the CPU) has no {dtype} transform (float16 only for "
   "power-of-two sizes): under a bfloat16 model or autocast the signal reaches torch.fft in that dtype.",
   "with torchdoctor.guard(model):\n    model(*inputs)",
   ("Run the FFT in float32", "X = torch.fft.rfft(x.float())  # complex64: cast what is computed from it back with .to(x.dtype)"),
   ("Or run that block with autocast off", "with torch.autocast(x.device.type, enabled=False):\n    out = block(x.float())"))
_c("dev.ctc_cudnn",
   "F.ctc_loss / nn.CTCLoss took cuDNN's path, which it does for float32 log_probs on CUDA with int32 targets, "
   "and that path reads targets, input_lengths and target_lengths on the CPU: they were made or moved to the GPU "
   "with the rest of the batch.",
   "print(targets.device, targets.dtype, input_lengths.device, target_lengths.device)",
   ("Pass the targets and lengths on the CPU (cuDNN's path reads them there)",
    "loss = F.ctc_loss(log_probs, targets.cpu(), input_lengths.cpu(), target_lengths.cpu())"),
   ("Or give int64 targets and lengths: torch then takes its own CUDA kernel, which reads them on the GPU",
    "loss = F.ctc_loss(log_probs, targets.long(), input_lengths.long(), target_lengths.long())"))

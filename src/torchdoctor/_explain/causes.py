"""Causes and context rules for ``explain``: what usually produced an error, and which words in the traceback
make one cause more likely than another (or re-file the error under a closer category).

Both tables are data, filled by registration that refuses duplicates. Text uses ``{field}`` placeholders filled
from the error (``target`` is the accelerator named in the message, ``low`` the reduced-precision dtype, ...);
``[...]`` is dropped when a field inside it is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Cause", "ContextRule", "causes", "context_rules", "register_cause", "register_rule"]


@dataclass(frozen=True)
class Cause:
    id: str
    text: str
    fixes: tuple[tuple[str, str], ...]
    confirm: str


@dataclass(frozen=True)
class ContextRule:
    """Fires when any of ``words`` occurs in the lower-cased context (``\\`` read as ``/``) and all ``flags``
    (facts derived from the message: ``meta``, ``two_accels``, ``cpu_and_accel``, ...) hold.

    It applies to diagnoses whose category is in ``applies_to`` (all when empty); ``category`` re-files them,
    ``boosts`` add weight to causes (a cause not yet listed joins the ranking)."""

    name: str
    words: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    applies_to: tuple[str, ...] = ()
    category: str | None = None
    boosts: tuple[tuple[str, float], ...] = ()
    unless: tuple[str, ...] = ()  # flags that stop the rule


_CAUSES: dict[str, Cause] = {}
_RULES: dict[str, ContextRule] = {}


def register_cause(cause: Cause) -> Cause:
    if cause.id in _CAUSES:
        raise ValueError(f"duplicate explain cause {cause.id!r}")
    _CAUSES[cause.id] = cause
    return cause


def register_rule(rule: ContextRule) -> ContextRule:
    if rule.name in _RULES:
        raise ValueError(f"duplicate explain context rule {rule.name!r}")
    unknown = [c for c, _ in rule.boosts if c not in _CAUSES]
    if unknown:
        raise ValueError(f"context rule {rule.name!r} boosts unknown causes {unknown}")
    _RULES[rule.name] = rule
    return rule


def causes() -> dict[str, Cause]:
    return _CAUSES


def context_rules() -> tuple[ContextRule, ...]:
    return tuple(_RULES.values())


def _c(id: str, text: str, confirm: str, *fixes: tuple[str, str]) -> None:
    register_cause(Cause(id, text, tuple(fixes), confirm))


_SCAN = 'torchdoctor.scan(model, device="{target}")'
_GUARD = "with torchdoctor.guard(model):\n    model(*inputs)"
_MOVE = ("Move everything (parameters, buffers, plain tensor attributes) and verify",
         'torchdoctor.move(model, device="{target}")')

# --- device ---------------------------------------------------------------------------------------------------
_c("dev.module_not_moved",
   "Part of the model was never moved to {target}: a submodule created or loaded after the .to() call, or a "
   "plain tensor attribute (not a parameter or buffer), which Module.to does not move.", _SCAN,
   ("Move the whole model after everything is attached", 'model.to("{target}")'), _MOVE)
_c("dev.inputs_not_moved",
   "The inputs were created on another device than the model (tokenizer or dataloader output left on the "
   "CPU, or made on cuda:0 while the model lives elsewhere).", _GUARD,
   ("Put the inputs on the model's device", "x = x.to(next(model.parameters()).device)"))
_c("dev.created_inside",
   "A tensor created inside forward (torch.tensor/arange/zeros without device=, or a cached buffer) is on "
   "the CPU while the activations are on {target}.", _GUARD,
   ("Create new tensors on the input's device",
    "torch.arange(n, device=x.device)  # also torch.zeros(..., device=x.device)"))
_c("dev.two_gpus_device_map",
   "The model is split over several GPUs (device_map), and a tensor crossed a layer boundary without being "
   "moved: custom code mixing outputs of two layers, a cached tensor on the first GPU, or .to()/.cuda() "
   "called on a dispatched model.", _GUARD,
   ("Put the inputs on the first layer's device", "inputs = inputs.to(model.get_input_embeddings().weight.device)"),
   ("Or keep the whole model on one GPU", 'model = AutoModelForCausalLM.from_pretrained(name, device_map={"": 0})'),
   ("Never call .to()/.cuda() on a model loaded with device_map",
    "print(model.hf_device_map)  # and drop model.to(...) / model.cuda()"))
_c("dev.offloaded_cpu",
   "device_map put some modules on the CPU (too little GPU memory, or 'cpu' in the map); their weights reach "
   "{target} only inside their own accelerate hook, so a tensor they produce or a module called outside its hook "
   "stays on the CPU.", "torchdoctor.scan(model)",
   ("See which modules were placed on the CPU", "print(model.hf_device_map)"),
   ("Give the GPU enough room, or load on one device",
    'model = AutoModelForCausalLM.from_pretrained(name, device_map={"": 0}, torch_dtype=torch.float16)'))
_c("dev.offload_outside_hooks",
   "enable_model_cpu_offload() keeps each component on the CPU until its own forward hook moves it; a "
   "module used outside the hooks (a prompt-weighting helper calling the text encoder, an image projection or "
   "adapter added after offload was enabled, components shared between pipelines) stays on the CPU.",
   'torchdoctor.scan(pipe, device="{target}")',
   ("Enable offload last, on the pipeline you call, after loading adapters", "pipe.enable_model_cpu_offload()"),
   ("Or skip offloading and move the whole pipeline", 'torchdoctor.move(pipe, device="{target}")'))
_c("dev.app_offload",
   "The app's offload / low-VRAM mode keeps parts of the model on the CPU, and an extension or script ran a "
   "component outside the app's device handling.", "torchdoctor env",
   ("Retry with offloading off to confirm",
    "# SD.Next: Settings > Diffusers > Model offload mode: none\n# A1111/Forge: drop --medvram / --lowvram"),
   ("Update the extension or script that failed", "git -C extensions/<name> pull"))
_c("dev.peft_adapter_device",
   "A LoRA adapter (lora_A/lora_B) is on another device than its base layer: adapters were added or loaded "
   "after the base model was moved or dispatched.", 'torchdoctor.scan(model, device="{target}")',
   ("Move the model again after adding adapters", 'model = get_peft_model(model, config)\nmodel.to("{target}")'), _MOVE)
_c("dev.generate_inputs",
   "generate() got inputs on another device than the model (tokenizer output left on the CPU).",
   "with torchdoctor.guard(model):\n    model.generate(**inputs)",
   ("Move the tokenizer output to the model",
    'inputs = tokenizer(prompt, return_tensors="pt").to(model.device)\nout = model.generate(**inputs)'))
_c("dev.ipex_partial",
   "Only part of the work runs on xpu: inputs or helper tensors (tokenizer output, generation stopping "
   "criteria, CPU-side embeddings) stay on the CPU; intel_extension_for_pytorch / ipex-llm and transformers "
   "versions out of step do this inside generate().", "torchdoctor env",
   ("Move the model and its inputs to xpu together", 'model = model.to("xpu")\ninput_ids = input_ids.to("xpu")'),
   ("Check torch / IPEX / transformers versions agree", "torchdoctor env"))
_c("dev.comfy_custom_node",
   "A custom node keeps its own module or tensors on the CPU while ComfyUI's model management loaded the model "
   "to the GPU (or offloaded part of it under low VRAM).", _GUARD,
   ("Move the node's module to the device ComfyUI samples on",
    "import comfy.model_management as mm\nmodule.to(mm.get_torch_device())"),
   ("Rule out partial loading", "python main.py --highvram"))

_c("dev.cuda_api_on_cpu",
   "A CUDA-only call (torch.cuda.set_device, a CUDA generator or stream, a library's CUDA kernel path) got a CPU "
   "device or tensor: the run (or this part of the model, after offloading) is on the CPU while this code path "
   "assumes CUDA.", _GUARD,
   ("Call CUDA-only APIs only for CUDA devices", 'if device.type == "cuda":\n    torch.cuda.set_device(device)'),
   ("Or create the generator on the device the tensors use",
    "generator = torch.Generator(device=latents.device).manual_seed(seed)"),
   ("Or move the model to the GPU before calling it", 'model.to("{target}")'))

# --- dtype ----------------------------------------------------------------------------------------------------
_c("dt.input_not_cast",
   "The model (or this layer) was cast to {low}, the input was not (or the other way round).",
   'torchdoctor.scan(model, dtype="{low}")',
   ("Cast the input to the layer's dtype", "x = x.to(next(model.parameters()).dtype)"),
   ("Or run the forward under autocast",
    'with torch.autocast("{device_type}", dtype=torch.{low}):\n    out = model(x)'))
_c("dt.fp8_storage",
   "The weights are stored in {fp_eight} (an fp8 base model: --fp8_base, weight_dtype fp8_e4m3fn, a float8 "
   "checkpoint) and reached a plain matmul without being upcast: float8 is a storage dtype, every layer must "
   "cast its weight to the compute dtype (or use a scaled fp8 matmul).", 'torchdoctor.scan(model, dtype="bfloat16")',
   ("Upcast the fp8 weight to the input's dtype inside the layer",
    "w = self.weight.to(x.dtype)\nout = torch.nn.functional.linear(x, w, self.bias)"),
   ("Or load this model (or the layer that failed) in bf16 instead of fp8", "model.to(torch.bfloat16)"))
_c("dt.mask_dtype",
   "The attention mask was passed as it came from the tokenizer (int64) or was built in another float dtype than "
   "the query.", _GUARD, ("Give sdpa a bool mask", "attn_mask = attention_mask.bool()"),
   ("Or an additive mask in the query's dtype", "attn_mask = attn_mask.to(query.dtype)"))
_c("dev.numpy_on_gpu",
   "Code passed a GPU tensor to numpy (t.numpy(), np.asarray(t), matplotlib, scikit-learn, PIL): numpy needs a "
   "CPU copy.", _GUARD, ("Copy to the CPU first", "arr = t.detach().cpu().numpy()"))
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
   "Part of the model is {low} and part is {high}: a submodule loaded or created after the cast, or one kept in "
   "float32 on purpose whose output feeds a {low} layer.", 'torchdoctor.scan(model, dtype="{low}")',
   ("Cast the whole model once, after every part is attached", "model.to(torch.{low})"),
   ("Find the tensors in the odd dtype", 'torchdoctor.scan(model, dtype="{low}")'))
_c("dt.peft_adapter_dtype",
   "A LoRA adapter's dtype differs from the activations: peft keeps adapters in float32 over a {low} base "
   "(autocast_adapter_dtype) and casts the input to lora_A's dtype, so lora_A/lora_B or the base output in "
   "different dtypes fail.", 'torchdoctor.scan(model, dtype="{low}")',
   ("Keep adapters in the base model's dtype", "model = get_peft_model(model, config, autocast_adapter_dtype=False)"),
   ("Or cast the adapted model once", "model.to(torch.{low})"))
_c("dt.bnb_compute_dtype",
   "A bitsandbytes 4/8-bit layer computes in its compute dtype (bnb_4bit_compute_dtype, float16 for 8-bit) "
   "while the rest of the model, the LoRA adapter or the norms kept in float32 use another one.",
   'torchdoctor.scan(model, dtype="{low}")',
   ("Use one dtype for the model and the quantization compute dtype",
    "cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)\n"
    "model = AutoModelForCausalLM.from_pretrained(name, quantization_config=cfg, torch_dtype=torch.bfloat16)"),
   ("Or train under autocast", 'with torch.autocast("cuda", dtype=torch.bfloat16):\n    loss = model(**batch).loss'))
_c("dt.accelerate_hook_dtype",
   "An accelerate hook moved the activations to the layer's device but not to its dtype; the layer (often a "
   "LayerNorm) holds another dtype than its input.", 'torchdoctor.scan(model, dtype="{low}")',
   ("Load every module with one torch_dtype",
    'model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.{low}, device_map="auto")'),
   ("Or run the forward under autocast", 'with torch.autocast("cuda", dtype=torch.{low}):\n    out = model(**inputs)'))
_c("dt.cpu_norm_mixed",
   "A half-precision model (or module) is running on the CPU: the GPU was not used, or this module was left "
   "behind or offloaded, and the CPU norms refuse a float32 input with {low} weights.", "torchdoctor env",
   ("Run the module in float32 on the CPU", "module.float()"),
   ("Or put it on the GPU it was meant for", 'module.to("cuda")'))
_c("dt.comfy_node_dtype",
   "A custom node feeds tensors in another dtype than the model ComfyUI loaded (its hint/image/embedding is "
   "float32 while the model runs in {low}, or its own module was cast differently).", "torchdoctor env",
   ("Run ComfyUI in one precision to confirm", "python main.py --force-fp32"),
   ("Update the custom node that failed", "git -C custom_nodes/<node> pull"))
_c("dt.webui_upcast",
   "The web UI runs the model in half precision while an extension / LoRA patch feeds float32 (upcast or "
   "no-half settings disagree between UNet, VAE and the patch).", "torchdoctor env",
   ("Run fully in float32 to confirm", "--no-half --no-half-vae"),
   ("Or upcast consistently", "--upcast-sampling"))
_c("dt.pipeline_latents",
   "The pipeline's latents or conditioning are float32 while the UNet/VAE is {low} (a component loaded with "
   "another torch_dtype, or a custom pipeline that does not cast).", 'torchdoctor.scan(pipe, dtype="{low}")',
   ("Load every component with the same torch_dtype",
    'pipe = DiffusionPipeline.from_pretrained(name, torch_dtype=torch.{low}).to("cuda")'),
   ("Cast inputs to the component's dtype", "latents = latents.to(pipe.unet.dtype)"))
_c("iw.model_not_on_device",
   "The input is on {input_device} but the layer's weights are on {weight_device}: the model was not moved "
   "(or only partly), or the input was not.", 'torchdoctor.scan(model, device="{target}")',
   ("Move the model to the input's device", 'model.to("{target}")'),
   ("Or move the input to the model's device", "x = x.to(next(model.parameters()).device)"), _MOVE)

# --- dtype not supported on the device ------------------------------------------------------------------------
_c("ud.half_on_cpu",
   "The model runs in {dtype} on the CPU, which has no {dtype} kernel for {kernel}: the GPU was not used "
   "(CPU-only torch, device left at cpu) or .half() is applied unconditionally.", "torchdoctor env",
   ("Use float32 on the CPU", "model = model.float()"),
   ("Choose the dtype from the device", "dtype = torch.float16 if torch.cuda.is_available() else torch.float32"),
   ("Check that this torch sees the GPU", "torchdoctor env"))
_c("ud.cpu_only_build",
   "A CPU-only build of torch is installed, so the half-precision model fell back to the CPU.", "torchdoctor env",
   ("Install a CUDA build of torch",
    "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu124"))
_c("ud.kernel_missing",
   "This device has no {dtype} kernel for {kernel}.", 'torchdoctor.simulate(model, device="{target}")',
   ("Run this op in float32", "out = op(x.float()).to(x.dtype)"),
   ("Pick a dtype the device supports", 'torchdoctor.recommend_dtype("{target}")'))
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
   ("Pick a dtype the device supports", 'torchdoctor.recommend_dtype("cuda")'))
_c("ud.scaled_mm_capability",
   "An fp8 'fast' / scaled-matmul mode is on, but torch._scaled_mm needs compute capability 8.9+ (RTX 40xx, "
   "H100); older GPUs can store fp8 weights but must compute in bf16/fp16.", "torchdoctor env",
   ("Turn off the fp8 fast / scaled-mm mode; keep fp8 only as storage",
    "# ComfyUI: weight_dtype fp8_e4m3fn instead of fp8_e4m3fn_fast"),
   ("Or compute in bfloat16", "model.to(torch.bfloat16)"))
_c("ud.fp8_promotion",
   "float8 is a storage format here: an fp8 weight met a {other_dtype} tensor in an op that would need "
   "type promotion, which PyTorch refuses for float8.", 'torchdoctor.scan(model, dtype="bfloat16")',
   ("Upcast fp8 weights before computing", "w = weight.to(x.dtype)\nout = torch.nn.functional.linear(x, w)"),
   ("Or keep this module in bf16", "module.to(torch.bfloat16)"))

# --- backend op missing ---------------------------------------------------------------------------------------
_c("bo.kernel_device_only",
   "{op} has kernels only for other backends; its {backend} inputs must move to a device that implements it.",
   'torchdoctor.simulate(model, device="{target}")',
   ("Run this op where it has a kernel", 'x = x.to("{available_device}")'))
_c("bo.ipex_xpu_op_on_cpu",
   "An IPEX fused op registered only for XPU ({op}) ran on CPU tensors: the model or inputs are on the CPU "
   "(or partly offloaded) while intel_extension_for_pytorch's XPU fusions are active; importing the XPU "
   "build of ipex in a CPU run also inserts them.", "torchdoctor env",
   ("Run the model and inputs on xpu", 'model = model.to("xpu")\ninputs = inputs.to("xpu")'),
   ("For a CPU-only run, drop the XPU build of IPEX", "# remove: import intel_extension_for_pytorch as ipex"))
_c("bo.torchvision_mismatch",
   "torchvision (or another extension) was built for a different torch or without {backend} kernels: a CPU "
   "or mismatched torchvision next to a {backend} torch.", "torchdoctor env",
   ("Reinstall torch and torchvision together from one index",
    "pip install --force-reinstall torch torchvision --index-url https://download.pytorch.org/whl/cu124"),
   ("Check the versions", "torchdoctor env"))
_c("bo.mps_fallback",
   "{op} has no MPS kernel in this PyTorch.", 'torchdoctor.simulate(model, device="mps")',
   ("Let unsupported ops fall back to the CPU", "export PYTORCH_ENABLE_MPS_FALLBACK=1"),
   ("Or run that step on the CPU", 'out = fn(x.cpu()).to("mps")'))
_c("bo.xformers_no_kernel",
   "xformers has no kernel for these inputs on this GPU: bf16 needs an A100-class GPU (compute 8.0+), some "
   "head sizes / bias layouts are unsupported, or xformers was built for another torch or CUDA.", "torchdoctor env",
   ("Use PyTorch's SDPA instead of xformers",
    "pipe.disable_xformers_memory_efficient_attention()  # or start without --xformers"),
   ("On pre-Ampere GPUs use float16", "pipe.to(torch.float16)"),
   ("Check the xformers build", "python -m xformers.info"))
_c("bo.scaled_mm_cpu",
   "fp8 scaled matmul (aten::_scaled_mm) only has a CUDA kernel; layers moved or offloaded to the CPU cannot run "
   "it.", 'torchdoctor.scan(model, device="cuda:0")',
   ("Keep fp8 layers on the GPU, or upcast them before offloading", "module.to(torch.bfloat16)"))

# --- loading checkpoints --------------------------------------------------------------------------------------
_c("ds.cpu_only_load",
   "The checkpoint was saved from {saved} and this process cannot use that device (CPU-only machine or torch "
   "build), so torch.load must map the storages.", 'torchdoctor.scan("checkpoint.pt")',
   ("Map the storages when loading", 'state = torch.load(path, map_location="cpu")'),
   ("Or load straight onto a device you have", 'state = torch.load(path, map_location="cuda:0")'))
_c("ds.gpu_invisible",
   "The machine has a GPU but this torch cannot see it (a CPU-only build, a driver too old for its CUDA, or "
   "CUDA_VISIBLE_DEVICES hides it).", "torchdoctor env",
   ("Find out why the GPU is invisible", "torchdoctor env"))
_c("ds.device_index",
   "The checkpoint was saved on {saved} but this process sees only {count} GPU(s).",
   'torchdoctor.scan("checkpoint.pt")',
   ("Remap the saved GPU index", 'state = torch.load(path, map_location={"{saved}": "cuda:0"})'))

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
   ("Pick the device at run time", "device = torchdoctor.pick_device()"),
   ("In a container, expose the GPU", "docker run --gpus all <image>"))
_c("na.ordinal",
   "The code asks for a GPU index that is not visible: a hard-coded cuda:1, a local_rank/world_size larger "
   "than the GPU count, or CUDA_VISIBLE_DEVICES limiting the list.", "torchdoctor env",
   ("Use an index that exists", 'device = torch.device("cuda:0")'),
   ("Or see how many GPUs this process has", 'python -c "import torch; print(torch.cuda.device_count())"'))
_c("na.arch_not_in_build",
   "The installed torch (or xformers / flash-attention / another compiled extension) was built without kernels "
   "for this GPU's compute capability: a new GPU (RTX 50xx, sm_120) with a wheel for an older CUDA, or an old "
   "GPU (GTX 10xx, sm_61) that a newer wheel dropped.", "torchdoctor env --probe",
   ("Compare the GPU's capability with the architectures the build has",
    'python -c "import torch; print(torch.cuda.get_device_capability(), torch.cuda.get_arch_list())"'),
   ("Install a build that covers this GPU (CUDA 12.8+ wheels for RTX 50xx)",
    "pip install --force-reinstall torch torchvision torchaudio --index-url https://download.pytorch.org/whl/cu128"))
_c("na.not_linked",
   "This torch has no {backend} backend: install a {backend} build of torch, or (older Intel setups) import "
   "intel_extension_for_pytorch before using 'xpu'.", "torchdoctor env",
   ("Pick the device at run time", "device = torchdoctor.pick_device()"),
   ("Intel GPUs with IPEX: import it first", "import torch\nimport intel_extension_for_pytorch as ipex"),
   ("Or install the XPU build of torch", "pip install torch --index-url https://download.pytorch.org/whl/xpu"))
_c("na.backend_not_in_build",
   "{op} has no {backend} kernel at all in this build: the installed torch does not include the {backend} backend.",
   "torchdoctor env",
   ("Install a torch build with that backend",
    "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu124"),
   ("Or pick the device at run time", "device = torchdoctor.pick_device()"))

# --- mixed-device models --------------------------------------------------------------------------------------
_c("md.ipex_optimize_mixed",
   "ipex.optimize / torch.xpu.optimize was called on a model that is partly on xpu and partly on the CPU "
   "(offloading, low-VRAM partial loading).", 'torchdoctor.scan(model, device="xpu:0")',
   ("Move the whole model before optimizing", 'model = model.to("xpu")\nmodel = ipex.optimize(model.eval())'),
   ("Or skip ipex.optimize for offloaded models", "# do not call ipex.optimize on a partially offloaded model"))
_c("md.meta_to",
   "Module.to()/.cuda() was called on a model whose weights are still meta placeholders (built under "
   "init_empty_weights / device='meta', or loaded with weights missing): there is no data to copy.",
   'torchdoctor.scan(model, device="{target}")',
   ("Materialise empty storage on the device, then load the weights",
    'model = model.to_empty(device="{target}")\nmodel.load_state_dict(state_dict)'),
   ("Or let from_pretrained place the weights", 'model = AutoModel.from_pretrained(name, device_map={"": "{target}"})'))
_c("md.offload_meta",
   "accelerate offloaded some weights (device_map='auto' with too little GPU memory, or sequential CPU "
   "offload): those modules hold meta placeholders and get real weights only inside their own hook; code that "
   "uses them outside the hook, or moves the model, meets meta.", "torchdoctor.scan(model)",
   ("See which modules were offloaded", "print(model.hf_device_map)"),
   ("Make it fit so nothing is offloaded (more memory, or a quantized variant)",
    'model = AutoModel.from_pretrained(name, device_map="auto", max_memory={0: "22GiB", "cpu": "64GiB"})'),
   ("For diffusers, prefer model offload to sequential offload", "pipe.enable_model_cpu_offload()"))
_c("md.peft_meta",
   "LoRA adapters were created while the base weights were on meta (peft creates adapters on the base layer's "
   "device), so the adapter weights are placeholders.", "torchdoctor.scan(model)",
   ("Add adapters after the base weights are loaded",
    'base = AutoModelForCausalLM.from_pretrained(name, device_map={"": 0})\nmodel = get_peft_model(base, config)'))
_c("md.fake_tensor",
   "Under FakeTensorMode / torch.compile / export tracing, a tensor on {a} met one on {b}: .to() inside the "
   "fake mode does not move real parameters, and constants created without device= are CPU tensors.",
   'torchdoctor.simulate(model, device="{target}")',
   ("Create constants on the input's device", "mask = torch.zeros(shape, device=x.device)"),
   ("Check the placement without the hardware", 'torchdoctor.simulate(model, device="{target}")'))

# --- quantization ---------------------------------------------------------------------------------------------
_c("q.bnb_state_cpu",
   "A bitsandbytes layer's quantization state (quant_state absmax/code, or SCB for 8-bit) is on another device "
   "than its packed weight: quant_state is not a parameter, so moving the layer piecemeal (weight.data = ..., a "
   "custom loader, partial/low-VRAM loading, an offload hook) leaves it behind.", _SCAN,
   ("Place quantized models when loading, not afterwards",
    'model = AutoModelForCausalLM.from_pretrained(name, quantization_config=cfg, device_map={"": "{target}"})'),
   ("Move a quantized layer as a whole (Params4bit.to moves quant_state too)", 'layer.to("{target}")'),
   ("Find every quant_state tensor on the wrong device", _SCAN))
_c("q.bnb_input_cpu",
   "The input reached a bitsandbytes layer on the CPU while its weights are on the GPU.", _GUARD,
   ("Put the input on the layer's device", "x = x.to(layer.weight.device)"))
_c("q.bnb_multi_gpu",
   "A bitsandbytes model split over GPUs by device_map: a quantized layer's weight/quant_state and its input "
   "ended up on different GPUs.", 'torchdoctor.scan(model)',
   ("Load the quantized model on one GPU",
    'model = AutoModelForCausalLM.from_pretrained(name, quantization_config=cfg, device_map={"": 0})'))
_c("q.bnb_to",
   ".to()/.cuda() is refused on bitsandbytes 4/8-bit models: quantized weights are placed when loading "
   "(device_map); some library versions call .to() themselves inside dispatch_model.", "torchdoctor env",
   ("Drop the .to()/.cuda() call and place the model when loading",
    'model = AutoModelForCausalLM.from_pretrained(name, quantization_config=cfg, device_map={"": "cuda:0"})'),
   ("If from_pretrained itself fails, align the versions", "pip install -U transformers accelerate bitsandbytes"))
_c("q.gptq_device",
   "A GPTQ/AWQ quantized layer's packed weights, scales or zeros sit on another device than its input.",
   "torchdoctor.scan(model)",
   ("Load the quantized model on one device", 'model = AutoModelForCausalLM.from_pretrained(name, device_map={"": 0})'))

# --- indexing -------------------------------------------------------------------------------------------------
_c("ix.table_on_cpu",
   "A lookup table created on the CPU (a diffusion schedule, a similarity matrix, a buffer that was not "
   "registered) was indexed with indices on the GPU.", _GUARD,
   ("Move the table to the index's device", "table = table.to(index.device)\nout = table[index]"),
   ("Or index with a CPU copy of the indices", "out = table[index.cpu()].to(index.device)"))

"""Causes of placement errors (devices, checkpoints, meta placeholders, quantized weights, indexing): data.

Prose uses ``{field}`` (a known default when the text does not name it) and ``[...]`` (dropped when a field inside
is unknown); code uses ``{field}`` and ``«...»`` the same way. A fix whose code needs a field the text does not give
(and that has no neutral default) is left out, so fixes never name a device or dtype the error did not.
"""

from __future__ import annotations

from torchdoctor._explain.causes import define_cause as _c

__all__: list[str] = []

_SCAN = "torchdoctor.scan(model«, device={tq}»)"
_GUARD = "with torchdoctor.guard(model):\n    model(*inputs)"
_MOVE = ("Move everything (parameters, buffers, plain tensor attributes) and verify",
         "torchdoctor.move(model, device={tq})")


# --- device ---------------------------------------------------------------------------------------------------
_c("dev.module_not_moved",
   "Part of the model was never moved to {target}: a submodule created or loaded after the .to() call, or a "
   "plain tensor attribute (not a parameter or buffer), which Module.to does not move.", _SCAN,
   ("Move the whole model after everything is attached", "model.to({tq})"), _MOVE)
_c("dev.inputs_not_moved",
   "The inputs (tokenizer or dataloader output, tensors made in the loop) are on another device than the model"
   "[: the two devices are {a} and {b}].", _GUARD,
   ("Put the inputs on the model's device", "x = x.to(next(model.parameters()).device)"))
_c("dev.created_inside",
   "A tensor created inside forward (torch.tensor/arange/zeros without device=, or a cached buffer) is on "
   "the CPU while the activations are on {target}.", _GUARD,
   ("Create new tensors on the input's device",
    "torch.arange(n, device=x.device)  # also torch.zeros(..., device=x.device)"))
_c("dev.attn_bias_device",
   "The attention bias or mask was made on another device than q/k/v: a mask built with device='cuda' (that is "
   "the current device, cuda:0, unless torch.cuda.set_device was called) while the model sits on another GPU, a "
   "mask kept on the CPU, or a KV cache that builds its mask on its own device.", _GUARD,
   ("Build the mask on the queries' device", "mask = torch.full((q_len, n), float('-inf'), device=q.device, "
    "dtype=q.dtype)"),
   ("Or move it where the attention runs", "attn_bias = attn_bias.to(q.device)"))
_c("dev.two_gpus_device_map",
   "The model is split over several GPUs (device_map), and a tensor crossed a layer boundary without being "
   "moved: custom code mixing outputs of two layers, a cached tensor on the first GPU, or .to()/.cuda() "
   "called on a dispatched model.", _GUARD,
   ("Put the inputs on the device of the model's first layer",
    "inputs = inputs.to(next(model.parameters()).device)  # transformers: model.get_input_embeddings().weight.device"),
   ("Or keep the whole model on one GPU", 'model = AutoModelForCausalLM.from_pretrained(name, device_map={"": 0})'),
   ("Never call .to()/.cuda() on a model loaded with device_map",
    "print(model.hf_device_map)  # and drop model.to(...) / model.cuda()"),
   ("Or let the process see one GPU only (multi-GPU code paths that are not device_map-safe)",
    "CUDA_VISIBLE_DEVICES=0 python your_script.py"))
_c("dev.first_device",
   "A multi-GPU wrapper (tensor_parallel, nn.DataParallel) keeps its master copy on the first device of its list "
   "and needs the inputs (and the module, before wrapping) there[: {b}].", _GUARD,
   ("Put the inputs on the first device", "input_ids = input_ids.to({bq})"),
   ("Move the model to the first device before wrapping it",
    "model = torch.nn.DataParallel(model.to({bq}), device_ids=[0, 1])"))
_c("dev.generator_device",
   "A torch.Generator made for one device drew random numbers for a tensor on another[ ({b} generator, {a} "
   "tensor)]: torch.randn/rand/randint/multinomial with generator= (a diffusers pipeline's generator, "
   "prepare_latents) need the generator on the device where the tensor is created.", _GUARD,
   ("Create the generator on the device the random tensor is made on",
    "generator = torch.Generator(device=latents.device).manual_seed(seed)"),
   ("Or draw on the generator's device, then move",
    "noise = torch.randn(shape, generator=generator, device=generator.device).to(device)"))
_c("dev.offloaded_cpu",
   "device_map put some modules on the CPU (too little GPU memory, or 'cpu' in the map); their weights reach "
   "{target} only inside their own accelerate hook, so a tensor they produce or a module called outside its hook "
   "stays on the CPU.", "torchdoctor.scan(model)",
   ("See which modules were placed on the CPU", "print(model.hf_device_map)"),
   ("Give the GPU enough room, or load on one device",
    'model = AutoModelForCausalLM.from_pretrained(name, device_map={"": 0}, {dtype_kw}="auto"){dtype_note}'))
_c("dev.offload_outside_hooks",
   "enable_model_cpu_offload() keeps each component on the CPU until its own forward hook moves it; a "
   "module used outside the hooks (a prompt-weighting helper calling the text encoder, an image projection or "
   "adapter added after offload was enabled, components shared between pipelines) stays on the CPU.",
   'torchdoctor.scan(pipe, device={tq})',
   ("Enable offload last, on the pipeline you call, after loading adapters", "pipe.enable_model_cpu_offload()"),
   ("Or skip offloading and move the whole pipeline", 'torchdoctor.move(pipe, device={tq})'))
_c("dev.app_offload",
   "The app's offload / low-VRAM mode keeps parts of the model on the CPU, and an extension or script ran a "
   "component outside the app's device handling.", "torchdoctor env",
   ("Retry with offloading off to confirm",
    "# SD.Next: Settings > Diffusers > Model offload mode: none\n# A1111/Forge: drop --medvram / --lowvram"),
   ("Update the extension or script that failed[ ({plugin_at})]", "git -C {ext_dir} pull"))
_c("dev.peft_adapter_device",
   "A LoRA adapter (lora_A/lora_B) is on another device than its base layer: adapters were added or loaded "
   "after the base model was moved or dispatched.", _SCAN,
   ("Move the model again after adding adapters", 'model = get_peft_model(model, config)\nmodel.to({tq})'), _MOVE)
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
   "A custom node[ ({plugin}, at {plugin_at})] keeps its own module or tensors on the CPU while ComfyUI's model "
   "management loaded the model to the GPU (or offloaded part of it under low VRAM).", _GUARD,
   ("Move the node's module to the device ComfyUI samples on[ (at {plugin_at})]",
    "import comfy.model_management as mm\nmodule.to(mm.get_torch_device())"),
   ("Update the custom node that failed[ ({plugin_at})]", "git -C {node_dir} pull"),
   ("Rule out partial loading", "python main.py --highvram"))

_c("dev.cuda_api_on_cpu",
   "A CUDA-only call (torch.cuda.set_device, a CUDA generator or stream, a library's CUDA kernel path) got a CPU "
   "device or tensor: the run (or this part of the model, after offloading) is on the CPU while this code path "
   "assumes CUDA.", _GUARD,
   ("Call CUDA-only APIs only for CUDA devices", 'if device.type == "cuda":\n    torch.cuda.set_device(device)'),
   ("Or create the generator on the device the tensors use",
    "generator = torch.Generator(device=latents.device).manual_seed(seed)"),
   ("Or move the model to the GPU before calling it", "model.to({tq})"))

_c("dev.numpy_on_gpu",
   "Code passed a GPU tensor to numpy (t.numpy(), np.asarray(t), matplotlib, scikit-learn, PIL): numpy needs a "
   "CPU copy.", _GUARD, ("Copy to the CPU first", "arr = t.detach().cpu().numpy()"))
# --- loading checkpoints --------------------------------------------------------------------------------------
_c("ds.cpu_only_load",
   "The checkpoint was saved from {saved} and this process cannot use that device (CPU-only machine or torch "
   "build, or a worker process started for a GPU that does not exist), so torch.load must map the storages.", 'torchdoctor.scan("checkpoint.pt")',
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

# --- mixed-device models --------------------------------------------------------------------------------------
_c("md.ipex_optimize_mixed",
   "ipex.optimize / torch.xpu.optimize was called on a model that is partly on xpu and partly on the CPU "
   "(offloading, low-VRAM partial loading).", 'torchdoctor.scan(model, device="xpu:0")',
   ("Move the whole model before optimizing", 'model = model.to("xpu")\nmodel = ipex.optimize(model.eval())'),
   ("Or skip ipex.optimize for offloaded models", "# do not call ipex.optimize on a partially offloaded model"))
_c("md.meta_to",
   "Module.to()/.cuda() was called on a model whose weights are still meta placeholders (built under "
   "init_empty_weights / device='meta', or loaded with weights missing): there is no data to copy.",
   _SCAN,
   ("Materialise empty storage on the device, then load the weights",
    'model = model.to_empty(device={tq})\nmodel.load_state_dict(state_dict)'),
   ("Or let from_pretrained place the weights", 'model = AutoModel.from_pretrained(name, device_map={"": {tq}})'))
_c("md.offload_meta",
   "accelerate offloaded some weights (device_map='auto' with too little GPU memory, or sequential CPU "
   "offload): those modules hold meta placeholders and get real weights only inside their own hook; code that "
   "uses them outside the hook, or moves the model, meets meta.", "torchdoctor.scan(model)",
   ("See which modules were offloaded", "print(model.hf_device_map)"),
   # a parent's forward reading a child's weight (child.alpha.item()) while only the child is offloaded
   ("Read an offloaded module's weights only inside its own forward (its hook loads them there), or offload the "
    "whole model as one unit", "cpu_offload(model, execution_device=device)  # not each child on its own"),
   ("Make it fit so nothing is offloaded (more memory, or a quantized variant)",
    'model = AutoModel.from_pretrained(name, device_map="auto", max_memory={0: "22GiB", "cpu": "64GiB"})'),
   ("For diffusers, prefer model offload to sequential offload", "pipe.enable_model_cpu_offload()"))
_c("md.peft_meta",
   "LoRA adapters were created while the base weights were on meta (peft creates adapters on the base layer's "
   "device), so the adapter weights are placeholders.", "torchdoctor.scan(model)",
   ("Add adapters after the base weights are loaded",
    'base = AutoModelForCausalLM.from_pretrained(name, device_map={"": 0})\nmodel = get_peft_model(base, config)'))
_c("md.fake_input_cpu",
   "The traced call's input ({fake_input}: a FakeTensor printed without device= is a CPU tensor) is on the CPU "
   "while the layer's parameters are on {wdev}: the input was never moved to the model's device (torch.compile "
   "traces the call with the devices it is given).", 'torchdoctor.simulate(model, device={tq})',
   ("Move the input to the model's device before calling the compiled model", "x = x.to({tq})"),
   ("Check the placement without the hardware", 'torchdoctor.simulate(model, device={tq})'))
_c("md.fake_tensor",
   "Under FakeTensorMode / torch.compile / export tracing, a tensor on {a} met one on {b}: .to() inside the "
   "fake mode does not move real parameters, and constants created without device= are CPU tensors.",
   'torchdoctor.simulate(model, device={tq})',
   ("Create constants on the input's device", "mask = torch.zeros(shape, device=x.device)"),
   ("Check the placement without the hardware", 'torchdoctor.simulate(model, device={tq})'))

# --- quantization ---------------------------------------------------------------------------------------------
_c("q.bnb_state_cpu",
   "A bitsandbytes layer's quantization state (quant_state absmax/code, or SCB for 8-bit) is on another device "
   "than its packed weight: quant_state is not a parameter, so moving the layer piecemeal (weight.data = ..., a "
   "custom loader, partial/low-VRAM loading, an offload hook) leaves it behind.", _SCAN,
   ("Place quantized models when loading, not afterwards",
    'model = AutoModelForCausalLM.from_pretrained(name, quantization_config=cfg, device_map={"": {tq}})'),
   ("Move a quantized layer as a whole (Params4bit.to moves quant_state too)", 'layer.to({tq})'),
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
   ("Load the quantized model on one device", 'model = AutoModelForCausalLM.from_pretrained(name, device_map={"": 0})'),
   ("Quantize / calibrate with one GPU visible (the calibration pass spreads layers over every visible GPU)",
    "CUDA_VISIBLE_DEVICES=0 python quantize.py"))

# --- indexing -------------------------------------------------------------------------------------------------
_c("ix.table_on_cpu",
   "A lookup table created on the CPU (a diffusion schedule, a similarity matrix, a buffer that was not "
   "registered) was indexed with indices on the GPU[ (the indexed tensor is on {a})].", _GUARD,
   ("Move the table to the index's device", "table = table.to(index.device)\nout = table[index]"),
   ("Or index with a CPU copy of the indices", "out = table[index.cpu()].to(index.device)"))


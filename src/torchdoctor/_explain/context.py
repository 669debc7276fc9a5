"""Context for ``explain``: facts derived from an error's fields, and the rules that let the surrounding
traceback (peft, bitsandbytes, IPEX, accelerate, diffusers offload, ComfyUI, SD.Next, ...) rank the causes
and pick between close categories. The rule table is data; see ``_explain_rules.ContextRule``.
"""

from __future__ import annotations

import re

from torchdoctor._explain.causes import ContextRule, register_rule

__all__ = ["derive", "rank"]

_ACCEL = ("cuda", "xpu", "mps", "hpu", "npu", "xla", "mtia", "privateuseone")
_DEVICE_TOKEN = re.compile(r"\b(cuda|xpu|mps|meta|hpu|npu|xla|cpu)(?::(\d{1,3}))?\b")
_DEVICE_REPR = re.compile(r"device\(type='(\w{1,12})'(?:, index=(\d{1,3}))?\)")

# dtype spellings in messages -> torch names
_DTYPES = {
    "float": "float32", "float32": "float32", "single": "float32", "half": "float16", "float16": "float16",
    "bfloat16": "bfloat16", "double": "float64", "float64": "float64", "long": "int64", "int64": "int64",
    "long int": "int64", "int": "int32", "int32": "int32", "bool": "bool", "byte": "uint8", "char": "int8",
    "short": "int16", "complexfloat": "complex64", "complexdouble": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2", "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e5m2fnuz": "float8_e5m2fnuz",
}
_LOW = ("float16", "bfloat16")
# legacy tensor type names: torch.cuda.HalfTensor, CUDABFloat16Type, MPSFloatType ...
_TYPE_NAME = re.compile(r"^(?:torch\.(?P<tdev>cuda|mps|xpu)\.|torch\.|(?P<pdev>CUDA|CPU|MPS|XPU))?"
                        r"(?P<dt>[A-Za-z0-9_]{1,20}?)(?:Tensor|Type)$")


def dtype_name(text: str) -> str | None:
    """``c10::BFloat16`` / ``Half`` / ``torch.float16`` / ``struct c10::Half`` -> torch dtype name."""
    t = text.strip().lower().replace("struct ", "").replace("c10::", "").replace("torch.", "")
    return _DTYPES.get(t)


def device_name(text: str) -> str | None:
    """A device as messages spell it -> ``cuda:0`` / ``cpu`` / ``meta`` (bare accelerators get index 0)."""
    t = text.strip().lower()
    t = {"gpu": "cuda"}.get(t, t)
    kind, _, index = t.partition(":")
    if kind not in _ACCEL and kind not in ("cpu", "meta"):
        return None
    if kind in _ACCEL:
        return f"{kind}:{index or 0}"
    return kind


def type_name(text: str) -> tuple[str | None, str | None]:
    """``torch.cuda.FloatTensor`` -> (``cuda``, ``float32``); ``c10::Half`` -> (None, ``float16``)."""
    t = text.strip().replace("struct ", "")
    plain = dtype_name(t)
    if plain:
        return None, plain
    m = _TYPE_NAME.match(t)
    if not m:
        return None, None
    dev = (m.group("tdev") or m.group("pdev") or "cpu").lower()
    return dev, dtype_name(m.group("dt"))


def derive(sig_name: str, fields: dict[str, str], message: str) -> tuple[dict[str, str], frozenset[str]]:
    """Normalise the extracted fields and add derived ones (``target``, ``low``, ``devices``...) and flags."""
    f = dict(fields)
    flags: set[str] = set()
    devices: list[str] = []

    def add_dev(d: str | None) -> None:
        if d and d not in devices:
            devices.append(d)

    for key in ("a", "b"):
        if key in f:
            d = device_name(f[key])
            if d:
                f[key] = d
                add_dev(d)
    if "input" in f and "weight" in f:  # conv/linear "Input type (X) and weight type (Y)"
        (di, ti), (dw, tw) = type_name(f["input"]), type_name(f["weight"])
        if di and dw and di != dw:
            flags.add("iw_device")
            f["input_device"], f["weight_device"] = di, dw
            f["diff"] = f"the input is on {di}, the {f.get('param', 'weight')} on {dw}"
            add_dev(device_name(di))
            add_dev(device_name(dw))
        if ti and tw and ti != tw:
            flags.add("iw_dtype")
            f["a"], f["b"] = ti, tw
            f.setdefault("diff", f"the input is {ti}, the {f.get('param', 'weight')} is {tw}")
    for m in _DEVICE_REPR.finditer(message[:4000]):
        add_dev(device_name(f"{m.group(1)}:{m.group(2)}" if m.group(2) else m.group(1)))
    if sig_name.startswith("deserialize"):
        backend = f.get("backend", "cuda").lower()
        f.setdefault("saved", f"{backend}:{f['index']}" if "index" in f else backend)
        add_dev(device_name(f["saved"].split(",")[0]))
    for m in _DEVICE_TOKEN.finditer(message[:600]) if not devices else ():
        add_dev(device_name(m.group(0)))

    dtypes = [d for d in (dtype_name(f.get(k, "")) for k in ("a", "b", "dtype")) if d]
    if "dtype" in f and dtype_name(f["dtype"]):
        f["dtype"] = dtype_name(f["dtype"]) or f["dtype"]
    if sig_name.startswith("dtype") or sig_name == "unsupported.fp8_promotion":
        for k in ("a", "b"):
            if k in f and dtype_name(f[k]):
                f[k] = dtype_name(f[k]) or f[k]
    low = next((d for d in dtypes if d in _LOW or d.startswith("float8")), None)
    high = next((d for d in dtypes if d != low), None)
    f.setdefault("low", low if low and not low.startswith("float8") else "float16")
    f.setdefault("high", high or "float32")
    f.setdefault("other_dtype", next((d for d in dtypes if not d.startswith("float8")), "another dtype"))
    f.setdefault("fp_eight", next((d for d in dtypes if d.startswith("float8")), "float8"))

    if "method" in f:
        op = re.sub(r"^wrapper_+(?:CUDA_+|XPU_+|MPS_+|CPU_+)?", "", f["method"])
        f.setdefault("op", op.strip("_") or f["method"])
    kernel = f.get("kernel", "").lower()
    if kernel:
        kdev = next((d for d in ("cpu", "mps", "cuda", "xpu") if d in kernel.split("_")), None)
        f["device"] = kdev or "cpu"
        flags.add(f"kernel_{kdev or 'cpu'}")
        add_dev(device_name(kdev or "cpu"))
    op = f.get("op", "")
    backend = f.get("backend", "").lower()
    if backend:
        add_dev(device_name(backend))
    if op.startswith("torch_ipex::"):
        flags.add("op_ipex")
    if op.startswith(("torchvision::", "torchaudio::")):
        flags.add("op_torchvision")
    if "_scaled_mm" in op:
        flags.add("op_scaled_mm")
    available = f.get("available", "")
    if available:
        names = [a.strip() for a in available.split(",")]
        f["available_short"] = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        f["available_device"] = next((n.lower() for n in names if n.lower() in _ACCEL), "cuda")
        if (op.startswith("aten::") and backend.split("_")[0] in _ACCEL + ("hip",)
                and backend.upper() not in (n.upper() for n in names)):
            flags.add("backend_absent")

    accels = [d for d in devices if d.split(":")[0] in _ACCEL]
    if "meta" in devices:
        flags.add("meta")
    if len(set(accels)) >= 2:
        flags.add("two_accels")
    if accels and "cpu" in devices:
        flags.add("cpu_and_accel")
    for d in devices:
        flags.add(d.split(":")[0])
    for d in dtypes:
        flags.add({"float16": "half", "bfloat16": "bf16", "float64": "fp64"}.get(d, d))
        if d.startswith("float8"):
            flags.add("fp8")
    f["target"] = accels[0] if accels else ("xpu:0" if "op_ipex" in flags else "cuda:0")
    f["device_type"] = f["target"].split(":")[0]
    if devices:
        f["devices"] = ", ".join(devices)
    return f, frozenset(flags)


def _rule(name: str, words: tuple[str, ...] = (), flags: tuple[str, ...] = (), applies_to: tuple[str, ...] = (),
          category: str | None = None, unless: tuple[str, ...] = (), **boosts: float) -> None:
    register_rule(ContextRule(name, words, flags, applies_to, category,
                              tuple((k.replace("__", "."), v) for k, v in boosts.items()), unless))


_DEV, _DT, _IW = "device_mismatch", "dtype_mismatch", "input_weight_type_mismatch"
_MIX, _Q, _NA = "mixed_device_model", "quantization_device", "no_accelerator"
_BO, _UD, _DS = "backend_op_missing", "unsupported_dtype_on_device", "deserialize_device"
BNB = ("bitsandbytes", "params4bit", "int8params", "quant_state", "linear4bit", "linear8bitlt", "matmul_4bit",
       "dequantize_4bit", "matmul8bitlt", "load_in_4bit", "load_in_8bit", "bnb_4bit", "bnb.nn", ".scb",
       "functional_linear_4bits", "nf4", "qlora", "kbit_training")
PEFT = ("/peft/", "peft_model", "get_peft_model", "loralayer", "lora_a", "lora_b", "tuners/lora", "peftmodel",
        "from peft", "lora_up", "lora_down", "lora_te_", "enable_lora")
ACCEL = ("accelerate/hooks.py", "_hf_hook", "aligndeviceshook", "dispatch_model", "device_map", "big_modeling",
         "hf_device_map", "new_forward")
IPEX = ("intel_extension_for_pytorch", "torch_ipex", "ipex.optimize", "ipex_llm", "ipex-llm", "bigdl",
        "xpu.optimize", "intel-extension-for-pytorch", "import ipex")
COMFY = ("comfyui", "comfy/", "custom_nodes", "!!! exception during processing", "ksampler", "comfy.")
WEBUI = ("sdnext", "sd.next", "vladmandic", "| sd |", "stable-diffusion-webui", "sd_hijack", "extensions-builtin",
         "webui", "modules/processing.py", "sd_samplers")

# Re-filing first (the first rule that re-files wins), then boosts from every rule that fires.
_rule("meta_device", flags=("meta",), applies_to=(_DEV,), category=_MIX, md__offload_meta=3.0, md__meta_to=2.5)
_rule("bnb_cpu", BNB, ("cpu_and_accel",), (_DEV,), _Q, q__bnb_state_cpu=3.0)
_rule("bnb_two_gpus", BNB, ("two_accels",), (_DEV,), _Q, q__bnb_multi_gpu=4.0)
_rule("bnb_device", BNB, (), (_DEV,), _Q, q__bnb_state_cpu=2.0)
_rule("gptq_device", ("auto_gptq", "gptq", "awq", "exllama", "marlin"), (), (_DEV,), _Q, q__gptq_device=3.0)
_rule("aten_backend_absent", flags=("backend_absent",), applies_to=(_BO,), category=_NA,
      na__backend_not_in_build=6.0)
_rule("ipex_op", flags=("op_ipex",), applies_to=(_BO,), bo__ipex_xpu_op_on_cpu=4.0)
_rule("torchvision_op", flags=("op_torchvision",), applies_to=(_BO,), unless=("mps",), bo__torchvision_mismatch=4.0)
_rule("scaled_mm_op", flags=("op_scaled_mm",), applies_to=(_BO,), bo__scaled_mm_cpu=4.0)
_rule("fp8_dtype", flags=("fp8",), applies_to=(_DT, _IW), dt__fp8_storage=4.0)
_rule("bnb_dtype", BNB, (), (_DT, _IW), dt__bnb_compute_dtype=3.0)
_rule("peft_device", PEFT, (), (_DEV, _Q), dev__peft_adapter_device=2.5)
_rule("peft_dtype", PEFT, (), (_DT, _IW), dt__peft_adapter_dtype=3.0)
_rule("peft_meta", PEFT, (), (_MIX,), md__peft_meta=4.0)
_rule("accelerate_two_gpus", ACCEL, ("two_accels",), (_DEV,), dev__two_gpus_device_map=3.0)
_rule("accelerate_cpu", ACCEL, ("cpu_and_accel",), (_DEV,), dev__offloaded_cpu=3.0)
_rule("accelerate_dtype", ACCEL, (), (_DT, _IW), dt__accelerate_hook_dtype=2.5)
_rule("accelerate_meta", ACCEL, (), (_MIX,), md__offload_meta=2.5)
_rule("two_gpus", flags=("two_accels",), applies_to=(_DEV,), dev__two_gpus_device_map=1.5, dev__inputs_not_moved=1.0)
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
_rule("comfy_device", COMFY, (), (_DEV,), dev__comfy_custom_node=2.5)
_rule("comfy_dtype", COMFY, (), (_DT, _IW), dt__comfy_node_dtype=3.0)
_rule("webui_device", WEBUI, (), (_DEV,), dev__app_offload=2.5)
_rule("webui_dtype", WEBUI, (), (_DT, _IW), dt__webui_upcast=3.0)
_rule("sd_scripts", ("sd-scripts", "train_network.py", "sdxl_train", "train_util.py", "kohya"), (), (_DT, _IW),
      dt__module_partially_cast=1.5)
_rule("diffusers_dtype", ("diffusers/", "unet_2d_condition", "diffusionpipeline", "stablediffusion", "pipelines/"),
      (), (_DT, _IW), dt__pipeline_latents=3.0)
_rule("module_to", ("in _apply", "in convert", "self._apply(convert)", "return t.to(", "model.to("), (), (_MIX,),
      md__meta_to=2.0)
_rule("iw_device", flags=("iw_device",), applies_to=(_IW,), iw__model_not_on_device=3.0)
_rule("iw_dtype", flags=("iw_dtype",), applies_to=(_IW,), dt__input_not_cast=1.0, iw__model_not_on_device=-2.0)
_rule("cpu_build", ("+cpu", "cpu-only", "cpu only", "cuda used to build pytorch: none", "is cuda available: false",
                    "cpu版本", "cpu version"), (), (_UD, _NA, _DS), ud__cpu_only_build=3.5, na__cpu_build=2.0,
      ds__gpu_invisible=1.0)
_rule("gpu_present", ("nvidia-smi", "driver version", "geforce", "rtx", "is_available() is true", "available() :true"),
      (), (_NA, _DS), ds__gpu_invisible=2.5, na__cpu_build=1.0)
_rule("mac", ("/users/", "macos", "darwin", "macbook", "apple", "mps"), (), (_NA,), na__mac=3.0)
_rule("hardcoded_cuda", (".cuda()", "device='cuda'", 'device="cuda"', "use_gpu", ".cuda("), (), (_NA,),
      na__hardcoded_cuda=1.5)
_rule("mps_bf16", flags=("mps", "bf16"), applies_to=(_UD,), ud__mps_bf16=4.0)
_rule("mps_kernel", flags=("kernel_mps",), applies_to=(_UD,), ud__kernel_missing=2.0)
_rule("gpu_kernel", flags=("kernel_cuda",), applies_to=(_UD,), ud__kernel_missing=2.5)
_rule("fp8_block_swap", ("block swap", "swapping", "cpu donor", "distorch", "donor"), (), (_BO,), bo__scaled_mm_cpu=1.0)


# Which causes make sense under each category (a rule may fire for several categories).
_FAMILIES = {_DEV: ("dev.",), _Q: ("q.", "dev."), _MIX: ("md.", "dev."), _IW: ("iw.", "dt."), _DT: ("dt.",),
             _UD: ("ud.",), _BO: ("bo.",), _DS: ("ds.",), _NA: ("na.", "bo."), "cpu_gpu_indexing": ("ix.",)}


def rank(category: str, base: tuple[tuple[str, float], ...], context: str, flags: frozenset[str],
         rules: tuple[ContextRule, ...]) -> tuple[str, list[tuple[str, float]], list[tuple[ContextRule, str]]]:
    """Apply the rules: the (possibly re-filed) category, causes best first, and the rules that fired with
    the word that fired them (for the evidence)."""
    scores: dict[str, float] = {}
    for cid, w in base:
        scores[cid] = scores.get(cid, 0.0) + w
    fired: list[tuple[ContextRule, str]] = []
    refiled = category
    present = {w for w in {w for r in rules for w in r.words} if w in context}  # one pass per word
    for rule in rules:
        if rule.applies_to and category not in rule.applies_to and refiled not in rule.applies_to:
            continue
        if not all(fl in flags for fl in rule.flags) or any(fl in flags for fl in rule.unless):
            continue
        word = next((w for w in rule.words if w in present), None) if rule.words else ""
        if word is None:
            continue
        if rule.category and refiled == category and category in rule.applies_to:
            refiled = rule.category
        for cid, w in rule.boosts:
            scores[cid] = scores.get(cid, 0.0) + w
        fired.append((rule, word))
    families = _FAMILIES.get(refiled, ())
    ranked = sorted(((c, s) for c, s in scores.items() if s > 0 and c.startswith(families)), key=lambda cs: -cs[1])
    return refiled, ranked, fired

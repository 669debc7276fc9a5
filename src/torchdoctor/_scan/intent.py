"""What correct real-world models do on purpose, read from the objects themselves (never by running user code).

The placement policy (``torchdoctor._scan.policy``) asks these questions before calling anything a problem:
which dtypes are storage or metadata, which modules are normalisation layers, which names a class keeps in fp32,
which modules are peft adapters, which modules sit under an accelerate offload hook, whether a bitsandbytes model
keeps its other weights in fp32 (``prepare_model_for_kbit_training``), what a transformers model declares as its
dtype, and whether a module's own code moves or rebuilds a plain tensor attribute before using it.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
from torch import nn

from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from torchdoctor._placement import PACKED_DTYPES, same_device
from torchdoctor._scan import direct, percall
from torchdoctor._walk import Entry, hook_chain, is_quant_type

# Packed / quantized storage dtypes: no dtype expectation (a float8 weight with a bf16 compute dtype is by design),
# and a cast never touches them.
STORAGE_DTYPES = PACKED_DTYPES
LOW_PRECISION = frozenset({torch.float16, torch.bfloat16})

# accelerate hooks that keep a module at rest on the CPU and move it to ``execution_device`` for each call
# (``enable_model_cpu_offload``, ``cpu_offload_with_hook``): at rest on cpu is their design, not a leftover.
_OFFLOAD_HOOKS = frozenset({"CpuOffload", "UserCpuOffloadHook"})
# Plain attributes real libraries keep on the construction device and move at use (transformers' rotary
# ``original_inv_freq`` before it became a buffer: ``dynamic_rope_update`` calls ``.to(device)`` on it).
# (patterns are kept as text: ``re`` compiles and caches one at its first use, not at every import)
_MOVED_AT_USE = r"(^|_)original_inv_freq$"

_IS_NORM: dict[type, bool] = {}
NORM_TYPES = _IS_NORM  # read by ``tally`` per tensor without a call
_TYPE_FACTS: dict[type, tuple[tuple[str, ...], bool]] = {}
_SELF_MANAGED: dict[type, frozenset[str]] = {}


def is_norm(module: nn.Module | None) -> bool:
    """A normalisation layer (fp32 weights accept low-precision inputs), not a weight parametrisation."""
    if module is None:
        return False
    tp = type(module)
    hit = _IS_NORM.get(tp)
    if hit is None:
        name = tp.__name__.lower()
        hit = _IS_NORM[tp] = "norm" in name and "weightnorm" not in name and "spectralnorm" not in name
    return hit


def judged_float(t: torch.Tensor) -> bool:
    """A floating tensor whose dtype has an expectation (not packed float8/float4 storage, not packed 4-bit
    data stored in a float dtype)."""
    return t.is_floating_point() and t.dtype not in STORAGE_DTYPES and not packed_param(t)


def packed_param(t: torch.Tensor) -> bool:
    """A bitsandbytes ``Params4bit`` already quantized: packed 4-bit data whatever dtype stores it
    (``quant_storage=torch.bfloat16`` for QLoRA with FSDP keeps the packed bytes in a bf16 tensor). Casting it
    scrambles the weights."""
    tp = type(t)
    if tp is torch.Tensor or tp is nn.Parameter or tp.__name__ != "Params4bit":
        return False
    d = t.__dict__
    return bool(d.get("bnb_quantized")) or d.get("quant_state") is not None


def cpu_packed(t: torch.Tensor) -> bool:
    """A ``Params4bit`` in bitsandbytes' CPU layout (``quant_state.packing_format_for_cpu``): what its first eval
    forward makes on a CPU with AVX512-BF16. Only the CPU kernel reads it; ``Params4bit.to()`` keeps it (only
    ``.cuda()`` / ``.xpu()`` unpack), so on another device the layer computes garbage or fails."""
    tp = type(t)  # (a virtual run's twin is ``VirtualParams4bit``)
    if tp is torch.Tensor or tp is nn.Parameter or not tp.__name__.endswith("Params4bit"):
        return False
    return bool(getattr(t.__dict__.get("quant_state"), "packing_format_for_cpu", False))


def unused_quant_field(e: Any) -> bool:
    """``offset`` of a bitsandbytes QuantState that is not nested (the CPU repack un-nests it and leaves ``offset``
    behind): nothing reads it, and ``QuantState.to`` does not move it."""
    return e.key == "offset" and type(e.owner).__name__ == "QuantState" and \
        getattr(e.owner, "nested", True) is False


_TORCH_FORWARD: dict[type, bool] = {}
_SWITCHED: dict[type, bool] = {}  # a torch layer's subclass that casts its weight only behind a switch


def computes_in_storage(module: nn.Module | None, name: str | None = None) -> bool:
    """A module whose forward is torch's own (``nn.Linear``, ``nn.Conv2d``, ``nn.Embedding``, ...) with nothing
    that could upcast its weights first: no forward replaced on the instance (accelerate's and diffusers' hooks,
    diffusers ``enable_layerwise_casting``) and no forward pre-hook. float8/float4 storage there is used as it is,
    which torch refuses ("Promotion for Float8 Types is not supported", no float8 matmul without scales).
    With ``name``: also a module of any class whose own forward hands that tensor as it is to a torch compute
    function (``F.linear(x, self.weight)``) and casts it nowhere."""
    if module is None or "forward" in module.__dict__ or module._forward_pre_hooks:
        return False
    tp = type(module)
    hit = _TORCH_FORWARD.get(tp)
    if hit is None:
        fwd = getattr(tp, "forward", None)
        hit = _TORCH_FORWARD[tp] = (getattr(fwd, "__module__", "") or "").startswith("torch.nn.modules.")
    if hit:
        return True
    if name is not None and name in direct.direct_operands(tp) \
            and not percall.moved_on_call(module).get(name, 0) & percall.DTYPE:
        return True
    # a torch layer's subclass whose forward casts its weight only behind a switch (ComfyUI's
    # ``comfy_cast_weights``, Forge's ``parameters_manual_cast``) and otherwise runs the torch layer's own code:
    # with the switch off on this instance it computes with the storage as it is
    switched = _SWITCHED.get(tp)
    if switched is None:
        p = percall.plan(tp)
        switched = _SWITCHED[tp] = p is not None and not p[0].get("weight", 0) & percall.DTYPE \
            and any(moved.get("weight", 0) & percall.DTYPE for _, _, moved in p[1]) \
            and any(_TORCH_FORWARD.get(k) or (getattr(k.__dict__.get("forward"), "__module__", "") or "")
                    .startswith("torch.nn.modules.") for k in tp.__mro__[1:] if "forward" in k.__dict__)
    return switched and not percall.moved_on_call(module).get("weight", 0) & percall.DTYPE


def cast_switch(module: nn.Module | None) -> str | None:
    """The instance attributes that switch on the per-call cast of this layer's weight (``comfy_cast_weights``),
    for a layer whose class casts only behind a switch; None otherwise."""
    if module is None or not _SWITCHED.get(type(module)):
        return None
    p = percall.plan(type(module))
    names = [n for ns, _, moved in (p[1] if p else []) if moved.get("weight", 0) & percall.DTYPE for n in ns]
    return ", ".join(f"`{n}`" for n in dict.fromkeys(names)) or None


def type_facts(tp: type) -> tuple[tuple[str, ...], bool]:
    """(``_keep_in_fp32_modules`` names as ``.name.`` fragments, is a peft tuner layer) of a module class."""
    hit = _TYPE_FACTS.get(tp)
    if hit is None:
        kept: list[str] = []
        for attr in ("_keep_in_fp32_modules", "_keep_in_fp32_modules_strict"):
            names = getattr(tp, attr, None)
            if isinstance(names, (list, tuple, set)):
                kept.extend(f".{n}." for n in names if isinstance(n, str))
        hit = _TYPE_FACTS[tp] = (tuple(kept), (tp.__module__ or "").startswith("peft.tuners"))
    return hit


def packed_scale(e: Entry) -> bool:
    """A ``*scale*`` tensor of a module that holds float8/float4 storage (transformers ``FP8Linear.weight_scale_inv``,
    ``FP8Embedding.weight_scale``): quantization metadata in its own precision, not the model's dtype."""
    key, mod = e.key, e.module
    if not isinstance(key, str) or "scale" not in key.lower() or mod is None or e.owner is not mod:
        return False
    d = mod.__dict__
    return any(isinstance(v, torch.Tensor) and v.dtype in STORAGE_DTYPES
               for v in (*(d.get("_parameters") or {}).values(), *(d.get("_buffers") or {}).values()))


def quantized_wrapper(t: torch.Tensor) -> bool:
    """A ``__tensor_flatten__`` wrapper of a quantization library (torchao, optimum-quanto): its own metadata."""
    tp = type(t)
    if tp is torch.Tensor or tp is nn.Parameter or not is_quant_type(tp):
        return False
    try:
        return bool(is_traceable_wrapper_subclass(t))
    except Exception:
        return False


def is_bnb_layer(module: nn.Module | None) -> bool:
    """A bitsandbytes quantized layer (``Linear4bit``, ``Linear8bitLt``, their subclasses)."""
    return module is not None and (type(module).__module__ or "").startswith("bitsandbytes")


def follows_input(e: Entry) -> bool:
    """The bias of a bitsandbytes layer: cast to the input's dtype by the layer's own forward."""
    return e.key == "bias" and e.role == "parameter" and is_bnb_layer(e.module)


def _chain(hook: Any) -> list[tuple[Any, dict[str, Any]]]:
    return [(h, _dict(h)) for h in hook_chain(hook)]


def _offloads(h: Any, hd: dict[str, Any]) -> bool:
    return type(h).__name__ in _OFFLOAD_HOOKS or bool(hd.get("offload")) or type(h).__name__ == "GroupOffloadingHook" \
        or app_hook(type(h))


_APP_HOOKS: dict[type, bool] = {}


def app_hook(tp: type) -> bool:
    """An app's own accelerate ``ModelHook`` subclass (SD.Next balanced offload's ``OffloadHook``): its
    ``pre_forward`` is the app's code, not accelerate's, and with an ``execution_device`` it brings the module there
    for the call (SD.Next dispatches and moves it in ``pre_forward``, and moves it back to the cpu between calls).
    accelerate's own hooks (``AlignDevicesHook``: ``offload`` says whether it moves anything) keep their meaning."""
    hit = _APP_HOOKS.get(tp)
    if hit is None:
        owner = next((k for k in tp.__mro__ if "pre_forward" in k.__dict__), None)
        bases = {k.__name__ for k in tp.__mro__}
        hit = _APP_HOOKS[tp] = owner is not None and "ModelHook" in bases and not (
            owner.__module__ or "").startswith(("accelerate.", "diffusers.")) and "SequentialHook" not in bases
    return hit


def offload_owner(hook: Any) -> str:
    """Who moves an offloaded module at call, as the scan summary names it."""
    chain = hook_chain(hook)
    if any(type(h).__name__ == "GroupOffloadingHook" for h in chain):
        return "diffusers group offloading"
    own = next((type(h) for h in chain if app_hook(type(h))), None)
    return f"the app's {own.__name__} (an accelerate ModelHook)" if own is not None else "accelerate"


def offload_device(hook: Any) -> torch.device | None:
    """The execution device of an accelerate hook (or the onload device of a diffusers group offloading hook, or
    an app's own hook: ``app_hook``) that keeps its module at rest elsewhere (None otherwise). An app may set
    ``execution_device`` on the outer hook (``module._hf_hook.execution_device = ...`` on a ``SequentialHook``)."""
    outer = _dict(hook)
    for h, hd in _chain(hook):
        if _offloads(h, hd):
            dev = hd.get("execution_device", outer.get("execution_device"))
            if dev is None and app_hook(type(h)):
                dev = getattr(type(h), "execution_device", None)
                if dev is None:
                    continue  # an app's hook that names no device (a logger, a timer) moves nothing
            if dev is None and hd.get("group") is not None:
                dev = _dict(hd["group"]).get("onload_device")
            try:  # accelerate's integer device is an index of the accelerator
                return torch.device("cuda", dev) if isinstance(dev, int) and not isinstance(dev, bool) else \
                    torch.device(dev) if dev is not None else torch.device("cpu")
            except (RuntimeError, TypeError):
                return torch.device("cpu")
    return None


def patcher_state(holder: Any, module: nn.Module) -> tuple[torch.device, bool] | None:
    """(load device, loaded there now) of a module an app's model patcher holds (ComfyUI's and Forge's
    ``ModelPatcher``: ``load_device`` and ``offload_device`` beside the model), or None. Loaded: the patcher says so
    (Forge ``current_device``), or the model does (ComfyUI ``model.device``, ``model_lowvram`` for a partial load,
    whose layers left on the offload device cast per call); otherwise it rests on the offload device until the app
    loads it for sampling."""
    hd = _dict(holder)
    load, off = _device_of(hd.get("load_device")), _device_of(hd.get("offload_device"))
    if load is None or off is None or same_device(load, off):
        return None
    md = module.__dict__
    cur, at = _device_of(hd.get("current_device")), _device_of(md.get("device"))
    loaded = (cur is not None and same_device(cur, load)) or (at is not None and same_device(at, load)) or \
        md.get("model_lowvram") is True
    return load, loaded


def _device_of(v: Any) -> torch.device | None:
    if isinstance(v, torch.device):
        return v
    if isinstance(v, str):
        try:
            return torch.device(v)
        except (RuntimeError, TypeError):
            return None
    return None


def dispatch_device(hook: Any) -> torch.device | None:
    """Where a dispatching accelerate hook (``device_map``, no offload) keeps its module's weights."""
    for h, hd in _chain(hook):
        if _offloads(h, hd):
            return None
        dev = hd.get("execution_device")
        if dev is not None:
            try:  # accelerate's integer device is an index of the accelerator
                return torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
            except (RuntimeError, TypeError):
                return None
    return None


def declared_dtype(module: nn.Module) -> torch.dtype | None:
    """The dtype a transformers model declares (``config.dtype`` / ``torch_dtype``, set by ``from_pretrained``)."""
    config = module.__dict__.get("config")
    if config is None:
        return None
    cd = _dict(config)
    for key in ("dtype", "torch_dtype", "_dtype"):
        value = cd.get(key)
        if isinstance(value, torch.dtype):
            return value if value.is_floating_point else None
        if isinstance(value, str) and value not in ("auto", ""):
            dt = getattr(torch, value.removeprefix("torch."), None)
            if isinstance(dt, torch.dtype) and dt.is_floating_point:
                return dt
    return None


_BNB: dict[type, bool] = {}


def kbit_model(modules: list[tuple[str, nn.Module]]) -> bool:
    """A model with bitsandbytes layers (its other float32 weights are on purpose only where ``kbit_prepared`` finds
    the marks of ``prepare_model_for_kbit_training``)."""
    cache = _BNB
    for _, m in modules:
        tp = type(m)
        hit = cache.get(tp)
        if hit is None:
            hit = bnb_type(tp)
        if hit:
            return True
    return False


def kbit_prepared(modules: list[tuple[str, nn.Module]], params: list[torch.Tensor]) -> bool:
    """Marks ``peft.prepare_model_for_kbit_training`` leaves on a bitsandbytes model, the evidence that its float32
    weights are on purpose: the input-require-grads hook (transformers ``enable_input_require_grads`` keeps it as
    ``_require_grads_hook(s)``; older peft hooks the input embeddings with ``make_inputs_require_grad``), gradient
    checkpointing switched on, or its cast itself (``use_gradient_checkpointing=False`` leaves only this): every
    float parameter outside the 4-bit storage and the adapters float32 or wider, and all of them frozen.
    ``params``: those parameters (the caller leaves out packed storage and adapters)."""
    for _, m in modules:
        d = m.__dict__
        if d.get("_require_grads_hook") is not None or d.get("_require_grads_hooks") or \
                d.get("gradient_checkpointing") is True:
            return True
        for h in (d.get("_forward_hooks") or {}).values():
            if getattr(h, "__name__", "").startswith("make_inputs_require_grad"):
                return True
    return bool(params) and all(p.dtype not in LOW_PRECISION and not p.requires_grad for p in params)


def bnb_type(tp: type) -> bool:
    """A bitsandbytes module class (cached per class)."""
    hit = _BNB.get(tp)
    if hit is None:
        hit = _BNB[tp] = (tp.__module__ or "").startswith("bitsandbytes")
    return hit


def self_managed(module: nn.Module, name: str) -> bool:
    """The module's own code moves or rebuilds attribute ``name`` when it runs (``self.pe = self.pe.to(x.device)``,
    a cache rebuilt when the input's device or dtype changes), so where it sits between calls is intended."""
    if re.search(_MOVED_AT_USE, name):
        return True
    if percall.moved_on_call(module).get(name, 0) & percall.DEVICE:  # read from its forward's code
        return True
    tp = type(module)
    names = _SELF_MANAGED.get(tp)
    if names is None:
        names = _SELF_MANAGED[tp] = _managed_names(tp)
    return name in names


# ``self.x.to(`` / ``self.x.type_as(`` / ``self.x.cuda(`` ... at use, or ``self.x = ...`` outside __init__.
_MOVED = r"self\.(\w+)\s*(?:\[[^\]]*\]\s*)?\.(?:to|type_as|cuda|cpu|xpu|half|float|bfloat16|double)\s*\("
_ASSIGNED = r"self\.(\w+)\s*=(?!=)"
_DEF = r"(?m)^\s*def\s+(\w+)"


def _managed_names(tp: type) -> frozenset[str]:
    names: set[str] = set()
    for klass in tp.__mro__:
        mod = klass.__module__ or ""
        if klass is nn.Module or mod.startswith("torch.nn") or klass is object:
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        names.update(re.findall(_MOVED, source))
        # an assignment outside __init__ rebuilds the attribute at run time, but only a rebuild that looks at
        # the attribute's device or dtype follows the input (a cache built once on the first forward does not)
        parts = re.split(_DEF, source)
        for i in range(1, len(parts) - 1, 2):
            if parts[i] != "__init__":
                body = parts[i + 1]
                names.update(n for n in re.findall(_ASSIGNED, body)
                             if re.search(rf"self\.{n}\s*\.\s*(?:device|dtype|is_cuda)\b", body))
    return frozenset(names)


def adapter_majority(floats: list[Entry], elsewhere: dict[torch.dtype, int] | None = None) -> torch.dtype:
    """An adapter's dtype: its own majority; a tie goes to the dtype the same adapter has in the other layers
    (one cast tensor among many adapters), then to lora_A's (peft casts the input to it)."""
    counts: dict[torch.dtype, int] = {}
    for e in floats:
        counts[e.tensor.dtype] = counts.get(e.tensor.dtype, 0) + 1
    a_dtype = next((e.tensor.dtype for e in floats if ".lora_A." in f".{e.path}."), None)
    other = elsewhere or {}
    return max(counts, key=lambda d: (counts[d], other.get(d, 0) - counts[d], d == a_dtype))


def _dict(obj: Any) -> dict[str, Any]:
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return {}
    return d if isinstance(d, dict) else {}

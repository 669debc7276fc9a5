"""The one placement policy: for every tensor, the device and dtype it should have, and whether a deviation is a
problem or intended.

Correct real-world models differ on purpose (fp32 peft adapters over a bf16 base, ``_keep_in_fp32_modules``, fp32
norms, rotary buffers computed in fp32, scheduler tensors, quantization metadata); scan, move's plan and guard
all read those decisions here, so they never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchdoctor._move.owners import is_quantized_owner, is_wrapper
from torchdoctor._placement import device_str, dtype_str, same_device
from torchdoctor._report.model import Problem, TensorInfo
from torchdoctor._walk import Entry, Walk

STORAGE_DTYPES = frozenset(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                        "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2")
                           if hasattr(torch, n))


def packed_scale(e: Entry) -> bool:
    """A ``*scale*`` tensor of a module that holds float8/float4 storage (transformers ``FP8Linear.weight_scale_inv``,
    ``FP8Embedding.weight_scale``): quantization metadata in its own precision, not the model's dtype."""
    key, mod = e.key, e.module
    if not isinstance(key, str) or "scale" not in key.lower() or mod is None or e.owner is not mod:
        return False
    d = mod.__dict__
    return any(isinstance(v, torch.Tensor) and v.dtype in STORAGE_DTYPES
               for v in (*(d.get("_parameters") or {}).values(), *(d.get("_buffers") or {}).values()))


def fp32_scopes(w: Any, dtype: torch.dtype) -> list[tuple[str, list[str]]]:
    """``(module path, patterns)`` kept fp32 for ``dtype``, matched as from_pretrained matches them."""
    scopes = []
    for path, mod in w.modules:
        tp = type(mod)
        if not (getattr(tp, "_keep_in_fp32_modules", None) or getattr(tp, "_keep_in_fp32_modules_strict", None)
                or mod.__dict__.get("_keep_in_fp32_modules") or mod.__dict__.get("_keep_in_fp32_modules_strict")):
            continue
        dtype_plan = getattr(tp, "_get_dtype_plan", None)  # transformers: non-strict for fp16 only
        try:
            names = list(dtype_plan(mod, dtype)) if callable(dtype_plan) else list(
                getattr(tp, "_keep_in_fp32_modules", None) or mod.__dict__.get("_keep_in_fp32_modules") or [])
        except Exception:  # a library change must not break a move: fall back to the declared names
            names = list(getattr(tp, "_keep_in_fp32_modules", None) or [])
        if names:
            scopes.append((path, [n for n in names if isinstance(n, str)]))
    return scopes


def kept_fp32(path: str, scopes: list[tuple[str, list[str]]]) -> bool:
    for scope, names in scopes:
        if scope and not path.startswith(scope + "."):
            continue
        rel = f".{path[len(scope) + 1:] if scope else path}."
        if any(f".{n}." in rel for n in names):
            return True
    return False


def target_dtype(e: Entry, dtype: torch.dtype | None, fp32: Any, adapters: dict[str, bool]) -> tuple[torch.dtype, str | None]:
    t = e.tensor
    if dtype is None or not (t.is_floating_point() or t.is_complex()) or (t.is_complex() and not dtype.is_complex):
        return t.dtype, None
    if e.role in ("quant_state", "offloaded", "subclass_inner") or (is_wrapper(t) and is_quantized_owner(t)):
        return t.dtype, "quantization metadata"
    if t.dtype in STORAGE_DTYPES:
        return t.dtype, "packed storage dtype"
    if packed_scale(e):
        return t.dtype, "scale of packed storage"
    if e.role == "attribute" and (e.module is None or isinstance(e.owner, torch.Tensor)):
        return t.dtype, "tensor of a non-module object"
    if fp32 is not None:
        if adapters.get(e.path):
            return t.dtype, "peft adapter kept float32"
        if kept_fp32(e.path, fp32):
            return torch.float32, "_keep_in_fp32_modules"
    return dtype, None


def adapters_kept_fp32(w: Any) -> dict[str, bool]:
    """Path -> True for tensors of peft adapters that are float32 throughout (kept as peft made them)."""
    if not any(type(m).__module__.startswith("peft.") for _, m in w.modules):
        return {}
    adapter_of = Policy(w, None, None, False).adapter_of
    groups: dict[tuple[str, str], list[torch.Tensor]] = {}
    for e in w.canonical():
        key = adapter_of.get(e.path)
        if key is not None and e.tensor.is_floating_point():
            groups.setdefault(key, []).append(e.tensor)
    fp32 = {k for k, ts in groups.items() if all(t.dtype == torch.float32 for t in ts)}
    return {p: k in fp32 for p, k in adapter_of.items()}


_LOW_PRECISION = frozenset({torch.float16, torch.bfloat16})
# a tensor's device on meta never has an index; comparing with it is 25x cheaper than ``device.type``
_META = torch.device("meta")
_OWN_ROLES = frozenset({"parameter", "buffer", "quant_state"})  # judged when they belong to a component
_ATTR_ROLES = frozenset({"attribute", "container", "subclass_inner"})  # judged only against an explicit device/dtype


@dataclass
class _Component:
    path: str
    module: nn.Module
    device: torch.device | None
    dtype: torch.dtype | None


_IS_NORM: dict[type, bool] = {}


def _is_norm(module: nn.Module | None) -> bool:
    if module is None:
        return False
    tp = type(module)
    hit = _IS_NORM.get(tp)
    if hit is None:
        # a normalization layer, not a parametrization of weights (_WeightNorm, _SpectralNorm and their vectors)
        name = tp.__name__.lower()
        hit = _IS_NORM[tp] = "norm" in name and "weightnorm" not in name and "spectralnorm" not in name
    return hit


def _judged_float(t: torch.Tensor) -> bool:
    return t.is_floating_point() and t.dtype not in STORAGE_DTYPES


def _under(path: str, prefix: str) -> bool:
    return not prefix or path == prefix or path.startswith(prefix + ".")


_TYPE_FACTS: dict[type, tuple[tuple[str, ...], bool]] = {}


def _type_facts(tp: type) -> tuple[tuple[str, ...], bool]:
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


class Policy:
    """Computes expectations for one walk and judges every canonical entry."""

    def __init__(self, w: Walk, device: torch.device | None, dtype: torch.dtype | None, strict: bool) -> None:
        self.w, self.device, self.dtype, self.strict = w, device, dtype, strict
        self.canon = [(e, e.info()) for e in w.entries if e.alias_of is None]
        self.adapter_of: dict[str, tuple[str, str]] = {}  # tensor path -> (peft layer path, adapter name)
        self.base_device: dict[str, torch.device] = {}  # peft layer path -> its base layer's weight device
        self.fp32_prefixes: list[str] = []
        self.hook_device: list[tuple[str, torch.device]] = []
        self.nonpersistent: set[str] = set()
        self._index_modules()
        self._components()

    # -- structure ---------------------------------------------------------------------------------------
    def _index_modules(self) -> None:
        facts, w = _TYPE_FACTS, self.w
        for path, mod in w.modules:
            kept, is_peft = facts.get(type(mod)) or _type_facts(type(mod))
            if kept:
                self.fp32_prefixes.extend(kept)
            if is_peft:
                self._index_adapter(path, mod)
        for e, info in self.canon:  # only a module holding buffers can have non-persistent ones
            if info.role == "buffer" and e.key in (e.owner.__dict__.get("_non_persistent_buffers_set") or ()):
                self.nonpersistent.add(info.path)
        for path, mod, hook in w.hooks:
            if w.module_paths.get(id(mod)) != path:
                continue  # a shared module: judged at its first path
            for h in (hook.__dict__.get("hooks") or [hook]):
                dev = getattr(h, "__dict__", {}).get("execution_device")
                if dev is not None and not getattr(h, "__dict__", {}).get("offload", False):
                    try:
                        self.hook_device.append((path, torch.device(dev)))
                    except (RuntimeError, TypeError):
                        pass
        self.hook_device.sort(key=lambda x: -len(x[0]))

    def _index_adapter(self, path: str, mod: nn.Module) -> None:
        subs = mod.__dict__.get("_modules") or {}
        base = subs.get("base_layer")
        if base is None:
            return
        w = base.__dict__.get("_parameters", {}).get("weight") if isinstance(base, nn.Module) else None
        if isinstance(w, torch.Tensor):
            self.base_device[path] = w.device
        for pname, _ in mod.named_parameters(remove_duplicate=False):
            parts = pname.split(".")
            if parts[0] != "base_layer" and len(parts) >= 2:
                self.adapter_of[f"{path}.{pname}" if path else pname] = (path, parts[1])

    def _components(self) -> list[_Component]:
        comps = [_Component(path, mod, None, None) for path, mod in self.w.roots]
        comps.sort(key=lambda c: -len(c.path))
        self.components = comps
        self._ctx_cache: dict[str, tuple[_Component | None, bool, torch.device | None]] = {}
        devs: list[dict[torch.device, int]] = [{} for _ in comps]
        dts: list[dict[torch.dtype, int]] = [{} for _ in comps]
        # one root component, no fp32-kept names, no accelerate hooks: every module has the same context
        self._const_ctx = (comps[0], False, None) if len(comps) == 1 and not comps[0].path \
            and not self.fp32_prefixes and not self.hook_device else None
        index = {id(c): i for i, c in enumerate(comps)}
        adapters, nonpersistent, storage = self.adapter_of, self.nonpersistent, STORAGE_DTYPES
        const, cache, ctx, prefixes, norms = self._const_ctx, self._ctx_cache, self.ctx, self.fp32_prefixes, _IS_NORM
        f32 = torch.float32
        for e, info in self.canon:
            dt = info.dtype
            if (info.role != "parameter" and info.role != "buffer") or not dt.is_floating_point or dt in storage \
                    or not info.moved_by_module_to or (adapters and info.path in adapters):
                continue
            comp, kept, _ = const or cache.get(e.module_path) or ctx(e.module_path)
            if comp is None or kept or (dt == f32 and prefixes and self._fp32_kept(e)):
                continue
            i = index[id(comp)]
            n = info.nbytes + 1
            dev = info.device
            if dev != _META:
                devs[i][dev] = devs[i].get(dev, 0) + n
            if nonpersistent and info.path in nonpersistent or packed_scale(e):
                continue
            if dt == f32:
                norm = norms.get(type(e.module))
                if norm or (norm is None and _is_norm(e.module)):
                    continue
            dts[i][dt] = dts[i].get(dt, 0) + n
        for i, c in enumerate(comps):
            c.device = self.device or (max(devs[i], key=devs[i].__getitem__) if devs[i] else None)
            c.dtype = self.dtype or (max(dts[i], key=dts[i].__getitem__) if dts[i] else None)
        return comps

    def ctx(self, module_path: str) -> tuple[_Component | None, bool, torch.device | None]:
        """(component, kept in fp32, accelerate hook device) of a module path, cached."""
        hit = self._ctx_cache.get(module_path)
        if hit is None:
            comps = self.components
            comp = comps[0] if len(comps) == 1 and not comps[0].path else \
                next((c for c in comps if _under(module_path, c.path)), None)
            kept = bool(self.fp32_prefixes) and any(p in f".{module_path}." for p in self.fp32_prefixes)
            hook = next((dev for p, dev in self.hook_device if _under(module_path, p)), None) \
                if self.hook_device else None
            hit = self._ctx_cache[module_path] = (comp, kept, hook)
        return hit

    def _fp32_kept(self, e: Entry) -> bool:
        # names in _keep_in_fp32_modules may be modules ("wo") or tensors ("scale_shift_table")
        if self.ctx(e.module_path)[1]:
            return True
        dotted = f".{e.path}."
        return any(p in dotted for p in self.fp32_prefixes)

    # -- judging -----------------------------------------------------------------------------------------
    def judge(self) -> list[Problem]:
        problems: list[Problem] = []
        fixed_dev, adapters, const, cache, ctx = self.device, self.adapter_of, self._const_ctx, self._ctx_cache, self.ctx
        for e, info in self.canon:
            if e.module is None:
                comp, hook_dev = None, None
            else:
                comp, _, hook_dev = const or cache.get(e.module_path) or ctx(e.module_path)
                exp = fixed_dev or hook_dev or (comp.device if comp else None)
                dt = info.dtype
                # fast path: where it should be, and in the component dtype (or not judged for dtype)
                if comp is not None and info.device == exp and (dt == comp.dtype or not dt.is_floating_point) \
                        and info.role != "offloaded" and not (adapters and info.path in adapters):
                    continue
            p = self._judge_entry(e, info, comp, hook_dev)
            if p is not None:
                problems.append(p)
        if adapters:
            problems.extend(self._judge_adapters())
        return problems

    def _judge_entry(self, e: Entry, info: TensorInfo, comp: _Component | None, hook_dev: torch.device | None
                     ) -> Problem | None:
        t, role = e.tensor, info.role
        if role in _OWN_ROLES:
            if comp is None:
                return None
        elif role not in _ATTR_ROLES or not (self.device or self.dtype) or (comp is None and not self.strict):
            return None  # offloaded (judged by its weights_map copy), or a free attribute nobody asked about
        exp_dev = self.device or hook_dev or (comp.device if comp else None)
        if info.device == _META and (exp_dev is None or exp_dev.type != "meta"):
            where = device_str(exp_dev) if exp_dev is not None else "a real device"
            text = info.compact
            return Problem("meta", e.path, role, "meta", where,
                           f"{text} holds no data (meta) but should be on {where}; a forward on CPU may silently return "
                           "garbage. Load or materialise it (load_state_dict(..., assign=True) or to_empty() then load).",
                           None, e.module_path, type(e.module).__name__ if e.module is not None else None, (text,))
        if e.path in self.adapter_of:
            layer, _ = self.adapter_of[e.path]
            base = self.base_device.get(layer)
            if base is not None and base.type != "meta" and not same_device(t.device, base) and self.device is None:
                return None  # reported per adapter by _judge_adapters
            exp_dev = self.device
            if exp_dev is not None and not same_device(t.device, exp_dev):
                return self._device_problem(e, exp_dev)
            return None
        if exp_dev is not None and not same_device(t.device, exp_dev):
            return self._device_problem(e, exp_dev)
        exp_dt = comp.dtype if comp is not None else self.dtype
        if exp_dt is None or role == "quant_state" or not _judged_float(t) or t.dtype == exp_dt:
            return None
        if t.dtype == torch.float32 and self._fp32_kept(e):
            return None
        if e.path in self.nonpersistent or packed_scale(e):
            return None  # computed state (rotary inv_freq), FP8 scales: libraries pick their precision on purpose
        if self.dtype is None:
            if _is_norm(e.module) and t.dtype == torch.float32 and exp_dt in _LOW_PRECISION:
                return None  # fp32 norm params accept a low-precision input (directional rule)
        if role == "attribute" and not self.dtype:
            return None
        return self._problem("dtype", e, dtype_str(t.dtype), dtype_str(exp_dt),
                             f"{e.info().compact} is {dtype_str(t.dtype)} but {self._whose(comp)} is {dtype_str(exp_dt)}")

    def _whose(self, comp: _Component | None) -> str:
        return f"'{comp.path}'" if comp and comp.path else "the model"

    def _device_problem(self, e: Entry, exp: torch.device) -> Problem:
        why = "" if e.moved_by_module_to else " (Module.to never moves it: it is not a parameter or buffer of the tree)"
        return self._problem("device", e, device_str(e.tensor.device), device_str(exp),
                             f"{e.info().compact} is on {device_str(e.tensor.device)}, expected {device_str(exp)}{why}")

    def _judge_adapters(self) -> list[Problem]:
        groups: dict[tuple[str, str], list[Entry]] = {}
        for e, _ in self.canon:
            key = self.adapter_of.get(e.path)
            if key is not None:
                groups.setdefault(key, []).append(e)
        problems = []
        for (layer, name), entries in groups.items():
            floats = [e for e in entries if e.tensor.is_floating_point()]
            base = self.base_device.get(layer)
            for e in floats:
                if base is not None and base.type != "meta" and e.tensor.device.type != "meta" \
                        and not same_device(e.tensor.device, base) and self.device is None:
                    problems.append(self._problem(
                        "device", e, device_str(e.tensor.device), device_str(base),
                        f"adapter '{name}' tensor {e.info().compact} is on {device_str(e.tensor.device)} but its "
                        f"base layer '{layer}.base_layer' is on {device_str(base)}"))
            if len({e.tensor.dtype for e in floats}) > 1:
                major = _adapter_dtype(floats)
                for e in floats:
                    if e.tensor.dtype != major:
                        problems.append(self._problem(
                            "dtype", e, dtype_str(e.tensor.dtype), dtype_str(major),
                            f"adapter '{name}' of '{layer}' mixes dtypes: {e.info().compact} while the rest of the "
                            f"adapter is {dtype_str(major)}"))
        return problems

    def _problem(self, kind: str, e: Entry, found: str, expected: str, message: str, text: str | None = None
                 ) -> Problem:
        return Problem(kind, e.path, e.role, found, expected, message, None, e.module_path,
                       type(e.module).__name__ if e.module is not None else None, (text or e.info().compact,))


def _adapter_dtype(floats: list[Entry]) -> torch.dtype:
    """An adapter's dtype: its own majority; lora_A's dtype breaks ties (peft casts the input to it)."""
    counts: dict[torch.dtype, int] = {}
    for e in floats:
        counts[e.tensor.dtype] = counts.get(e.tensor.dtype, 0) + 1
    a_dtype = next((e.tensor.dtype for e in floats if ".lora_A." in f".{e.path}."), None)
    return max(counts, key=lambda d: (counts[d], d == a_dtype))


class Expectations:
    """The dtype guard aligns one op's tensors to, per module path, as scan judges them: the component's majority
    (a pipeline's fp32 VAE next to a bf16 UNet), fp32 in ``_keep_in_fp32_modules``, and inside a peft adapter the
    adapter's own dtype (fp32 activations over a bf16 base are right there). Devices stay guard's own: it reads
    virtual devices (``simulate``) that scan does not."""

    def __init__(self, w: Walk) -> None:
        self._policy = policy = Policy(w, None, None, False)
        groups: dict[tuple[str, str], list[Entry]] = {}
        for e, _ in policy.canon if policy.adapter_of else ():
            key = policy.adapter_of.get(e.path)
            if key is not None and e.tensor.is_floating_point():
                groups.setdefault(key, []).append(e)
        self._adapters = {e.module_path: _adapter_dtype(floats) for floats in groups.values() for e in floats}

    def dtype(self, module_path: str) -> torch.dtype | None:
        hit = self._adapters.get(module_path)
        if hit is not None:
            return hit
        comp, kept, _ = self._policy.ctx(module_path)
        if kept:  # fp32 in fp16 models, the model's dtype in bf16 ones (non-strict): the module's own, when uniform
            own = {e.tensor.dtype for e, info in self._policy.canon
                   if e.module_path == module_path and info.role == "parameter" and _judged_float(e.tensor)}
            return own.pop() if len(own) == 1 else None
        return comp.dtype if comp is not None else None



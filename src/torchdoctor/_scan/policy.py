"""The one placement policy: for every tensor, the device and dtype it should have, the rule that decided it, and
whether a deviation is a problem or intended.

scan, move's plan, guard, simulate (and the pytest marker through them) all ask ``Policy.decide``, so they never
disagree. The model's dtype per component comes from an explicit ``dtype=``, else what the model declares
(transformers ``config.dtype``), else a vote over its compute weights (each weight one vote, so no single large
tensor — an upcast tied embedding — can swing it). What correct models do on purpose is read by
``torchdoctor._scan.intent``; what apps do on purpose by ``torchdoctor._scan.apps`` (docs/policy.md).

Rule names (stable, shown in reports): ``explicit``, ``declared-dtype``, ``vote``, ``keep_in_fp32``, ``adapter``,
``offloaded``, ``hook-device``, ``norm-fp32``, ``quant-storage``, ``storage-computed``, ``quant-metadata``,
``kbit-fp32``, ``follows-input``, ``computed-buffer``, ``self-managed``, ``owner-module``, ``no-expectation``,
``patcher-device``, ``casts-per-call``, ``moved-per-call``, ``schedule-table``, ``backup-copy``, ``app-convention``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchdoctor._scan import apps, intent
from torchdoctor._scan.percall import DEVICE as _DEVICE_BIT, DTYPE as _DTYPE_BIT
from torchdoctor._scan.casts import fp32_scopes, kept_fp32
from torchdoctor._scan.intent import STORAGE_DTYPES, adapter_majority, packed_scale
from torchdoctor._scan.judge import Decision, judge
from torchdoctor._scan.tally import tally
from torchdoctor._walk import Entry, Walk

__all__ = ["Decision", "Policy", "STORAGE_DTYPES", "fp32_scopes", "packed_scale"]

_F32 = torch.float32
_ATTR_ROLES = frozenset({"attribute", "container"})
_PLAIN_TYPES: set[type] = set()  # module classes without fp32-kept names that are neither peft nor bitsandbytes


# Component is a plain class, not a dataclass: creating a dataclass compiles its methods at import (about a
# millisecond each), and the first scan of a process pays every import (issue 28).
class Component:
    """The root module or a top-level module, what it is expected to be, and the rules that decided."""

    __slots__ = ("path", "module", "device", "dtype", "device_rule", "dtype_rule", "offload", "offload_by")

    def __init__(self, path: str, module: nn.Module, device: torch.device | None, dtype: torch.dtype | None) -> None:
        self.path, self.module, self.device, self.dtype = path, module, device, dtype
        self.device_rule = self.dtype_rule = "vote"
        self.offload: torch.device | None = None  # execution device of an accelerate offload hook on the component
        self.offload_by = "accelerate"  # who moves it there at call

    def __repr__(self) -> str:
        return f"Component({self.path!r}, {self.device}, {self.dtype}, {self.device_rule}/{self.dtype_rule})"


def _dominated(votes: dict[torch.dtype, list[Any]], declared: torch.dtype) -> bool:
    """Another dtype has at least as many layers and tensors as the declared one, and more of either: the config is
    stale (``model.to(dtype)`` and ``move`` never rewrite ``config.dtype``), the weights decide."""
    d = votes[declared]
    return any(len(v[0]) >= len(d[0]) and v[1] >= d[1] and (len(v[0]), v[1]) != (len(d[0]), d[1])
               for k, v in votes.items() if k != declared)


def _under(path: str, prefix: str) -> bool:
    return not prefix or path == prefix or path.startswith(prefix + ".")


class _Casting:
    """``Policy.casting``: module id -> what its forward moves or casts per call (``apps.casting_modules``), made
    when first read and kept on the policy (a model on one device in one dtype whose first voting tensor is no such
    layer's never reads it: ``uniform`` asks that one module)."""

    def __get__(self, policy: Any, owner: Any = None) -> Any:
        if policy is None:  # read on the class (help(), inspect)
            return self
        got = policy.__dict__["casting"] = apps.casting_modules(policy.w.modules, policy._types)
        return got


class Policy:
    """Expectations for one walk: ``decide(entry)`` per tensor, ``judge()`` for the problems, ``components``."""

    casting = _Casting()

    def __init__(self, w: Walk, device: torch.device | None, dtype: torch.dtype | None, strict: bool,
                 summary: bool = False) -> None:
        self.w, self.device, self.dtype, self.strict = w, device, dtype, strict
        self.adapter_of: dict[str, tuple[str, str]] = {}  # tensor path -> (peft layer path, adapter name)
        self.base_device: dict[str, torch.device] = {}  # peft layer path -> its base layer's weight device
        self.fp32_prefixes: list[str] = []
        self.hook_device: list[tuple[str, torch.device]] = []  # dispatched modules (device_map)
        self.offloaded: list[tuple[str, torch.device]] = []  # modules an offload hook keeps at rest elsewhere
        self.offload_by: dict[str, str] = {}  # their paths -> who moves them at call
        self.plain_root = not w.modules  # a batch, a state_dict, an optimizer: no module anywhere
        self.nonpersistent: set[str] = set()
        self.computed16: list[Entry] = []  # non-persistent buffers in bfloat16/float16 (``tally``)
        self.kbit = False
        self.subject: Any = None  # the object scanned (set by scan): a plain object's own ``to`` is named in fixes
        # filled by the one pass over the entries (``tally``): every row (a tuple in TensorInfo's field order), the
        # canonical (entry, row) pairs, the components with no loaded weight (id -> (component, parameters)), the
        # summary groups when asked for
        self.rows: list[Any] = []
        self.canon: list[tuple[Entry, Any]] = []
        self.unloaded: dict[int, tuple[Component, int]] = {}
        self.groups: dict[tuple[torch.device, torch.dtype], list[int]] | None = None
        self._index_modules()
        self._components(summary)
        self._scopes: dict[int, list[tuple[str, list[str]]]] = {}
        self._adapter_dtypes: dict[tuple[str, str], torch.dtype] | None = None
        self._adapter_mixed: set[tuple[str, str]] = set()

    # -- structure ---------------------------------------------------------------------------------------
    def _index_modules(self) -> None:
        facts, w = intent._TYPE_FACTS, self.w
        bnb, kbit = intent._BNB, False
        # a model has a few dozen classes: the per-module loop runs only when one of them keeps fp32 names, is a
        # peft layer or a bitsandbytes layer
        types = w.types or {type(mod) for _, mod in w.modules}  # the walker keeps them
        plain = types <= _PLAIN_TYPES
        if not plain:
            if len(_PLAIN_TYPES) > 4096:  # fx GraphModules make a class per instance
                _PLAIN_TYPES.clear()
            for tp in types - _PLAIN_TYPES:
                kept, is_peft = facts.get(tp) or intent.type_facts(tp)
                if not kept and not is_peft and not intent.bnb_type(tp):
                    _PLAIN_TYPES.add(tp)
            plain = types <= _PLAIN_TYPES
        for path, mod in w.modules if not plain else ():
            tp = type(mod)
            kept, is_peft = facts.get(tp) or intent.type_facts(tp)
            if kept:
                self.fp32_prefixes.extend(kept)
            if is_peft:
                self._index_adapter(path, mod)
            if not kbit:  # bitsandbytes layers: the model's other fp32 weights may be on purpose (kbit training)
                hit = bnb.get(tp)
                kbit = hit if hit is not None else intent.kbit_model([(path, mod)])
        self.kbit = kbit
        self._types = types  # ``casting`` (the layers that cast or move their weights per call) is made when read
        self.patched = {p for p, _, _ in w.patches} if w.patches else set()
        if w.patches:  # forward-replacing LoRA networks: adapters of the module they patch
            of, base = apps.network_adapters(w)
            self.adapter_of.update(of)
            self.base_device.update(base)
        for path, mod, hook in w.hooks:
            if w.module_paths.get(id(mod)) != path:
                continue  # a shared module: judged at its first path
            off = intent.offload_device(hook)
            if off is not None:
                self.offloaded.append((path, off))
                self.offload_by[path] = intent.offload_owner(hook)
                continue
            dev = intent.dispatch_device(hook)
            if dev is not None:
                self.hook_device.append((path, dev))
        if w.hooked:
            self._held_by_hooks(w)
        self.patcher_loaded: set[str] = set()  # components an app's model patcher loaded on its load device
        if w.holders:
            roots = dict(w.roots)
            for path, holder in w.holders.items():
                root = roots.get(path)
                state = intent.patcher_state(holder, root) if root is not None else None
                if state is None:
                    continue
                if state[1]:
                    self.hook_device.append((path, state[0]))
                    self.patcher_loaded.add(path)
                else:  # at rest on the offload device until the app loads it
                    self.offloaded.append((path, state[0]))
                    self.offload_by[path] = f"the app's {type(holder).__name__} (load_device)"
        if len(self.hook_device) > 1:  # the deepest path first
            self.hook_device.sort(key=lambda x: -len(x[0]))
        if len(self.offloaded) > 1:
            self.offloaded.sort(key=lambda x: -len(x[0]))

    def _held_by_hooks(self, w: Walk) -> None:
        """Modules the program keeps on the CPU itself, hooked on both sides (a forward pre-hook moving the inputs
        there, a forward hook moving the output back: experts offloaded by hand): at rest and run there by design,
        as an offload hook's module is (hunt V18; the virtual runs read them so, ``_virtual.split``)."""
        cpu = None
        hooked = w.hooked  # the walker read each module's hooks from its __dict__ as it passed (never user code)
        for path, mod in hooked:
            first = next(mod.parameters(), None)  # its own or its layers' (a list of expert MLPs)
            if first is not None and first.device.type == "cpu" and not any(_under(path, p) for p, _ in self.offloaded):
                cpu = cpu or torch.device("cpu")
                self.offloaded.append((path, cpu))
                self.offload_by[path] = "its own forward hooks (inputs moved in, the output moved back)"

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

    def _components(self, summary: bool) -> None:
        comps = [Component(path, mod, None, None) for path, mod in self.w.roots]
        if len(comps) > 1:
            comps.sort(key=lambda c: -len(c.path))
        self.components = comps
        self._ctx_cache: dict[str, tuple[Component | None, bool, torch.device | None]] = {}
        self._const_ctx = (comps[0], False, None) if len(comps) == 1 and not comps[0].path \
            and not self.fp32_prefixes and not self.hook_device and not self.offloaded else None
        devs, dts = tally(self, summary)
        # fp32 beside bitsandbytes layers is on purpose only with the marks of peft's kbit preparation
        self.kbit_prepared = self.kbit and intent.kbit_prepared(self.w.modules, [
            e.tensor for e, info in self.canon if info[1] == "parameter" and info[3].is_floating_point
            and info[3] not in STORAGE_DTYPES and not intent.packed_param(e.tensor) and info[0] not in
            self.adapter_of])  # rows: tuples in TensorInfo's field order (tally)
        for i, c in enumerate(comps):
            hit = next(((p, d) for p, d in self.offloaded if _under(c.path, p)), None) if self.offloaded else None
            if hit is not None:
                c.offload, c.offload_by = hit[1], self.offload_by.get(hit[0], "accelerate")
            if self.device is not None:
                c.device, c.device_rule = self.device, "explicit"
            elif devs[i]:
                c.device = next(iter(devs[i])) if len(devs[i]) == 1 else max(
                    devs[i], key=lambda k: (len(devs[i][k][0]), devs[i][k][1], devs[i][k][2]))
            declared = intent.declared_dtype(c.module)
            if self.dtype is not None:
                c.dtype, c.dtype_rule = self.dtype, "explicit"
            elif declared is not None and declared in dts[i] and not _dominated(dts[i], declared):
                c.dtype, c.dtype_rule = declared, "declared-dtype"
            elif dts[i]:
                c.dtype = next(iter(dts[i])) if len(dts[i]) == 1 else max(
                    dts[i], key=lambda k: (len(dts[i][k][0]), dts[i][k][1], dts[i][k][2]))

    def ctx(self, module_path: str) -> tuple[Component | None, bool, torch.device | None]:
        """(component, kept in fp32, dispatch hook device) of a module path, cached."""
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

    def offload_of(self, module_path: str) -> torch.device | None:
        return next((d for p, d in self.offloaded if _under(module_path, p)), None) if self.offloaded else None

    def _fp32_kept(self, e: Entry) -> bool:
        # names in _keep_in_fp32_modules may be modules ("wo") or tensors ("scale_shift_table")
        if self.ctx(e.module_path)[1]:
            return True
        dotted = f".{e.path}."
        return any(p in dotted for p in self.fp32_prefixes)

    def adapter_dtype(self, path: str) -> torch.dtype | None:
        """The dtype of the peft adapter ``path`` belongs to (its own majority), or None outside adapters."""
        key = self.adapter_of.get(path)
        if key is None:
            return None
        if self._adapter_dtypes is None:
            groups: dict[tuple[str, str], list[Entry]] = {}
            for e, _ in self.canon:
                k = self.adapter_of.get(e.path)
                if k is not None and e.tensor.is_floating_point():
                    groups.setdefault(k, []).append(e)
            # a tie inside one adapter (lora_A bf16, lora_B fp32) is broken by what the same adapter is elsewhere
            overall: dict[tuple[str, torch.dtype], int] = {}
            for (_, name), es in groups.items():
                for e in es:
                    overall[name, e.tensor.dtype] = overall.get((name, e.tensor.dtype), 0) + 1
            self._adapter_mixed = {k for k, v in groups.items() if len({e.tensor.dtype for e in v}) > 1}
            self._adapter_dtypes = {k: adapter_majority(v, {dt: n for (a, dt), n in overall.items() if a == k[1]})
                                    for k, v in groups.items()}
        return self._adapter_dtypes.get(key)

    # -- decisions ---------------------------------------------------------------------------------------
    def decide(self, e: Entry) -> Decision:
        """The expected device and dtype of one canonical entry, and why."""
        comp, kept, hook_dev = self.ctx(e.module_path) if e.module is not None else (None, False, None)
        t, role = e.tensor, e.role
        dev, dev_rule, alt_dev = self._device(e, comp, hook_dev)
        if role == "offloaded":
            return Decision(None, None, "offloaded")
        app = apps.intended(e, self.casting, self.strict)
        if app is not None and app[1] & _DTYPE_BIT and t.is_floating_point():
            # _keep_in_fp32_modules outranks a per-call cast (a router that casts its weight up each call is still
            # loaded fp32 by from_pretrained, and move keeps it so); the per-call device move still holds
            base = comp.dtype if comp is not None else self.dtype
            if base is not None and self._kept_fp32(e, base):
                app = (app[0], app[1] & ~_DTYPE_BIT) if app[1] & _DEVICE_BIT else None
        if app is not None:
            rule, bits = app
            if bits & _DEVICE_BIT and bits & _DTYPE_BIT:
                return Decision(None, None, rule)
            if bits & _DTYPE_BIT:  # cast to the input's dtype when it differs; its device stays the module's
                return Decision(dev, None, rule, alt_dev)
            dev, dev_rule, alt_dev = None, rule, None  # moved to the input's device per call; its dtype is judged
        if role in _ATTR_ROLES and e.module is None:
            # a tensor of a plain object: judged when strict, or when what was scanned holds no module at all (a
            # batch dict, a state_dict, an optimizer) and device=/dtype= was asked for; a pipeline's scheduler
            # keeps its fp32 tables on the cpu by design. Scalars (AdamW's step, a loss scale) stay where made.
            asked = self.plain_root and (self.device is not None or self.dtype is not None) and t.dim() > 0
            if asked and not self.strict:
                return Decision(self.device, self.dtype, "explicit")
            return Decision(dev if self.strict else None, self.dtype if self.strict else None, "no-expectation")
        if role == "subclass_inner" or (role in _ATTR_ROLES and isinstance(e.owner, torch.Tensor)):
            return Decision(dev, None, "quant-metadata")
        if not t.is_floating_point() and not (t.is_complex() and self.dtype is not None and self.dtype.is_complex):
            # integer storage (GGUF-style uint8 blocks) is data only behind a layer that dequantizes it; a layer
            # whose forward is torch's own computes with it as it is
            base = comp.dtype if comp is not None else self.dtype
            if base is not None and role == "parameter" and t.dtype != torch.bool and not t.is_complex() \
                    and intent.computes_in_storage(e.module, e.key):
                return Decision(dev, base, "storage-computed", alt_dev)
            return Decision(dev, None, dev_rule, alt_dev)
        if role == "quant_state" or intent.quantized_wrapper(t):
            if role == "quant_state" and intent.unused_quant_field(e):
                return Decision(None, None, "quant-unused")
            return Decision(dev, None, "quant-metadata", alt_dev)
        if intent.packed_param(t) or t.dtype in STORAGE_DTYPES:  # packed 4-bit data, float8/float4 storage
            base = comp.dtype if comp is not None else self.dtype
            if base is not None and role == "parameter" and intent.computes_in_storage(e.module, e.key):
                return Decision(dev, base, "storage-computed", alt_dev)
            return Decision(dev, None, "quant-storage", alt_dev)
        if packed_scale(e):
            return Decision(dev, None, "quant-metadata", alt_dev)
        ad = self.adapter_dtype(e.path) if self.adapter_of else None
        if ad is not None:
            # fp32 throughout is peft's design and stays; with dtype= a mixed adapter is expected whole in it
            mixed = self.adapter_of[e.path] in self._adapter_mixed
            want = self.dtype if self.dtype is not None and (ad != _F32 or mixed) else ad
            return Decision(dev, want, "adapter", alt_dev)
        base = comp.dtype if comp is not None else self.dtype
        if base is None:
            return Decision(dev, None, dev_rule, alt_dev)
        if self._kept_fp32(e, base):
            return Decision(dev, _F32, "keep_in_fp32", alt_dev, base if self.dtype is None else None)
        rule = comp.dtype_rule if comp is not None else "explicit"
        if role in _ATTR_ROLES:
            if self.device is None and self.dtype is None and self._self_managed(e):
                return Decision(None, None, "self-managed")
            return Decision(dev, base, "owner-module" if self.dtype is None else "explicit", alt_dev)
        if intent.follows_input(e):
            return Decision(dev, base, "follows-input", alt_dev, t.dtype)
        if self.kbit_prepared and t.dtype == _F32 and base in intent.LOW_PRECISION:
            return Decision(dev, base, "kbit-fp32", alt_dev, _F32)
        if e.path in self.nonpersistent:
            return Decision(dev, base, "computed-buffer", alt_dev, t.dtype)
        if self.dtype is None and base in intent.LOW_PRECISION and intent.is_norm(e.module):
            return Decision(dev, base, "norm-fp32", alt_dev, _F32)
        return Decision(dev, base, rule, alt_dev)

    def _device(self, e: Entry, comp: Component | None, hook_dev: torch.device | None
                ) -> tuple[torch.device | None, str, torch.device | None]:
        off = self.offload_of(e.module_path) if self.offloaded and e.module is not None else None
        if off is not None:  # at rest on cpu, on the execution device during its call: both by design
            if e.role in _ATTR_ROLES:
                # an offload (accelerate's, an app's hook, a patcher's load) moves what Module.to moves: a plain
                # tensor the forward reads stays where it is, so it must already be on the execution device
                return off, "offloaded", None
            return torch.device("cpu"), "offloaded", off
        if self.device is not None:
            return self.device, "explicit", None
        if hook_dev is not None:
            loaded = self.patcher_loaded and comp is not None and comp.path in self.patcher_loaded
            return hook_dev, "patcher-device" if loaded else "hook-device", None
        if comp is not None and comp.device is not None:
            return comp.device, "vote", None
        return None, "no-expectation", None

    def _kept_fp32(self, e: Entry, base: torch.dtype) -> bool:
        if not self.fp32_prefixes or base == _F32:
            return False
        if self.dtype is not None:  # as from_pretrained(dtype=...) keeps them: transformers' plan for that dtype
            return kept_fp32(e.path, self._scopes_for(base))
        return self._fp32_kept(e)

    def _scopes_for(self, dtype: torch.dtype) -> list[tuple[str, list[str]]]:
        key = id(dtype)
        if key not in self._scopes:
            self._scopes[key] = fp32_scopes(self.w, dtype)
        return self._scopes[key]

    def _self_managed(self, e: Entry) -> bool:
        owner = e.owner if isinstance(e.owner, nn.Module) else e.module
        name = e.key if isinstance(e.owner, nn.Module) else e.path.rsplit(".", 2)[-2] if "." in e.path else e.path
        if e.role == "container":  # a tensor in a list/dict attribute: the attribute's name decides
            rel = e.path[len(e.module_path) + 1:] if e.module_path else e.path
            name = rel.split(".", 1)[0]
        return owner is not None and isinstance(name, str) and intent.self_managed(owner, name)

    # -- judging -----------------------------------------------------------------------------------------
    def judge(self) -> list[Any]:
        return judge(self)

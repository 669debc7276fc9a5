"""Judging: the problems of one walk under one policy, with messages that say what was found, what was expected,
and why it was expected. A fast path skips tensors that are where their component expects them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from torchdoctor._placement import compact, device_str, dtype_str, same_device
from torchdoctor._report.model import Problem
from torchdoctor._scan import intent
from torchdoctor._scan.intent import cpu_packed, judged_float, packed_param

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._walk import Entry

# ``Policy`` (torchdoctor._scan.policy) calls in here; annotated ``Any`` so the judge never imports the policy back.
Policy = Any


# The policy's answer per tensor, read here and by every verb through ``Policy.decide``. A plain class, not a
# dataclass: creating a dataclass compiles its methods at import (about a millisecond each), and the first scan of
# a process pays every import (issue 28).
class Decision:
    """What one tensor should be: ``device``/``dtype`` (None: no expectation), the ``rule`` that decided, and an
    alternative the rule accepts by design (``alt_device``: an offloaded module at rest; ``alt_dtype``: fp32).
    Immutable; equal by value."""

    __slots__ = ("device", "dtype", "rule", "alt_device", "alt_dtype")
    device: torch.device | None
    dtype: torch.dtype | None
    rule: str
    alt_device: torch.device | None
    alt_dtype: torch.dtype | None

    def __init__(self, device: torch.device | None, dtype: torch.dtype | None, rule: str,
                 alt_device: torch.device | None = None, alt_dtype: torch.dtype | None = None) -> None:
        setter = object.__setattr__  # immutable: built once, read by every verb
        setter(self, "device", device)
        setter(self, "dtype", dtype)
        setter(self, "rule", rule)
        setter(self, "alt_device", alt_device)
        setter(self, "alt_dtype", alt_dtype)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Decision is immutable: cannot set {name}")

    def _key(self) -> tuple[Any, ...]:
        return (self.device, self.dtype, self.rule, self.alt_device, self.alt_dtype)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Decision) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "Decision(" + ", ".join(f"{n}={v!r}" for n, v in zip(self.__slots__, self._key())) + ")"

    def device_ok(self, d: torch.device) -> bool:
        return self.device is None or same_device(d, self.device) or (
            self.alt_device is not None and same_device(d, self.alt_device))

    def dtype_ok(self, dt: torch.dtype) -> bool:
        return self.dtype is None or dt == self.dtype or dt == self.alt_dtype


_META = torch.device("meta")
_ATTR_ROLES = frozenset({"attribute", "container", "subclass_inner"})


def judge(policy: Policy) -> list[Problem]:
    problems: list[Problem] = []
    fixed_dev, adapters, const, cache, ctx = policy.device, policy.adapter_of, policy._const_ctx, \
        policy._ctx_cache, policy.ctx
    offloaded, strict = policy.offloaded, policy.strict
    meta_ok = fixed_dev is not None and fixed_dev.type == "meta"
    meta_judged = not meta_ok and not offloaded
    texts: dict[tuple[Any, ...], tuple[str, str, tuple[str, ...]]] = {}  # meta problems: shapes repeat across layers
    unloaded = policy.unloaded if meta_judged else {}
    last_comp: Any = None
    whole = False
    # rows are tuples in TensorInfo's field order (torchdoctor._scan.tally): path, role, device, dtype, shape, ...
    canon: Any = policy.canon
    only = const[0] if const is not None else None  # the one component, where there is one
    groups = policy.groups  # scan's summary, counted by tally only when every tensor is on meta or virtual
    if meta_judged and only is not None and id(only) in unloaded and groups is not None and len(groups) == 1 \
            and next(iter(groups)) == (_META, only.dtype) and not strict and not policy.plain_root \
            and not policy.w.hooks:
        # one component, not loaded at all, every tensor on meta in its dtype: the component's one problem says it
        # all, and the loop below would find nothing else
        canon = ()
    for e, info in canon:
        module = e.module
        if meta_judged and info[2] == _META and info[1] != "offloaded" and (module is not None or strict):
            comp = None
            if module is not None:
                comp, _, hook_dev = const or cache.get(e.module_path) or ctx(e.module_path)
            if comp is not last_comp:  # a component's tensors come together
                last_comp, whole = comp, comp is not None and id(comp) in unloaded
            if not whole:  # one problem for a component not loaded at all: said after the loop
                where = fixed_dev
                if module is not None:
                    where = where or hook_dev or (comp.device if comp else None)
                key = (info[3], info[4], where)
                hit = texts.get(key)
                if hit is None:
                    text = compact(info[3], info[4], info[2])
                    where_text = device_str(where) if where is not None else "a real device"
                    hit = texts[key] = (where_text, _meta_message(text, where_text), (text,))
                # no data: a problem whatever else is expected
                problems.append(Problem("meta", e.path, e.role, "meta", hit[0], hit[1], None, e.module_path,
                                        type(module).__name__ if module is not None else None, hit[2]))
            # a tensor can carry several problems: what else is wrong with it (a planted dtype) is still named
            dt = info[3]
            if comp is not None and dt is not comp.dtype and dt.is_floating_point and dt != comp.dtype \
                    and module is not None:
                p = _judge_entry(policy, e, meta_ok=True)
                if p is not None:
                    problems.append(p)
            continue
        if info[1] == "parameter" and info[2].type not in ("cpu", "meta") and cpu_packed(e.tensor):
            problems.append(_problem("quant_incomplete", e, "cpu-packed", device_str(info[2]), cpu_packed_message(
                e.path, device_str(info[2]))))
            continue
        if module is not None and info[1] != "offloaded" and info[1] not in _ATTR_ROLES:
            comp, _, hook_dev = const or cache.get(e.module_path) or ctx(e.module_path)
            exp = fixed_dev or hook_dev or (comp.device if comp else None)
            dt = info[3]
            # fast path: where it should be, and in the component dtype (or not judged for dtype)
            # (an integer parameter is storage a plain layer may compute with: judged by the policy)
            if comp is not None and info[2] == exp and (dt == comp.dtype or not dt.is_floating_point and (
                    info[1] != "parameter" or dt == torch.bool)) \
                    and not (adapters and info[0] in adapters) and not offloaded:
                continue
        elif module is None and not strict and not (policy.plain_root and (fixed_dev is not None or policy.dtype)):
            continue  # a tensor of a plain object (a scheduler's): no expectation unless strict or asked for
        d = policy.decide(e)
        p = _judge_entry(policy, e, d=d)
        if p is not None:
            problems.append(p)
            if p.kind == "device":  # a tensor can carry several problems: its dtype is judged too (one decision)
                q = _dtype_problem(policy, e, d) or _no_storage_problem(e, d)
                if q is not None:
                    problems.append(q)
    if adapters:
        problems.extend(_judge_adapters(policy))
    for comp, n in unloaded.values():
        where = device_str(fixed_dev or comp.device) if (fixed_dev or comp.device) is not None else "a real device"
        name = f"'{comp.path}'" if comp.path else "the model"
        problems.insert(0, Problem(
            "meta", comp.path or "<root>", "parameter", "meta", where,
            f"weights not loaded: all {n} parameters of {name} are on meta (built on the meta device or with "
            f"init_empty_weights); load them (from_pretrained, load_state_dict(sd, assign=True), or to_empty() then "
            f"load), or check the structure as if loaded on {where}: simulate(..., assume_device={where!r}) / "
            f"torchdoctor simulate ... --assume-device {where}", None, comp.path, type(comp.module).__name__,
            (f"{n} tensors",)))
    return problems


def _judge_entry(policy: Policy, e: Entry, meta_ok: bool = False, dtype_only: bool = False,
                 d: Decision | None = None) -> Problem | None:
    if d is None:
        d = policy.decide(e)
    t = e.tensor
    if dtype_only:
        return _dtype_problem(policy, e, d)
    meta_asked = policy.device is not None and policy.device.type == "meta"
    if t.device == _META and (d.device is None or d.device.type != "meta") and d.rule != "offloaded" \
            and not meta_ok and not meta_asked:
        return _meta_problem(e, d.device)
    if e.path in policy.adapter_of and d.rule == "adapter":
        layer, _ = policy.adapter_of[e.path]
        base = policy.base_device.get(layer)
        if base is not None and base.type != "meta" and not same_device(t.device, base) and policy.device is None:
            return None  # reported per adapter by _judge_adapters
        if policy.device is not None and not same_device(t.device, policy.device):
            return _device_problem(e, policy.device, d, policy.subject)
        return None
    if not d.device_ok(t.device) and t.device != _META:
        assert d.device is not None
        return _device_problem(e, d.device, d, policy.subject)
    return _dtype_problem(policy, e, d)


# dtypes a device cannot hold at all: the move itself raises there ("Cannot convert a MPS Tensor to float64 dtype")
_NO_STORAGE = {"mps": (torch.float64, torch.complex128)}


def _no_storage_problem(e: Entry, d: Decision) -> Problem | None:
    """A tensor bound for a device that cannot hold its dtype (float64 on MPS): the move that puts it there raises,
    so what a move would fix is wrong until the tensor is cast first (to float32; complex64 for complex128)."""
    dev, t = d.device, e.tensor
    if dev is None or t.dtype not in _NO_STORAGE.get(dev.type, ()):
        return None
    to = torch.complex64 if t.is_complex() else torch.float32
    target = f"model.{e.path}" if e.path else "model"
    fix = f"{target}.data = {target}.data.to(torch.{dtype_str(to)})" if e.role in ("parameter", "buffer") else \
        f"{target} = {target}.to(torch.{dtype_str(to)})"
    found, kind = dtype_str(t.dtype), dev.type
    return _problem("unsupported_dtype", e, found, f"a dtype {kind} supports",
                    f"{e.info().compact} is {found}, which {kind} cannot hold: moving it to {device_str(dev)} raises "
                    f"(\"Cannot convert a MPS Tensor to {found} dtype\"); cast it before the move: {fix}")


def _dtype_problem(policy: Policy, e: Entry, d: Decision) -> Problem | None:
    t = e.tensor
    if d.dtype is None or (not judged_float(t) and d.rule != "storage-computed") or d.dtype_ok(t.dtype):
        return None
    if d.rule == "owner-module" and torch.promote_types(t.dtype, d.dtype) == d.dtype:
        return None  # a narrower attribute is promoted to the module's dtype when it meets its activations
    comp = policy.ctx(e.module_path)[0] if e.module is not None else None
    found, want = dtype_str(t.dtype), dtype_str(d.dtype)
    c = e.info().compact
    where = f"'{comp.path}'" if comp and comp.path else "the model"
    msg = {
        "explicit": f"{c} is {found}, but dtype={want} was asked for",
        "declared-dtype": f"{c} is {found} but {where} is {want} (its config.dtype declares it)",
        "owner-module": f"{c} is {found} but its module '{e.module_path or '<root>'}' computes in {want}: the "
                        f"module's own code uses it as it is (Module.to never casts a plain attribute), so it promotes "
                        f"or breaks the forward",
        "keep_in_fp32": f"{c} is {found} but _keep_in_fp32_modules keeps it in {want}",
        "storage-computed": _storage_message(e, c, found, want, where),
    }.get(d.rule, f"{c} is {found} but {where} is {want}")
    return _problem("dtype", e, found, want, msg)


def _storage_message(e: Entry, c: str, found: str, want: str, where: str) -> str:
    return storage_message(type(e.module).__name__, e.tensor, c, found, want, where,
                           switch=intent.cast_switch(e.module))


def storage_message(layer: str, t: torch.Tensor, c: str, found: str, want: str, where: str,
                    switch: str | None = None) -> str:
    """Rule ``storage-computed``'s text, the same from scan and from a virtual run's module entry. ``switch``: the
    attributes that turn on the layer's own per-call cast, off on this instance (``intent.cast_switch``)."""
    if switch:
        return (f"{c} is {found} storage but {layer}'s per-call cast is switched off ({switch} off on this "
                f"instance), so its forward computes with it as it is ({where} is {want}): switch the cast on, or "
                f"load it as {want}; casting the stored values to {want} is not a dequantization"
                if not t.is_floating_point() or packed_param(t) else
                f"{c} is {found} storage but {layer}'s per-call cast is switched off ({switch} off on this "
                f"instance), so its forward computes with it as it is (torch has no {found} math here; {where} is "
                f"{want}): switch the cast on, or cast it to {want}")
    if t.is_floating_point() and not packed_param(t):  # float8 / float4: a cast is an upcast
        return (f"{c} is {found} storage but {layer}'s own forward computes with it as it is (torch has no {found} "
                f"math here; {where} is {want}): cast it to {want}, or keep {found} storage behind a layer that "
                f"upcasts it (diffusers enable_layerwise_casting)")
    kind = "packed 4-bit" if packed_param(t) else f"{found} (quantized integer)"
    return (f"{c} is {kind} storage but {layer}'s own forward computes with it as it is ({where} is {want}; a "
            f"{layer} never dequantizes): load it dequantized to {want}, or keep it behind a layer that dequantizes "
            f"per call (the quantization library's own layer); casting the stored values to {want} is not a "
            f"dequantization")


def _meta_problem(e: Entry, expected: torch.device | None, text: str | None = None) -> Problem:
    where = device_str(expected) if expected is not None else "a real device"
    text = text or e.info().compact
    return Problem("meta", e.path, e.role, "meta", where, _meta_message(text, where), None, e.module_path,
                   type(e.module).__name__ if e.module is not None else None, (text,))


def _meta_message(text: str, where: str) -> str:
    return (f"{text} holds no data (meta) but should be on {where}; a forward on CPU may silently return "
            "garbage. Load or materialise it (load_state_dict(..., assign=True) or to_empty() then load).")


def _device_problem(e: Entry, exp: torch.device, d: Decision, subject: Any = None) -> Problem:
    why = ""
    own_to = _own_to(subject) if e.module is None else None
    if own_to is not None:
        # an object that is not a module but moves its tensors itself (diffusers' EMAModel.to(device=)): scan
        # never runs it, so the move is named as the one to try
        why = (f" (held by {own_to}, not by a module, so no Module.to moves it; {own_to} has its own to(): call it "
               f"with device={device_str(exp)!r} (unproven: scan never runs it))")
    elif not e.moved_by_module_to:
        why = " (Module.to never moves it: it is not a parameter or buffer of the tree)"
    elif d.rule == "hook-device":
        why = " (its accelerate hook runs it there: device_map)"
    elif d.rule == "patcher-device":
        why = " (the app's model patcher loaded the model there: its load_device)"
    elif d.rule == "explicit":
        why = " (device= asked for)"
    found = device_str(e.tensor.device)
    return _problem("device", e, found, device_str(exp), f"{e.info().compact} is on {found}, expected {device_str(exp)}{why}")


def _own_to(subject: Any) -> str | None:
    """The class name of a scanned object that is not a module nor a container and defines its own ``to``."""
    if subject is None or isinstance(subject, (torch.nn.Module, torch.Tensor, dict, list, tuple, set)):
        return None
    tp = type(subject)
    fn = next((k.__dict__["to"] for k in tp.__mro__ if "to" in k.__dict__), None)
    return tp.__name__ if callable(fn) else None


def _judge_adapters(policy: Policy) -> list[Problem]:
    groups: dict[tuple[str, str], list[Entry]] = {}
    for e, _ in policy.canon:
        key = policy.adapter_of.get(e.path)
        if key is not None:
            groups.setdefault(key, []).append(e)
    problems = []
    for (layer, name), entries in groups.items():
        floats = [e for e in entries if e.tensor.is_floating_point()]
        base = policy.base_device.get(layer)
        patched = layer in policy.patched  # a forward-replacing network (sd-scripts) beside the module it patches
        for e in floats:
            if base is not None and base.type != "meta" and e.tensor.device.type != "meta" \
                    and not same_device(e.tensor.device, base) and policy.device is None:
                problems.append(_problem(
                    "device", e, device_str(e.tensor.device), device_str(base),
                    f"adapter '{name}' tensor {e.info().compact} is on {device_str(e.tensor.device)} but " + (
                        f"the module it patches, '{layer}'," if patched else f"its base layer '{layer}.base_layer'")
                    + f" is on {device_str(base)}"))
        if len({e.tensor.dtype for e in floats}) > 1:
            major = policy.adapter_dtype(floats[0].path) or floats[0].tensor.dtype
            for e in floats:
                if e.tensor.dtype != major:
                    problems.append(_problem(
                        "dtype", e, dtype_str(e.tensor.dtype), dtype_str(major),
                        f"adapter '{name}' of '{layer}' mixes dtypes: {e.info().compact} while the rest of the "
                        f"adapter is {dtype_str(major)}" + (f" (it replaces the forward of '{layer}')" if patched
                                                            else "")))
    return problems


def _problem(kind: str, e: Entry, found: str, expected: str, message: str) -> Problem:
    return Problem(kind, e.path, e.role, found, expected, message, None, e.module_path,
                   type(e.module).__name__ if e.module is not None else None, (e.info().compact,))


def cpu_packed_message(path: str, where: str) -> str:
    """Why a CPU-packed 4-bit weight cannot compute on ``where``, and the way out (shared with virtual runs)."""
    return (f"{path} is a bitsandbytes 4-bit weight in its CPU-packed layout (packing_format_for_cpu: made by the "
            f"first eval forward on a CPU with AVX512-BF16) on {where}: only the CPU kernel reads that layout and "
            f"Params4bit.to() keeps it. Move the model with model.cuda() / model.xpu() (they unpack it), or reload "
            f"it; torchdoctor.move refuses it for the same reason")

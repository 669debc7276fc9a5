"""Names for what guard reports: paths of the guarded model's modules and tensors (walked only after something went
wrong), module labels, and the fix as code to paste."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from torchdoctor._guard.float8 import compute_dtype
from torchdoctor._rules import registry as _rules
from torchdoctor._report.model import Problem
from torchdoctor._placement import FLOAT8_DTYPES, device_str, dtype_str


class Maps:
    """Paths of one root's modules and tensors (walked once, only after something went wrong or needs a name)."""

    def __init__(self, root: Any) -> None:
        from torchdoctor._walk import walk

        w = walk(root)
        self.walk = w
        self._policy_problems: list[Problem] | None = None
        self.modules = {id(m): p for p, m in w.modules}
        self.dicts = frozenset(p for p, m in w.modules if isinstance(m, nn.ModuleDict))
        self.tensors: dict[int, str] = {}
        self.starts: dict[tuple[str, int], str] = {}
        self.keep = [e.tensor for e in w.entries]  # ids stay unique while the map lives
        dtype_bytes: dict[torch.dtype, int] = {}
        device_bytes: dict[torch.device, int] = {}
        for e in w.entries:
            t = e.tensor
            self.tensors.setdefault(id(t), e.path)
            if e.alias_of is not None or e.role not in ("parameter", "buffer"):
                continue
            try:
                if t.device.type != "meta":
                    self.starts.setdefault((str(t.device), t.data_ptr()), e.path)
                if t.is_floating_point() and t.dtype not in FLOAT8_DTYPES:  # float8 is storage, not compute
                    n = t.nelement() * t.element_size()
                    dtype_bytes[t.dtype] = dtype_bytes.get(t.dtype, 0) + n
                    d = _rules._norm(_rules.tensor_device(t))
                    device_bytes[d] = device_bytes.get(d, 0) + n
            except Exception:  # odd subclasses: skip, a diagnostic must not break
                continue
        self.dtype = max(dtype_bytes, key=dtype_bytes.__getitem__) if dtype_bytes else None
        self.device = max(device_bytes, key=device_bytes.__getitem__) if device_bytes else None
        from torchdoctor._scan.expect import Expectations

        self.expect = Expectations(w)

    def policy_problems(self) -> list[Problem]:
        """The model's off-policy tensors (what scan reports), computed at the first failure that asks."""
        if self._policy_problems is None:
            from torchdoctor._guard.provenance import policy_problems

            self._policy_problems = self._by_holding(policy_problems(self.walk))
        return self._policy_problems

    def overruled(self, module_path: str | None) -> bool:
        """Does the model's dtype, judged by what holds its parameters (bytes, the frozen base included), overrule
        the policy's count of tensors for this module (two small float32 LoRA tensors beside one large bf16
        weight: the model is bf16)? Only for the model's own component decided by a vote."""
        held = self.held_dtype()
        if held is None or module_path is None:
            return False
        try:
            comp = self.expect.policy.ctx(module_path)[0]
        except Exception:  # the policy's view stands
            return False
        return comp is not None and comp.path == "" and comp.dtype_rule == "vote" and comp.dtype is not None \
            and comp.dtype != held and self.expect.dtype(module_path) == comp.dtype

    def held_dtype(self) -> torch.dtype | None:
        """The dtype that holds over half of the model's floating elements (float8 storage aside), or None. It
        speaks for a frozen base (parameters that take no gradient beside trainable ones in another dtype in its
        own layer, as adapters are trained on a base: ``q.base_layer.weight`` beside ``q.lora_A.default.weight``)
        or for whole layers in it (two tensors or more, in layers that hold no other floating dtype: a large
        denoiser beside a small float32 VAE). One large weight left in another dtype beside its own layer's bias
        is the odd one, however many elements it holds; so is one frozen weight a merge made in another dtype
        (a LoRA merged into a dequantized GGUF weight) beside trainable layers of their own."""
        if not hasattr(self, "_held"):
            n: dict[torch.dtype, int] = {}
            frozen: dict[torch.dtype, set[str]] = {}  # a dtype -> the layers holding its frozen parameters
            trained: list[tuple[torch.dtype, str]] = []
            layers: dict[str, list[torch.dtype]] = {}
            for e in self.walk.entries:
                t = e.tensor
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype not in FLOAT8_DTYPES:
                    n[t.dtype] = n.get(t.dtype, 0) + t.nelement()
                    layer = e.path.rpartition(".")[0]
                    if isinstance(t, nn.Parameter) and t.requires_grad:
                        trained.append((t.dtype, layer))
                    elif isinstance(t, nn.Parameter):
                        frozen.setdefault(t.dtype, set()).add(layer)
                    layers.setdefault(layer, []).append(t.dtype)
            top = max(n, key=n.__getitem__) if n else None
            whole = sum(len(ds) for ds in layers.values() if all(d == top for d in ds))
            based = top in frozen and any(d != top and _beside(m, frozen[top]) for d, m in trained) or whole >= 2
            self._held = top if top is not None and based and n[top] * 2 > sum(n.values()) else None
        return self._held

    def _by_holding(self, problems: list[Problem]) -> list[Problem]:
        """The policy's dtype findings, with the model's dtype judged by what holds it where the vote disagrees."""
        if not self.overruled(""):
            return problems
        held = self.held_dtype()
        want = dtype_str(held)
        out = [p for p in problems if not (p.kind == "dtype" and self.overruled(p.module_path or ""))]
        for e in self.walk.entries:
            t = e.tensor
            mp = e.path.rsplit(".", 1)[0] if "." in e.path else ""
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype not in FLOAT8_DTYPES \
                    and t.dtype != held and self.overruled(mp):
                found = dtype_str(t.dtype)
                out.append(Problem("dtype", e.path, "parameter" if isinstance(t, nn.Parameter) else "buffer", found,
                                   want, f"{e.path} is {found} in a model whose parameters are {want}",
                                   module_path=mp, tensors=(_rules._compact(t),)))
        return out

    def dtype_for(self, module_path: str | None) -> torch.dtype | None:
        """The dtype a module's ops should agree on, as scan sees it (its component, its peft adapter ...)."""
        want = self.expect.dtype(module_path) if module_path is not None else None
        if want is not None and self.overruled(module_path):
            return self.held_dtype()
        return want if want is not None and want not in FLOAT8_DTYPES else self.dtype

    def tensor_path(self, t: torch.Tensor) -> tuple[str, str] | None:
        """(path, how) of a model tensor, its view, or a tensor starting at its memory."""
        p = self.tensors.get(id(t))
        if p is not None:
            return p, ""
        try:
            base = t._base
            if base is not None and id(base) in self.tensors:
                return self.tensors[id(base)], " (a view)"
            if t.device.type != "meta":
                p = self.starts.get((str(t.device), t.data_ptr()))
                if p is not None:
                    return p, " (same memory)"
        except Exception:
            pass
        return None


def module_label(path: str | None, mod: Any) -> str:
    if mod is None and path is None:  # an op in the user's code between modules (a scheduler step)
        return "code outside any module"
    return f"`{path or '<root>'}`" if path is not None else f"`<{type(mod).__name__} outside the guarded model>`"


def code_path(path: str, var: str = "model", dicts: Collection[str] = ()) -> str:
    """``layers.0.mlp.weight`` -> ``model.layers[0].mlp.weight`` (Python you can paste); under the ``nn.ModuleDict``
    paths in ``dicts`` a digit key stays a string (``model.heads['0']``)."""
    out, prefix = var, None
    for part in path.split(".") if path else []:
        if part.isdigit() and prefix not in dicts:
            out += f"[{part}]"
        else:
            out += f".{part}" if part.isidentifier() else f"[{part!r}]"
        prefix = part if prefix is None else f"{prefix}.{part}"
    return out


def value_code(v: Any) -> str:
    """``torch.bfloat16``, ``'cuda:0'``, or both for a (device, dtype) pair."""
    if isinstance(v, tuple):
        return ", ".join(value_code(x) for x in v)
    if isinstance(v, torch.dtype):
        return f"torch.{dtype_str(v)}"
    return repr(device_str(v))


def both(maps: Any, culprits: Sequence[tuple[str | None, str, str, Any]]) -> list[tuple[str | None, str, str, Any]]:
    """Culprits whose tensor the model's policy also finds off in the other kind (an fp32 CPU attribute of a bf16
    CUDA model, blamed for its device) get (device, dtype) as their target: one fix mends both, and the next run
    meets no silent promotion where the device error was."""
    if maps is None or not any(c[0] is not None for c in culprits):
        return list(culprits)
    from torchdoctor._placement import parse_device, parse_dtype

    off: dict[tuple[str, str], Any] = {}
    for p in maps.policy_problems():
        try:
            off.setdefault((p.path, p.kind), parse_dtype(p.expected) if p.kind == "dtype" else
                           parse_device(p.expected) if p.kind == "device" else None)
        except (ValueError, TypeError):
            continue
    out = []
    for path, label, kind, target in culprits:
        if path is not None and kind in ("device", "dtype") and target is not None and not isinstance(target, tuple):
            other = off.get((path, "dtype" if kind == "device" else "device"))
            if isinstance(other, (torch.dtype, torch.device)) and not (
                    isinstance(other, torch.dtype) and (not other.is_floating_point or other in FLOAT8_DTYPES)):
                target = (target, other) if kind == "device" else (other, target)
        out.append((path, label, kind, target))
    return out


def fix_code(culprits: Sequence[tuple[str | None, str, str, Any]], dicts: Collection[str] = ()) -> str | None:
    """Culprits as (model path or None, label, kind, target) -> code to paste (``dicts``: see ``code_path``)."""
    lines: list[str] = []
    params = [c for c in culprits if c[0] is not None]
    if len(params) > 4:
        lines.extend(_moves(params, dicts))
    else:
        meta = [code_path(c[0] or "", dicts=dicts) for c in params if c[2] == "meta"]
        if meta:  # one load brings every tensor on meta: said once, whichever of them are named
            lines.append(f"# {', '.join(meta)} {'is' if len(meta) == 1 else 'are'} on meta (no data): "
                         f"load {'its' if len(meta) == 1 else 'their'} weights, e.g.")
            lines.append("model.load_state_dict(state_dict, strict=False, assign=True)")
        for path, _label, kind, target in params:
            if kind != "meta" and target is not None:
                expr = code_path(path or "", dicts=dicts)
                lines.append(f"{expr}.data = {expr}.data.to({value_code(target)})")
    for path, label, kind, target in culprits:
        if path is None and target is not None and kind != "meta":
            lines.append(f"# pass {label} as tensor.to({value_code(target)})")
    return "\n".join(dict.fromkeys(lines)) or None


def holding_module(paths: Sequence[str]) -> str:
    """The path of the deepest module holding every tensor of ``paths`` (``blocks.0.attn.weight``, ...; "" for the
    model itself)."""
    mods = [p.rpartition(".")[0].split(".") if "." in p else [] for p in paths]
    common = mods[0] if mods else []
    for parts in mods[1:]:
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    return ".".join(common)


def _moves(params: Sequence[tuple[str | None, str, str, Any]], dicts: Collection[str]) -> list[str]:
    """Many culprits as ``torchdoctor.move`` calls: one for the model when they ask for one device and one dtype at
    most; else one per target, at the deepest module holding all of that target's tensors (one call never names a
    keyword twice, ``dtype=torch.bfloat16, dtype=torch.float32``), the largest group kept where two would move the
    same module two ways, the outer modules' moves before the inner ones'."""
    def keywords(targets: Any) -> str:
        ordered = sorted(targets, key=lambda t: isinstance(t, torch.dtype))  # device=..., then dtype=...
        return ", ".join(f"{'dtype' if isinstance(t, torch.dtype) else 'device'}={value_code(t)}" for t in ordered)

    flat = list(dict.fromkeys(t for c in params if c[3] is not None
                              for t in (c[3] if isinstance(c[3], tuple) else (c[3],))))
    if sum(isinstance(t, torch.dtype) for t in flat) <= 1 and sum(not isinstance(t, torch.dtype) for t in flat) <= 1:
        return [f"torchdoctor.move(model, {keywords(flat)})"]
    groups: dict[Any, list[str]] = {}
    for path, _label, _kind, target in params:
        if target is not None:
            groups.setdefault(target, []).append(path or "")
    where: dict[str, tuple[int, str]] = {}
    for target, paths in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        prefix = holding_module(paths)
        if prefix not in where:
            where[prefix] = (len(paths), f"torchdoctor.move({code_path(prefix, dicts=dicts)}, "
                                         f"{keywords(target if isinstance(target, tuple) else (target,))})")
    # the model's own move first, then each deeper module's, so no later move undoes an earlier one
    return [where[k][1] for k in sorted(where, key=lambda k: (k.count(".") + (1 if k else 0), k))]


def component_fix(comp: str, want: torch.dtype, dicts: Collection[str] = ()) -> str:
    """Cast (or load) a whole component in the dtype the data flowing into it has."""
    expr = code_path(comp, dicts=dicts)
    return (f"{expr}.to({value_code(want)})  # or load it with torch_dtype={value_code(want)}\n"
            f"# (to run it in float32 instead, pass its inputs as tensor.to(torch.float32))")


def retarget(f: _rules.Finding, tensors: Mapping[Any, torch.Tensor], maps: Maps, mpath: str | None
             ) -> tuple[Any, list[Any]]:
    """Align to the model's majority (its adapter's dtype inside a peft adapter) when it is among the values at
    hand (a wrong input is cast, not the model). float8 is never the majority aligned to: it is storage, and an
    activation cast to it loses its precision (and most kernels have no float8 body)."""
    keys = list(f.considered or f.offenders)
    want: Any
    if f.attr == "dtype":
        want, value = compute_dtype(maps.dtype_for(mpath)), (lambda t: t.dtype)
    else:
        want, value = maps.device, (lambda t: _rules._norm(_rules.tensor_device(t)))
    target = want if want is not None and any(value(tensors[k]) == want for k in keys) else f.target
    if target == f.target:
        return target, list(f.offenders)
    return target, [k for k in keys if value(tensors[k]) != target]


def value_str(t: torch.Tensor, attr: str) -> str:
    return dtype_str(t.dtype) if attr == "dtype" else device_str(_rules.tensor_device(t))


def value_str_of(v: Any) -> str:
    return dtype_str(v) if isinstance(v, torch.dtype) else device_str(v)


def reference(pool: list[tuple[str | None, str, torch.Tensor]], kind: str, value: Callable[[torch.Tensor], Any],
               maps: Maps | None, mentioned: set[Any], mpath: str | None = None) -> Any:
    """What the culprits disagree with: the model's majority (for dtypes as scan sees it: the component's, the peft
    adapter's) when present here or named by the error, else the first input, else the bytes-majority of the
    module's own tensors."""
    if not pool:
        return None
    values = [value(c[2]) for c in pool]
    real = [v for v in values if not (isinstance(v, torch.device) and v.type == "meta")]
    if kind == "dtype" and any(v not in FLOAT8_DTYPES for v in real):  # float8 is storage: never what others should be
        real = [v for v in real if v not in FLOAT8_DTYPES]
    majority = (maps.dtype_for(mpath) if kind == "dtype" else maps.device) if maps is not None else None
    if majority is not None and (majority in real or majority in mentioned):
        return majority
    inputs = [value(c[2]) for c in pool if c[0] is None and value(c[2]) in real]
    if inputs:
        return inputs[0]
    weight: dict[Any, int] = {}
    for c, v in zip(pool, values):
        if v in real:
            weight[v] = weight.get(v, 0) + c[2].nelement() * c[2].element_size()
    return max(weight, key=weight.__getitem__) if weight else None


def stated(message: str, kind: str) -> Any:
    """The device an error says the tensors must be on, where it says so outright (``nn.DataParallel``: "module must
    have its parameters and buffers on device cuda:0 (device_ids[0]) but found one of them on device: cpu"): what the
    culprits disagree with, whatever most of them hold; None otherwise."""
    import re

    m = re.search(r"must have its parameters and buffers on device (\w+(?::\d+)?)", message) if kind == "device" else None
    if m is None:
        return None
    from torchdoctor._placement import norm_device, parse_device

    try:
        return norm_device(parse_device(m.group(1)))
    except (ValueError, RuntimeError):  # not a device torch knows: as before
        return None


def _beside(layer: str, bases: set[str]) -> bool:
    """A trained tensor's layer is one of the frozen ``bases``' layers, or sits in the module above one of them that
    is no model root (``q`` of ``q.base_layer``): an adapter on that base."""
    for b in bases:
        above = b.rpartition(".")[0]
        if layer == b or (b and layer.startswith(b + ".")) or (above and (layer == above or
                                                                          layer.startswith(above + "."))):
            return True
    return False


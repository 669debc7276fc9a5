"""The strict rules: which devices and dtypes an aten op accepts together, as data.

``check(op, args, kwargs, profile)`` judges one op call before it runs, as ``guard(mode="strict")`` and
``simulate`` see it from a ``TorchDispatchMode``. The rules are directional: a norm accepts a bf16 input
with fp32 weight and bias but not the reverse; mm/linear/conv need equal dtypes; a CPU 0-dim scalar may join
a device op; indexing accepts CPU indices; copies cross devices. A meta tensor meeting real data is always a
problem: on CPU, linear/matmul/conv with a meta weight silently return uninitialised memory.

Rules are registered per op family by ``@rule`` (which refuses duplicates); ``RULES.merged({...})`` gives a
copy with per-call overrides. Cost matters (FIELD-NOTES §7): one level over args and kwargs, a dict lookup
keyed by the ``OpOverload``, and a fast path that returns at once when every tensor shares device and dtype.

>>> import torch
>>> a, b = torch.ones(2, 2), torch.ones(2, 2, dtype=torch.bfloat16)
>>> check(torch.ops.aten.mm.default, (a, b), {}).kind
'dtype'
>>> check(torch.ops.aten.native_layer_norm.default, (b, [2], a[0], a[0], 1e-5), {}) is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from torchdoctor._report import Problem, compact, device_str, dtype_str

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._profile import DeviceProfile

__all__ = ["RULES", "Finding", "Rule", "Rules", "check", "check_all", "describe_args", "find", "rule", "tensor_device"]

_Tensor = torch.Tensor
Key = tuple[Any, int]  # (position or kwarg name, index in a list argument or -1)
_REDUCED = (torch.bfloat16, torch.float16)
_INDEX_ARGS = frozenset({"index", "indices", "mask", "offs", "offsets", "per_sample_weights", "target"})


def tensor_device(t: torch.Tensor) -> torch.device:
    """The device a tensor stands for: a simulator's virtual ``_td_device``, a FakeTensor's ``fake_device``,
    else ``t.device``. Every rule sees devices through this one function (STYLE 11)."""
    d = getattr(t, "_td_device", None)
    if d is not None:
        return d if isinstance(d, torch.device) else torch.device(d)
    d = getattr(t, "fake_device", None)
    if d is not None:
        return d
    return t.device


def _norm(d: torch.device) -> torch.device:
    # cuda == cuda:0 (STYLE 11); cpu stays bare
    if d.index is None and d.type not in ("cpu", "meta"):
        return torch.device(d.type, 0)
    return d


@dataclass(frozen=True)
class Finding:
    """A problem plus what a fixer needs: which arguments to move (``offenders``) and where (``target``).

    ``considered`` are the arguments that take part in the agreement; a fixer may pick another ``target``
    among their values (the model's majority) and move every considered argument that differs.
    """

    problem: Problem
    attr: str  # "device" | "dtype" | ""
    target: Any  # torch.device | torch.dtype | None
    offenders: tuple[Key, ...]
    considered: tuple[Key, ...] = ()


@dataclass(frozen=True)
class Rule:
    """One op family: its device policy, its dtype check and the profile family for dtype support."""

    family: str
    ops: tuple[str, ...]
    device: str  # "same" | "index" | "copy" | "free"
    dtype: Check | None
    support: str = "storage"  # DeviceProfile.supports family (matmul, conv, norm, sdpa, scaled_mm, storage)
    uniform_too: bool = False  # judge even when every tensor shares device and dtype (float embedding indices)


Check = Callable[["_Call"], "list[Finding]"]


@dataclass
class _Call:
    """One op call, tensors gathered once (slow path only)."""

    op: Any
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    tensors: list[tuple[Key, torch.Tensor]]
    names: tuple[str, ...]

    def name_of(self, key: Key) -> str:
        pos = key[0]
        if isinstance(pos, str):
            return pos
        return self.names[pos] if pos < len(self.names) else f"arg{pos}"

    def label(self, key: Key) -> str:
        pos, j = key
        item = f"[{j}]" if j >= 0 else ""
        if isinstance(pos, str):
            return f"kwarg {pos}{item}"
        return f"arg {pos} ({self.name_of(key)}{item})"

    def get(self, pos: Any) -> Any:
        if isinstance(pos, str):
            return self.kwargs.get(pos)
        if pos < len(self.args):
            return self.args[pos]
        name = self.names[pos] if pos < len(self.names) else None
        return self.kwargs.get(name) if name else None

    def tensor(self, pos: Any) -> torch.Tensor | None:
        v = self.get(pos)
        return v if isinstance(v, _Tensor) else None

    def key_of(self, pos: int) -> Key:
        return (pos, -1) if pos < len(self.args) else (self.names[pos], -1)


class Rules:
    """The registry: family name -> ``Rule``; op name (``aten::mm``) -> family. Lookups cached per OpOverload."""

    def __init__(self) -> None:
        self.families: dict[str, Rule] = {}
        self.by_name: dict[str, str] = {}
        self._by_op: dict[Any, Rule] = {}

    def add(self, r: Rule) -> None:
        if r.family in self.families:
            raise ValueError(f"rule family {r.family!r} is registered twice")
        for name in r.ops:
            if name in self.by_name:
                raise ValueError(f"op {name!r} already belongs to rule family {self.by_name[name]!r}")
        self.families[r.family] = r
        for name in r.ops:
            self.by_name[name] = r.family

    def merged(self, overrides: Mapping[str, str | Rule]) -> Rules:
        """A copy where each ``op name -> family name`` (or ``-> Rule``) override applies; the global table stays."""
        new = Rules()
        new.families = dict(self.families)
        new.by_name = dict(self.by_name)
        for name, target in overrides.items():
            name = _qualified(name)
            if isinstance(target, Rule):
                new.families[target.family] = target
                target = target.family
            if target not in new.families:
                raise ValueError(f"unknown rule family {target!r}; known: {', '.join(new.families)}")
            new.by_name[name] = target
        return new

    def for_op(self, op: Any) -> Rule:
        r = self._by_op.get(op)
        if r is None:
            r = self._by_op[op] = self._lookup(op)
        return r

    def _lookup(self, op: Any) -> Rule:
        schema = getattr(op, "_schema", None)
        name = schema.name if schema is not None else str(op)
        fam = self.by_name.get(name)
        if fam is None:
            base = name.split("::")[-1]
            if base.startswith(("_foreach_", "_fused_")):
                fam = "multi_tensor"
            elif "scaled_dot_product" in base or base in ("_flash_attention_forward", "_efficient_attention_forward"):
                fam = "attention"
            else:
                fam = "elementwise"
        return self.families[fam]


def _qualified(name: str) -> str:
    return name if "::" in name else f"aten::{name}"


RULES = Rules()


def rule(family: str, ops: Sequence[str] = (), *, device: str = "same", support: str = "storage",
         uniform_too: bool = False) -> Callable[[Check | None], Check | None]:
    """Register the dtype check of an op family (``None`` for families with a device policy only)."""

    def register(fn: Check | None) -> Check | None:
        RULES.add(Rule(family, tuple(_qualified(o) for o in ops), device, fn, support, uniform_too))
        return fn

    return register


# --- the generic device rule ---------------------------------------------------------------------------------


def _gather(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[Key, torch.Tensor]]:
    out: list[tuple[Key, torch.Tensor]] = []
    for i, a in enumerate(args):
        if isinstance(a, _Tensor):
            out.append(((i, -1), a))
        elif type(a) is list or type(a) is tuple:
            out.extend(((i, j), b) for j, b in enumerate(a) if isinstance(b, _Tensor))
    for k, a in kwargs.items():
        if isinstance(a, _Tensor):
            out.append(((k, -1), a))
        elif type(a) is list or type(a) is tuple:
            out.extend(((k, j), b) for j, b in enumerate(a) if isinstance(b, _Tensor))
    return out


def label(op: Any, key: Key) -> str:
    """How messages name one argument of ``op``: ``arg 1 (mat2)``, ``arg 1 (indices[0])``, ``kwarg attn_mask``."""
    return _Call(op, (), {}, [], _arg_names(op)).label(key)


def _is_cpu_scalar(t: torch.Tensor, d: torch.device) -> bool:
    return d.type == "cpu" and t.dim() == 0


def _problem(c: _Call, kind: str, offenders: Sequence[Key], found: str, expected: str, message: str) -> Problem:
    return Problem(kind, c.label(offenders[0]) if offenders else str(c.op), "argument", found, expected,
                   f"{c.op}: {message}", op=str(c.op), tensors=tuple(describe_call(c)))


def _device_findings(c: _Call, items: list[tuple[Key, torch.Tensor]]) -> list[Finding]:
    devs = [(k, _norm(tensor_device(t)), t) for k, t in items]
    if any(d.type != "cpu" for _, d, _ in devs):  # CPU 0-dim scalars may join any device's op
        devs = [x for x in devs if not _is_cpu_scalar(x[2], x[1])]
    if len({d for _, d, _ in devs}) <= 1:
        return []
    real = [(k, d) for k, d, _ in devs if d.type != "meta"]
    metas = [k for k, d, _ in devs if d.type == "meta"]
    if metas and real:
        where = device_str(real[0][1])
        msg = (f"{c.label(metas[0])} is on meta (no data) and meets real tensors on {where}; "
               "a meta weight in linear/matmul/conv silently computes garbage on CPU")
        return [Finding(_problem(c, "meta", metas, "meta", where, msg), "", None, tuple(metas))]
    want = devs[0][1]
    bad = [k for k, d, _ in devs if d != want]
    found = device_str(next(d for k, d, _ in devs if d != want))
    msg = f"{c.label(bad[0])} is on {found}, the first operand {c.label(devs[0][0])} on {device_str(want)}"
    return [Finding(_problem(c, "device", bad, found, device_str(want), msg), "device", want, tuple(bad),
                    tuple(k for k, _, _ in devs))]


def _index_device(c: _Call) -> list[Finding]:
    # x_cuda[idx_cpu] is legal, x_cpu[idx_cuda] is not ("indices should be either on cpu or on the same device
    # as the indexed tensor"); values of index_put_ follow the indexed tensor (0-dim CPU scalars excepted)
    if not c.tensors or c.tensors[0][0] != (0, -1):
        return _device_findings(c, c.tensors)
    self_t = c.tensors[0][1]
    home = _norm(tensor_device(self_t))
    out: list[Finding] = []
    idx = [(k, t) for k, t in c.tensors[1:] if c.name_of(k) == "indices"]
    rest = [(k, t) for k, t in c.tensors[1:] if c.name_of(k) != "indices"]
    bad_idx = [(k, _norm(tensor_device(t))) for k, t in idx]
    bad_idx = [(k, d) for k, d in bad_idx if d != home and not (d.type == "cpu" and home.type != "cpu")]
    if bad_idx:
        k, d = bad_idx[0]
        kind = "meta" if "meta" in (d.type, home.type) else "device"
        msg = (f"{c.label(k)} is on {device_str(d)}; indices must be on cpu or on the indexed tensor's device "
               f"{device_str(home)}")
        keys = tuple(k for k, _ in bad_idx)
        out.append(Finding(_problem(c, kind, keys, device_str(d), device_str(home), msg),
                           "device" if kind == "device" else "", home if kind == "device" else None, keys, keys))
    if rest:
        out.extend(_device_findings(c, [c.tensors[0], *rest]))
    return out


_READS_DATA = frozenset({"aten::_to_copy", "aten::copy_", "aten::to", "aten::_copy_from",
                         "aten::_copy_from_and_resize"})


def _copy_device(c: _Call) -> list[Finding]:
    # copies cross devices legally, but nothing can be read out of meta ("Cannot copy out of meta tensor")
    if getattr(getattr(c.op, "_schema", None), "name", "") not in _READS_DATA or not c.tensors:
        return []
    if "src" in c.names:  # copy_(self, src): src -> self
        src_pos, dst = c.names.index("src"), c.tensor(0)
        dst_dev = tensor_device(dst) if dst is not None else None
    elif "dst" in c.names:  # _copy_from(self, dst): self -> dst
        src_pos, dst = 0, c.tensor(c.names.index("dst"))
        dst_dev = tensor_device(dst) if dst is not None else None
    else:  # _to_copy(self, dtype=, device=)
        src_pos, dev = 0, c.kwargs.get("device")
        dst_dev = torch.device(dev) if dev is not None else None
    src = c.tensor(src_pos)
    if src is None or dst_dev is None or dst_dev.type == "meta" or tensor_device(src).type != "meta":
        return []
    key = c.key_of(src_pos)
    msg = f"{c.label(key)} is on meta (no data) and is copied to {device_str(dst_dev)}"
    return [Finding(_problem(c, "meta", [key], "meta", device_str(dst_dev), msg), "", None, (key,))]


_DEVICE_POLICIES: dict[str, Check] = {
    "same": lambda c: _device_findings(c, c.tensors),
    "index": _index_device,
    "copy": _copy_device,
    "free": lambda c: [],
}


# --- dtype rules ---------------------------------------------------------------------------------------------


def _dtype_finding(c: _Call, considered: list[tuple[Key, torch.Tensor]], want: torch.dtype, why: str) -> Finding:
    bad = [k for k, t in considered if t.dtype != want]
    found = next(t.dtype for k, t in considered if t.dtype != want)
    msg = f"{c.label(bad[0])} is {dtype_str(found)}, expected {dtype_str(want)} {why}"
    return Finding(_problem(c, "dtype", bad, dtype_str(found), dtype_str(want), msg), "dtype", want, tuple(bad),
                   tuple(k for k, _ in considered))


def _floats(c: _Call) -> list[tuple[Key, torch.Tensor]]:
    """The operands a dtype rule compares: floating, not 0-dim scalars, not index-like arguments."""
    return [(k, t) for k, t in c.tensors
            if t.dim() > 0 and (t.is_floating_point() or t.is_complex()) and c.name_of(k) not in _INDEX_ARGS]


_PRIMARY_1 = frozenset({"aten::addmm", "aten::addmv", "aten::addbmm", "aten::baddbmm", "aten::addr",
                        "aten::_addmm_activation"})


@rule("matmul", ("mm", "bmm", "addmm", "addmv", "addbmm", "baddbmm", "addr", "mv", "dot", "vdot", "matmul", "linear",
                 "_addmm_activation", "_grouped_mm", "inner", "ger", "chain_matmul", "multi_dot", "_int_mm"),
      support="matmul")
def _equal_dtypes(c: _Call) -> list[Finding]:
    """mm / linear / conv: every floating operand in one dtype (the input's, i.e. mat1 for the add* ops)."""
    fl = _floats(c)
    if len({t.dtype for _, t in fl}) <= 1:
        return []
    name = getattr(getattr(c.op, "_schema", None), "name", "")
    first = 1 if name in _PRIMARY_1 and len(fl) > 1 and fl[0][0] == (0, -1) else 0
    return [_dtype_finding(c, fl, fl[first][1].dtype, f"like {c.label(fl[first][0])}")]


rule("convolution", ("convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                     "conv_transpose3d", "convolution_overrideable", "mkldnn_convolution", "cudnn_convolution",
                     "cudnn_convolution_transpose", "miopen_convolution", "_slow_conv2d_forward", "thnn_conv2d",
                     "slow_conv3d_forward", "slow_conv_transpose2d", "slow_conv_dilated2d", "_conv_depthwise2d",
                     "convolution_backward", "_nnpack_spatial_convolution"), support="conv")(_equal_dtypes)


@rule("norm", ("native_layer_norm", "layer_norm", "native_group_norm", "group_norm", "batch_norm", "native_batch_norm",
               "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
               "_batch_norm_with_update", "_batch_norm_no_update", "instance_norm", "cudnn_batch_norm",
               "miopen_batch_norm", "rms_norm", "_fused_rms_norm"), support="norm")
def _norm_dtypes(c: _Call) -> list[Finding]:
    """Directional: the parameters share one dtype, the input's, or fp32 under a bf16/fp16 input."""
    if not c.tensors or c.tensors[0][0] != (0, -1):
        return []
    x = c.tensors[0][1]
    params = [(k, t) for k, t in c.tensors[1:] if t.dim() > 0 and t.is_floating_point()]
    if not params:
        return []
    dts = {t.dtype for _, t in params}
    considered = [c.tensors[0], *params]
    if len(dts) > 1:
        want = x.dtype if x.dtype in dts else params[0][1].dtype
        return [_dtype_finding(c, params, want, "like the other normalization parameters")]
    p = params[0][1].dtype
    if p == x.dtype or (x.dtype in _REDUCED and p == torch.float32):
        return []
    f = _dtype_finding(c, params, x.dtype, f"for a {dtype_str(x.dtype)} input (a bfloat16/float16 input also "
                                          "accepts float32 parameters, not the reverse)")
    return [Finding(f.problem, f.attr, f.target, f.offenders, tuple(k for k, _ in considered))]


@rule("attention", ("scaled_dot_product_attention",), support="sdpa")
def _sdpa_dtypes(c: _Call) -> list[Finding]:
    """q, k and v in one dtype; the mask bool, float32 or the query's dtype."""
    q = c.tensor(0)
    if q is None:
        return []
    qkv = [(c.key_of(i), t) for i in range(3) if (t := c.tensor(i)) is not None]
    out = []
    if len({t.dtype for _, t in qkv}) > 1:
        out.append(_dtype_finding(c, qkv, q.dtype, "like the query"))
    for name in ("attn_mask", "attn_bias"):
        if name not in c.names:
            continue
        pos = c.names.index(name)
        m = c.tensor(pos)
        if m is not None and m.dtype not in (torch.bool, torch.float32, q.dtype):
            out.append(_dtype_finding(c, [(c.key_of(pos), m)], q.dtype, "(a mask is bool, float32 or the query's dtype)"))
    return out


@rule("embedding", ("embedding", "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only"), uniform_too=True)
def _embedding_dtypes(c: _Call) -> list[Finding]:
    """Any float weight; indices must be integers."""
    idx = [(k, t) for k, t in c.tensors if c.name_of(k) == "indices"]
    bad = [(k, t) for k, t in idx if t.is_floating_point() or t.is_complex()]
    if not bad:
        return []
    return [_dtype_finding(c, bad, torch.int64, "(embedding indices are int64 or int32)")]


def _self_source(c: _Call) -> list[Finding]:
    """In-place writes and interpolations: the source in the destination's dtype (no promotion)."""
    fl = _floats(c)
    if len({t.dtype for _, t in fl}) <= 1 or fl[0][0] != (0, -1):
        return []
    return [_dtype_finding(c, fl, fl[0][1].dtype, f"like the destination {c.label(fl[0][0])} (no type promotion)")]


rule("scaled_mm", ("_scaled_mm", "_scaled_mm_v2", "_scaled_grouped_mm"), support="scaled_mm")(None)  # e4m3 x e5m2 is legal
rule("index", ("index", "_unsafe_index"), device="index")(None)
rule("index_put", ("index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"), device="index")(_self_source)
rule("write_source", ("index_add", "index_add_", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
                      "scatter_reduce_", "index_copy", "index_copy_", "masked_scatter", "masked_scatter_", "lerp",
                      "lerp_", "prelu", "_prelu_kernel", "index_reduce", "index_reduce_"))(_self_source)
rule("copy", ("_to_copy", "copy_", "to", "_copy_from", "_copy_from_and_resize", "lift_fresh", "lift_fresh_copy",
              "detach", "alias", "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
              "randint_like", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided", "clone",
              "set_", "_has_compatible_shallow_copy_type", "is_same_size", "_pin_memory", "tensor_split"),
     device="copy")(None)
rule("multi_tensor", device="free")(None)
rule("elementwise")(None)


# --- profile limits ------------------------------------------------------------------------------------------

_SUPPORT_CACHE: dict[tuple[int, torch.dtype, str], tuple[Any, bool]] = {}


def _supports(profile: DeviceProfile, dtype: torch.dtype, family: str) -> bool:
    key = (id(profile), dtype, family)
    hit = _SUPPORT_CACHE.get(key)
    if hit is None or hit[0] is not profile:
        hit = _SUPPORT_CACHE[key] = (profile, profile.supports(dtype, family))
    return hit[1]


def _profile_findings(c: _Call, r: Rule, profile: DeviceProfile) -> list[Finding]:
    out: list[Finding] = []
    seen: set[torch.dtype] = set()
    for k, t in c.tensors:
        dt = t.dtype
        if dt in seen or not (dt.is_floating_point or dt.is_complex):
            continue
        if tensor_device(t).type != profile.type or _supports(profile, dt, r.support):
            continue
        seen.add(dt)
        out.append(_unsupported(c, k, dt, r.support, profile))
    want_dt, want_dev = c.kwargs.get("dtype"), c.kwargs.get("device")
    if isinstance(want_dt, torch.dtype) and want_dt not in seen and want_dev is not None:
        if torch.device(want_dev).type == profile.type and not _supports(profile, want_dt, "storage"):
            out.append(_unsupported(c, ("dtype", -1), want_dt, "storage", profile))
    return out


def _unsupported(c: _Call, k: Key, dt: torch.dtype, family: str, profile: DeviceProfile) -> Finding:
    where = f"{profile.type} (capability {profile.capability[0]}.{profile.capability[1]})" if profile.type == "cuda" \
        else profile.type
    msg = f"{c.label(k)}: {where} cannot run {family} in {dtype_str(dt)}"
    return Finding(_problem(c, "unsupported_dtype", [k], dtype_str(dt), f"a dtype {profile.type} supports", msg),
                   "", None, (k,))


# --- entry points --------------------------------------------------------------------------------------------


_NAMES: dict[Any, tuple[str, ...]] = {}


def _arg_names(op: Any) -> tuple[str, ...]:
    names = _NAMES.get(op)
    if names is None:
        schema = getattr(op, "_schema", None)
        names = _NAMES[op] = tuple(a.name for a in schema.arguments) if schema is not None else ()
    return names


def _uniform(seq: Any, state: list[Any]) -> bool:
    """One level over ``seq``; ``state`` is [device, dtype] of the first tensor. False as soon as two differ."""
    for a in seq:
        if isinstance(a, _Tensor):
            if state[1] is None:
                state[0], state[1] = tensor_device(a), a.dtype
            elif a.dtype is not state[1] or tensor_device(a) != state[0]:
                return False
        elif type(a) is list or type(a) is tuple:
            if not _uniform(a, state):
                return False
    return True


def find(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
         profile: DeviceProfile | None = None, rules: Rules | None = None) -> list[Finding]:
    """Every finding of one op call, device/meta problems first (the machinery behind ``check``)."""
    kwargs = kwargs or {}
    table = rules or RULES
    r = table._by_op.get(op) or table.for_op(op)
    state: list[Any] = [None, None]  # fast path (FIELD-NOTES §7): done as soon as two tensors differ
    if _uniform(args, state) and (not kwargs or _uniform(kwargs.values(), state)) and not r.uniform_too:
        if state[0] is not None and state[0].type == "meta" and "device" in kwargs:
            pass  # a copy out of meta: let the copy rule look
        elif profile is None:
            return []
        elif state[1] is None:
            if "dtype" not in kwargs or "device" not in kwargs:
                return []
        elif state[0].type != profile.type or _supports(profile, state[1], r.support):
            return []
    c = _Call(op, args, kwargs, _gather(args, kwargs), _arg_names(op))
    out = _DEVICE_POLICIES[r.device](c)
    if r.dtype is not None:
        out.extend(r.dtype(c))
    if profile is not None:
        out.extend(_profile_findings(c, r, profile))
    return out


def check(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
          profile: DeviceProfile | None = None, rules: Rules | None = None) -> Problem | None:
    """The first problem of one op call, or None. ``op`` is an aten ``OpOverload``; ``args``/``kwargs`` as a
    ``TorchDispatchMode`` receives them. ``Problem.path`` names the argument (``arg 1 (mat2)``); callers that
    know parameter paths fill in ``module_path`` and replace it.

    >>> import torch
    >>> x = torch.ones(2, 2)
    >>> p = check(torch.ops.aten.mm.default, (x, x.to("meta")), {})
    >>> p.kind, p.path, p.found, p.expected
    ('meta', 'arg 1 (mat2)', 'meta', 'cpu')
    >>> check(torch.ops.aten.add.Tensor, (x, torch.tensor(2.0, dtype=torch.float64)), {}) is None
    True
    """
    found = find(op, args, kwargs, profile, rules)
    return found[0].problem if found else None


def check_all(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
              profile: DeviceProfile | None = None, rules: Rules | None = None) -> list[Problem]:
    """Every problem of one op call (``check`` returns the first)."""
    return [f.problem for f in find(op, args, kwargs, profile, rules)]


def _compact(t: torch.Tensor) -> str:
    try:
        return compact(t.dtype, tuple(int(s) for s in t.shape), tensor_device(t))
    except Exception:  # symbolic shapes, odd subclasses: never break a diagnostic (STYLE 9)
        return f"{dtype_str(t.dtype)}[?]@{device_str(tensor_device(t))}"


def describe_call(c: _Call) -> list[str]:
    return [f"{c.label(k)}: {_compact(t)}" for k, t in c.tensors]


def describe_args(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> list[str]:
    """``['arg 0 (self): f32[2,2]@cpu', 'arg 1 (mat2): bf16[2,2]@cpu']``, one line per tensor argument.

    >>> import torch
    >>> describe_args(torch.ops.aten.mm.default, (torch.ones(2, 3), torch.ones(3, 1, dtype=torch.bfloat16)))
    ['arg 0 (self): f32[2,3]@cpu', 'arg 1 (mat2): bf16[3,1]@cpu']
    """
    kwargs = kwargs or {}
    return describe_call(_Call(op, args, kwargs, _gather(args, kwargs), _arg_names(op)))


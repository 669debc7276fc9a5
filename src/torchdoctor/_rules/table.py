"""The strict rule table: the device policies and the dtype rule of each aten op family (data for ``_rules``).

Directional on purpose: a norm accepts a bf16 input with fp32 weight and bias but not the reverse
(measured on CPU kernels: ``layer_norm(x bf16, w fp32)`` runs, the reverse raises); mm/linear/conv need equal dtypes;
a CPU 0-dim scalar may join an elementwise device op (never index_select, gather, scatter or embedding);
``x_cuda[idx_cpu]`` is legal and ``x_cpu[idx_cuda]`` is not; copies cross devices but nothing is read out of meta; a
meta tensor meeting real data is always a problem. ``tests/test_rules.py`` checks every dtype rule against the real CPU
kernels.
"""

from __future__ import annotations

import torch

from torchdoctor._placement import device_str, dtype_str
from torchdoctor._rules.registry import DEVICE_POLICIES, Finding, Key, _Call, _norm, _problem, rule, tensor_device

_REDUCED = (torch.bfloat16, torch.float16)
_INDEX_ARGS = frozenset({"index", "indices", "mask", "offs", "offsets", "per_sample_weights", "target"})


# --- device policies -----------------------------------------------------------------------------------------


def _is_cpu_scalar(t: torch.Tensor, d: torch.device) -> bool:
    return d.type == "cpu" and t.dim() == 0


def _device_findings(c: _Call, items: list[tuple[Key, torch.Tensor]], scalars: bool = True) -> list[Finding]:
    devs = [(k, _norm(tensor_device(t)), t) for k, t in items]
    if scalars and any(d.type != "cpu" for _, d, _ in devs):  # CPU 0-dim scalars may join an elementwise op
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
    # the first operand (an in-place op's self), or the ``out=`` tensor the op writes: where the result must go
    first = next((x for x in devs if x[0][0] == "out"), devs[0])
    want = first[1]
    bad = [k for k, d, _ in devs if d != want]
    found = device_str(next(d for k, d, _ in devs if d != want))
    what = "the out= tensor" if first[0][0] == "out" else "the first operand"
    msg = f"{c.label(bad[0])} is on {found}, {what} {c.label(first[0])} on {device_str(want)}"
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


# F.ctc_loss reads its lengths on the CPU (``input_lengths.to(kCPU)``, an IntArrayRef underneath) and moves its
# targets to the log-probs' device itself: only the float operands must agree (CUDA accepts CPU int64 lengths)
_CTC_FREE = frozenset({"targets", "input_lengths", "target_lengths"})

def _foreach_device(c: _Call) -> list[Finding]:
    """A ``_foreach_*`` op runs per index (its slow path is ``self[i].lerp_(other[i], w)``): the tensors at one index
    of its lists, with its single tensors, must agree; an index of one list against another is never compared (a
    gradient list spread over two GPUs is fine)."""
    singles = [(k, t) for k, t in c.tensors if k[1] == -1]
    lists: dict[int, list[tuple[Key, torch.Tensor]]] = {}
    for k, t in c.tensors:
        if k[1] >= 0:
            lists.setdefault(k[1], []).append((k, t))
    if len({k[0] for k, _ in c.tensors}) < 2 or "_fused_" in str(c.op):
        return []
    for i in sorted(lists):
        out = _device_findings(c, [*lists[i], *singles])
        if out:
            return out
    return []


DEVICE_POLICIES.update({
    "same": lambda c: _device_findings(c, c.tensors),
    "ctc": lambda c: _device_findings(c, [(k, t) for k, t in c.tensors if c.name_of(k) not in _CTC_FREE]),
    # cat / stack copy every input into one output: no TensorIterator, so a CPU 0-dim tensor is no scalar there; nor
    # in the ops that select or write by an index (families index_read, index_write below)
    "all": lambda c: _device_findings(c, c.tensors, scalars=False),
    # index_fill_'s value tensor is read with ``.item()`` (any device); its index goes through a TensorIterator that
    # allows no CPU scalar (it is restrided to the filled tensor's rank first)
    "index_fill": lambda c: _device_findings(c, [(k, t) for k, t in c.tensors if c.name_of(k) != "value"],
                                             scalars=False),
    "index": _index_device,
    "copy": _copy_device,
    "free": lambda c: [],
    "foreach": _foreach_device,
})


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


@rule("embedding", ("embedding", "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only"), device="all",
      uniform_too=True)
def _embedding_dtypes(c: _Call) -> list[Finding]:
    """Any float weight; indices must be integers."""
    idx = [(k, t) for k, t in c.tensors if c.name_of(k) == "indices"]
    bad = [(k, t) for k, t in idx if t.is_floating_point() or t.is_complex()]
    if not bad:
        return []
    return [_dtype_finding(c, bad, torch.int64, "(embedding indices are int64 or int32)")]


@rule("loss_target", ("huber_loss", "huber_loss_backward", "binary_cross_entropy", "binary_cross_entropy_backward"))
def _loss_target(c: _Call) -> list[Finding]:
    """The input, its target (and bce's weight) in one dtype, the input's: binary_cross_entropy refuses a mixed call
    ("Found dtype BFloat16 but expected Float"), huber_loss computes it and then its backward refuses the same way
    (so a huber_loss no gradient flows through is no problem)."""
    considered = [(k, t) for k, t in c.tensors if c.name_of(k) in ("self", "target", "weight") and t.is_floating_point()]
    if len({t.dtype for _, t in considered}) <= 1 or c.name_of(considered[0][0]) != "self":
        return []
    if getattr(getattr(c.op, "_schema", None), "name", "") == "aten::huber_loss" and not (
            torch.is_grad_enabled() and any(t.requires_grad for _, t in considered)):
        return []
    f = _dtype_finding(c, considered, considered[0][1].dtype, f"like the loss's input {c.label(considered[0][0])} "
                       "(the loss refuses a mixed call: Found dtype ... but expected ...)")
    return [Finding(f.problem, f.attr, f.target, f.offenders, f.considered, fixed=True)]


def _self_source(c: _Call) -> list[Finding]:
    """In-place writes and interpolations: the source in the destination's dtype (no promotion)."""
    fl = _floats(c)
    if len({t.dtype for _, t in fl}) <= 1 or fl[0][0] != (0, -1):
        return []
    return [_dtype_finding(c, fl, fl[0][1].dtype, f"like the destination {c.label(fl[0][0])} (no type promotion)")]


@rule("amp_unscale", ("_amp_foreach_non_finite_check_and_unscale_",), device="free")
def _amp_unscale(c: _Call) -> list[Finding]:
    """CUDA's unscale kernel (GradScaler.unscale_) has float16 and float32 only: bfloat16 gradients raise there
    (the CPU kernel takes them)."""
    bad = [k for k, t in c.tensors if c.name_of(k) == "self" and t.dtype == torch.bfloat16
           and tensor_device(t).type == "cuda"]
    if not bad:
        return []
    msg = (f"{c.label(bad[0])} is a bfloat16 gradient: GradScaler.unscale_ has no CUDA kernel for bfloat16 "
           "(\"_amp_foreach_non_finite_check_and_unscale_cuda\" not implemented for 'BFloat16'), so the parameters "
           "it steps are bfloat16; bfloat16 needs no GradScaler: drop the scaler (step the optimizer directly), or "
           "keep float32 weights and train under autocast with it")
    return [Finding(_problem(c, "dtype", bad, "bfloat16", "float32", msg), "", None, tuple(bad))]


rule("scaled_mm", ("_scaled_mm", "_scaled_mm_v2", "_scaled_grouped_mm"), support="scaled_mm")(None)  # e4m3 x e5m2 is legal
rule("index", ("index", "_unsafe_index"), device="index")(None)
rule("ctc", ("ctc_loss", "_ctc_loss", "_ctc_loss_backward"), device="ctc")(None)
rule("index_put", ("index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"), device="index")(_self_source)
rule("write_source", ("masked_scatter", "masked_scatter_", "lerp", "lerp_", "prelu", "_prelu_kernel"))(_self_source)
# The ops that select or write by an index take no CPU 0-dim tensor beside a device one (a scheduler's
# ``torch.tensor(5)`` timestep fed to ``nn.Embedding`` on cuda raises). Their CUDA and XPU kernels keep
# native_functions.yaml's default ``device_check: ExactSame``, for which torchgen (``gen_device_check``) makes the
# wrapper call ``check_and_update_common_device`` on every positional tensor, and that check (ATen's
# ``op_registration/adaption.h``) compares devices with no exemption: "Expected all tensors to be on the same device
# ... (when checking argument for argument index in method wrapper_CUDA__index_select)". ``embedding`` is composite,
# ``weight.index_select(0, indices.reshape(-1))``. The CPU-scalar exemption is TensorIterator's (``device_check:
# NoCheck`` ops: elementwise, comparisons); ``index.Tensor`` and ``index_put`` are NoCheck and move CPU indices
# themselves (policy "index").
rule("index_write", ("index_add", "index_add_", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
                     "scatter_reduce_", "index_copy", "index_copy_", "index_reduce", "index_reduce_"),
     device="all")(_self_source)
rule("index_read", ("index_select", "gather", "take", "put", "put_"), device="all")(None)
rule("index_fill", ("index_fill", "index_fill_"), device="index_fill")(None)
rule("copy", ("_to_copy", "copy_", "to", "_copy_from", "_copy_from_and_resize", "lift_fresh", "lift_fresh_copy",
              "detach", "alias", "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
              "randint_like", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided", "clone",
              "set_", "_has_compatible_shallow_copy_type", "is_same_size", "_pin_memory", "tensor_split"),
     device="copy")(None)
rule("concat", ("cat", "stack", "concat", "concatenate", "hstack", "vstack", "dstack", "column_stack"),
     device="all")(None)
rule("multi_tensor", device="foreach")(None)
# copies cross devices (``_foreach_copy_`` of an EMA's cpu shadow into cuda parameters); fused optimizer steps are
# judged by the run's gradient checks before them
rule("multi_tensor_free", ("_foreach_copy_", "_foreach_copy"), device="free")(None)
rule("elementwise")(None)

"""The strict rules: directional dtype rules checked against the real CPU kernels, device rules on virtual and
fake devices, meta mixing, profile limits, and the registry (duplicates refused, overrides on a copy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import torchdoctor
from torchdoctor._rules import registry as _rules
from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._rules.registry import RULES, Rule, check, check_all, describe_args, find, tensor_device

aten = torch.ops.aten
bf, f32, f16, f64 = torch.bfloat16, torch.float32, torch.float16, torch.float64


def on(device: str, t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor standing for one on ``device`` (the simulator's ``_td_device`` contract)."""
    t._td_device = torch.device(device)  # type: ignore[attr-defined]
    return t


class Recorder(TorchDispatchMode):
    """Runs every op for real and records what the rules say about it first."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.problems.extend(check_all(func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


x2 = torch.randn(2, 8)
xg = torch.randn(2, 4, 3)
q = torch.randn(1, 2, 4, 8)

# (case, code) -> the rules must flag a dtype problem exactly when the real CPU kernel raises. A few composite
# functions (conv bias, sdpa) check before any aten op is dispatched: EARLY gives the aten call the rules see
# from simulate, and guard checks these functions one level up (test_guard).
DTYPE_CASES: list[tuple[str, Callable[[], Any]]] = [
    ("layer_norm x bf16, w/b fp32", lambda: F.layer_norm(x2.to(bf), (8,), torch.ones(8), torch.zeros(8))),
    ("layer_norm x fp16, w fp32", lambda: F.layer_norm(x2.half(), (8,), torch.ones(8))),
    ("layer_norm x fp32, w/b bf16", lambda: F.layer_norm(x2, (8,), torch.ones(8, dtype=bf), torch.zeros(8, dtype=bf))),
    ("layer_norm x bf16, w bf16, b fp32", lambda: F.layer_norm(x2.to(bf), (8,), torch.ones(8, dtype=bf), torch.zeros(8))),
    ("layer_norm x bf16, w fp32, b bf16", lambda: F.layer_norm(x2.to(bf), (8,), torch.ones(8), torch.zeros(8, dtype=bf))),
    ("layer_norm x fp16, w bf16", lambda: F.layer_norm(x2.half(), (8,), torch.ones(8, dtype=bf))),
    ("layer_norm x fp64, w fp32", lambda: F.layer_norm(x2.double(), (8,), torch.ones(8))),
    ("group_norm x bf16, w/b fp32", lambda: F.group_norm(xg.to(bf), 2, torch.ones(4), torch.zeros(4))),
    ("group_norm x fp32, w/b bf16", lambda: F.group_norm(xg, 2, torch.ones(4, dtype=bf), torch.zeros(4, dtype=bf))),
    ("group_norm x bf16, w bf16, b fp32", lambda: F.group_norm(xg.to(bf), 2, torch.ones(4, dtype=bf), torch.zeros(4))),
    ("batch_norm x bf16, params fp32", lambda: F.batch_norm(xg.to(bf), torch.zeros(4), torch.ones(4), torch.ones(4),
                                                            torch.zeros(4))),
    ("batch_norm x fp32, params bf16", lambda: F.batch_norm(xg, torch.zeros(4, dtype=bf), torch.ones(4, dtype=bf),
                                                            torch.ones(4, dtype=bf), torch.zeros(4, dtype=bf))),
    ("rms_norm x bf16, w fp32", lambda: F.rms_norm(x2.to(bf), (8,), torch.ones(8))),
    ("rms_norm x fp32, w bf16", lambda: F.rms_norm(x2, (8,), torch.ones(8, dtype=bf))),
    ("linear x bf16, W fp32", lambda: F.linear(x2.to(bf), torch.randn(3, 8))),
    ("linear x bf16, W bf16, b fp32", lambda: F.linear(x2.to(bf), torch.randn(3, 8, dtype=bf), torch.zeros(3))),
    ("linear 3d x bf16, b fp32", lambda: F.linear(x2.to(bf)[None], torch.randn(3, 8, dtype=bf), torch.zeros(3))),
    ("matmul fp16 @ bf16", lambda: x2.half() @ x2.to(bf).T),
    ("bmm", lambda: torch.bmm(x2[None], x2.to(bf)[None].mT)),
    ("einsum", lambda: torch.einsum("ij,kj->ik", x2, x2.to(bf))),
    ("mv", lambda: torch.mv(x2, torch.ones(8, dtype=bf))),
    ("dot", lambda: torch.dot(x2[0], x2[0].to(bf))),
    ("addmv", lambda: torch.addmv(torch.zeros(2), x2, torch.ones(8, dtype=bf))),
    ("conv2d x bf16, bias fp32", lambda: F.conv2d(xg.to(bf)[None], torch.randn(2, 2, 1, 1, dtype=bf), torch.zeros(2))),
    ("conv2d x bf16, weight fp32", lambda: F.conv2d(xg.to(bf)[None], torch.randn(2, 2, 1, 1))),
    ("conv2d all bf16", lambda: F.conv2d(xg.to(bf)[None], torch.randn(2, 2, 1, 1, dtype=bf), torch.zeros(2, dtype=bf))),
    ("sdpa q bf16, k/v fp32", lambda: F.scaled_dot_product_attention(q.to(bf), q, q)),
    ("sdpa bf16, mask fp32", lambda: F.scaled_dot_product_attention(q.to(bf), q.to(bf), q.to(bf),
                                                                    attn_mask=torch.zeros(4, 4))),
    ("sdpa bf16, mask bool", lambda: F.scaled_dot_product_attention(q.to(bf), q.to(bf), q.to(bf),
                                                                    attn_mask=torch.ones(4, 4, dtype=torch.bool))),
    ("sdpa fp32, mask bf16", lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(4, 4, dtype=bf))),
    ("embedding float indices", lambda: F.embedding(torch.ones(3), torch.randn(4, 3))),
    ("embedding int32 indices, bf16 weight", lambda: F.embedding(torch.ones(3, dtype=torch.int32),
                                                                 torch.randn(4, 3, dtype=bf))),
    ("index_add_", lambda: torch.zeros(3, 8).index_add_(0, torch.tensor([0, 1]), x2.to(bf))),
    ("scatter_ src", lambda: torch.zeros(3, 8).scatter_(0, torch.zeros(2, 8, dtype=torch.long), x2.to(bf))),
    ("index_put_ values", lambda: torch.zeros(3, 8).index_put_((torch.tensor([0, 1]),), x2.to(bf))),
    ("lerp", lambda: torch.lerp(x2, x2.to(bf), 0.5)),
    ("lerp fp64 0-dim weight", lambda: torch.lerp(x2, x2, torch.tensor(0.5, dtype=f64))),
    ("masked_scatter", lambda: x2.masked_scatter(x2 > 0, x2.to(bf))),
    ("index_copy", lambda: torch.zeros(3, 8).index_copy(0, torch.tensor([0, 1]), x2.to(bf))),
    ("cat promotes", lambda: torch.cat([x2, x2.to(bf)])),
    ("where promotes", lambda: torch.where(x2 > 0, x2, x2.to(bf))),
    ("add promotes", lambda: x2.to(bf) + x2),
    ("mul by fp32 0-dim", lambda: x2.to(bf) * torch.tensor(2.0)),
    ("addcmul promotes", lambda: torch.addcmul(x2, x2.to(bf), x2)),
    ("gather", lambda: torch.gather(x2, 1, torch.zeros(2, 1, dtype=torch.long))),
    # a loss's target in another dtype: bce refuses it at once, huber_loss in its backward, mse_loss never
    ("huber_loss fp32 input with grad, bf16 target", lambda: F.huber_loss(x2.clone().requires_grad_(), x2.to(bf)).backward()),
    ("huber_loss bf16 input with grad, fp32 target", lambda: F.huber_loss(x2.to(bf).requires_grad_(), x2).backward()),
    ("huber_loss without grad, bf16 target", lambda: F.huber_loss(x2, x2.to(bf))),
    ("binary_cross_entropy fp32 input, bf16 target", lambda: F.binary_cross_entropy(x2.sigmoid(), x2.sigmoid().to(bf))),
    ("mse_loss fp32 input with grad, bf16 target", lambda: F.mse_loss(x2.clone().requires_grad_(), x2.to(bf)).backward()),
]


_conv = (aten.convolution.default, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
EARLY: dict[str, Callable[[], Any]] = {
    "conv2d x bf16, bias fp32": lambda: (_conv[0], (xg.to(bf)[None], torch.randn(2, 2, 1, 1, dtype=bf),
                                                    torch.zeros(2), *_conv[1:]), {}),
    "sdpa q bf16, k/v fp32": lambda: (aten.scaled_dot_product_attention.default, (q.to(bf), q, q), {}),
    "sdpa fp32, mask bf16": lambda: (aten.scaled_dot_product_attention.default, (q, q, q),
                                     {"attn_mask": torch.zeros(4, 4, dtype=bf)}),
}


@pytest.mark.parametrize("case, code", DTYPE_CASES, ids=[c for c, _ in DTYPE_CASES])
def test_dtype_rules_agree_with_real_cpu_kernels(case: str, code: Callable[[], Any]) -> None:
    rec = Recorder()
    try:
        with rec:
            code()
        raised = None
    except RuntimeError as exc:
        raised = str(exc)
    flagged = [p for p in rec.problems if p.kind == "dtype"]
    if case in EARLY:
        assert raised is not None and not flagged  # the composite checked first
        op, args, kwargs = EARLY[case]()
        flagged = [p for p in check_all(op, args, kwargs) if p.kind == "dtype"]
    assert bool(flagged) == (raised is not None), (case, raised, flagged)


def test_norms_are_directional() -> None:
    ln = aten.native_layer_norm.default
    w32, wbf = torch.ones(8), torch.ones(8, dtype=bf)
    assert check(ln, (x2.to(bf), [8], w32, w32, 1e-5)) is None
    p = check(ln, (x2, [8], wbf, wbf, 1e-5))
    assert p is not None and (p.kind, p.path, p.found, p.expected) == ("dtype", "arg 2 (weight)", "bfloat16", "float32")
    mixed = check(ln, (x2.to(bf), [8], wbf, w32, 1e-5))
    assert mixed is not None and mixed.path == "arg 3 (bias)" and "normalization parameters" in mixed.message


def test_equal_dtype_message_and_fields() -> None:
    p = check(aten.addmm.default, (torch.zeros(3), x2.to(bf), torch.randn(8, 3, dtype=bf)))
    assert p is not None
    assert (p.kind, p.path, p.found, p.expected, p.op) == ("dtype", "arg 0 (self)", "float32", "bfloat16",
                                                            "aten.addmm.default")
    assert p.message == "aten.addmm.default: arg 0 (self) is float32, expected bfloat16 like arg 1 (mat1)"
    assert p.tensors == ("arg 0 (self): f32[3]@cpu", "arg 1 (mat1): bf16[2,8]@cpu", "arg 2 (mat2): bf16[8,3]@cpu")


# --- devices --------------------------------------------------------------------------------------------------


def test_device_mismatch_on_virtual_devices() -> None:
    a, b = on("cuda:0", torch.ones(2, 2)), torch.ones(2, 2)
    p = check(aten.mm.default, (a, b))
    assert p is not None
    assert (p.kind, p.path, p.found, p.expected) == ("device", "arg 1 (mat2)", "cpu", "cuda:0")
    assert p.message == "aten.mm.default: arg 1 (mat2) is on cpu, the first operand arg 0 (self) on cuda:0"
    assert p.tensors == ("arg 0 (self): f32[2,2]@cuda:0", "arg 1 (mat2): f32[2,2]@cpu")
    assert check(aten.mm.default, (a, on("cuda", torch.ones(2, 2)))) is None  # cuda is cuda:0
    assert check(aten.mm.default, (a, on("cuda:1", torch.ones(2, 2)))).found == "cuda:1"  # type: ignore[union-attr]


def test_cpu_scalars_join_device_ops_but_not_the_reverse() -> None:
    a = on("cuda:0", torch.ones(3))
    assert check(aten.add.Tensor, (a, torch.tensor(2.0))) is None
    assert check(aten.mul.Tensor, (torch.tensor(2.0), a)) is None
    p = check(aten.add.Tensor, (torch.ones(3), on("cuda:0", torch.tensor(2.0))))
    assert p is not None and p.kind == "device"


def test_indexing_accepts_cpu_indices_only_one_way() -> None:
    x = on("cuda:0", torch.arange(6.0))
    idx = torch.tensor([0, 2])
    assert check(aten.index.Tensor, (x, [idx])) is None
    p = check(aten.index.Tensor, (torch.arange(6.0), [on("cuda:0", torch.tensor([0, 2]))]))
    assert p is not None and (p.kind, p.path, p.found, p.expected) == ("device", "arg 1 (indices[0])", "cuda:0", "cpu")
    assert "indices must be on cpu or on the indexed tensor's device" in p.message
    assert check(aten.index_put_.default, (x, [idx], on("cuda:0", torch.ones(2)))) is None
    assert check(aten.index_put_.default, (x, [idx], torch.tensor(1.0))) is None  # a CPU scalar value
    p = check(aten.index_put_.default, (x, [idx], torch.ones(2)))
    assert p is not None and p.path == "arg 2 (values)"
    p = check(aten.index_select.default, (x, 0, idx))  # index_select needs the same device
    assert p is not None and p.path == "arg 2 (index)"


def test_copies_cross_devices_but_not_out_of_meta() -> None:
    a = on("cuda:0", torch.ones(2))
    assert check(aten.copy_.default, (a, torch.ones(2))) is None
    assert check(aten._to_copy.default, (a,), {"device": torch.device("cpu")}) is None
    meta = torch.ones(2, device="meta")
    p = check(aten.copy_.default, (torch.ones(2), meta))
    assert p is not None and (p.kind, p.path) == ("meta", "arg 1 (src)")
    p = check(aten._to_copy.default, (meta,), {"device": torch.device("cpu")})
    assert p is not None and p.kind == "meta"
    assert check(aten.copy_.default, (meta, torch.ones(2))) is None
    assert check(aten.empty_like.default, (meta,), {"device": torch.device("cpu")}) is None


def test_meta_mixed_with_real_data_is_always_a_problem() -> None:
    w = torch.ones(3, 4, device="meta")
    p = check(aten.mm.default, (torch.ones(2, 4), w.t()))
    assert p is not None and (p.kind, p.found, p.expected) == ("meta", "meta", "cpu")
    assert "silently computes garbage" in p.message
    p = check(aten.embedding.default, (w, torch.tensor([0, 1])))
    assert p is not None and p.kind == "meta" and p.path == "arg 0 (weight)"
    assert check(aten.add.Tensor, (torch.ones(3, device="meta"), torch.tensor(2.0))) is None
    assert check(aten.mm.default, (w.t(), w)) is None  # all meta: a model built on meta


def test_fake_tensors_are_judged_by_their_fake_device() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        a = torch.empty(2, 2, device="cuda:1")
        b = torch.empty(2, 2)
    assert tensor_device(a) == torch.device("cuda:1")
    p = check(aten.mm.default, (a, b))
    assert p is not None and (p.found, p.expected) == ("cpu", "cuda:1")
    del mode


def test_multi_tensor_ops_may_span_devices() -> None:
    assert check(aten._foreach_add.List, ([on("cuda:0", torch.ones(2)), torch.ones(2)],
                                          [on("cuda:0", torch.ones(2)), torch.ones(2)])) is None


def test_check_all_reports_device_then_dtype() -> None:
    problems = check_all(aten.mm.default, (on("cuda:0", torch.ones(2, 2)), torch.ones(2, 2, dtype=bf)))
    assert [p.kind for p in problems] == ["device", "dtype"]


# --- profiles -------------------------------------------------------------------------------------------------


def test_profile_dtype_limits() -> None:
    mps = DeviceProfile.for_device("mps")
    p = check(aten.add.Tensor, (on("mps:0", torch.ones(2, dtype=f64)), on("mps:0", torch.ones(2, dtype=f64))),
              profile=mps)
    assert p is not None and (p.kind, p.found) == ("unsupported_dtype", "float64")
    assert check(aten.add.Tensor, (torch.ones(2, dtype=f64), torch.ones(2, dtype=f64)), profile=mps) is None  # on cpu
    p = check(aten.zeros.default, ([2],), {"dtype": f64, "device": torch.device("mps")}, profile=mps)
    assert p is not None and p.kind == "unsupported_dtype"
    t4 = DeviceProfile(type="cuda", capability=(7, 5))
    a = on("cuda:0", torch.ones(2, 2, dtype=bf))
    # a T4 runs bf16 matmuls by emulation (cuBLAS in float32), slowly: a speed note once, never a problem
    with pytest.warns(torchdoctor.PlacementWarning, match=r"capability 7.5\) has no bfloat16 tensor cores"):
        assert check(aten.mm.default, (a, a), profile=t4) is None
    w = on("cuda:0", torch.ones(2, 2, 3, 3, dtype=bf))
    p = check(aten.convolution.default, (w, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), profile=t4)
    assert p is not None and p.kind == "unsupported_dtype" and "capability 7.5" in p.message  # no bf16 conv
    assert check(aten.add.Tensor, (a, a), profile=t4) is None  # elementwise bf16 runs on a T4
    assert check(aten.mm.default, (a, a), profile=DeviceProfile.for_device("cuda")) is None
    f8 = on("cuda:0", torch.ones(2, 2).to(torch.float8_e4m3fn))
    assert check(aten._scaled_mm.default, (f8, f8, torch.ones(()), torch.ones(())),
                 profile=DeviceProfile(type="cuda", capability=(8, 6))) is not None


# --- registry -------------------------------------------------------------------------------------------------


def test_registry_refuses_duplicates() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        RULES.add(Rule("matmul", (), "same", None))
    with pytest.raises(ValueError, match="already belongs to rule family 'matmul'"):
        RULES.add(Rule("my_mm", ("aten::mm",), "same", None))
    assert "my_mm" not in RULES.families


def test_overrides_merge_into_a_copy() -> None:
    a, b = on("cuda:0", torch.ones(2)), torch.ones(2)
    relaxed = RULES.merged({"add": "multi_tensor"})
    assert check(aten.add.Tensor, (a, b), rules=relaxed) is None
    assert check(aten.add.Tensor, (a, b)) is not None  # the global table is untouched
    assert RULES.by_name.get("aten::add") is None
    with pytest.raises(ValueError, match="unknown rule family"):
        RULES.merged({"add": "nope"})


def test_describe_args_and_fast_path() -> None:
    assert describe_args(aten.mm.default, (torch.ones(2, 3), torch.ones(3, 1, dtype=bf))) == [
        "arg 0 (self): f32[2,3]@cpu", "arg 1 (mat2): bf16[3,1]@cpu"]
    assert describe_args(aten.cat.default, ([torch.ones(1), torch.ones(1)],)) == [
        "arg 0 (tensors[0]): f32[1]@cpu", "arg 0 (tensors[1]): f32[1]@cpu"]
    assert find(aten.mm.default, (torch.ones(2, 2), torch.ones(2, 2)), None) == []
    assert _rules.label(aten.scaled_dot_product_attention.default, ("attn_mask", -1)) == "kwarg attn_mask"


def test_fast_path_skips_mixed_dtypes_only_where_no_dtype_rule_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []
    real = _rules._Call
    monkeypatch.setattr(_rules, "_Call", lambda *a: built.append(a[0]) or real(*a))
    mask, x = torch.ones(2, dtype=torch.bool), torch.ones(2)
    assert find(aten.where.self, (mask, x, x.to(bf))) == []  # one device, no dtype rule: no slow path
    assert find(aten.masked_fill.Scalar, (x, mask, 0.0)) == [] and built == []
    assert [f.problem.kind for f in find(aten.mm.default, (torch.ones(2, 2), torch.ones(2, 2, dtype=bf)))] == ["dtype"]
    assert [f.problem.kind for f in find(aten.where.self, (mask, on("cuda:0", x), x))] == ["device"]
    mps = DeviceProfile.for_device("mps")
    mx = on("mps:0", torch.ones(2, dtype=f64))
    assert [f.problem.kind for f in find(aten.where.self, (on("mps:0", mask), mx, on("mps:0", x)), profile=mps)] == [
        "unsupported_dtype"]  # the profile sees every dtype, not only the first
    assert [str(op) for op in built] == ["aten.mm.default", "aten.where.self", "aten.where.self"]

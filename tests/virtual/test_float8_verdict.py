"""The verdict on a float8 op follows the virtual device's kernels, never this CPU build's (hunt X4, X14).

CUDA and XPU hold float8 and move, gather and select it, but compute with it only through ``_scaled_mm``: ``x * mask``
in float8 raises ``"mul_cuda" not implemented for 'Float8_e4m3fn'`` there, though this CPU build multiplies float8
and refuses to add it. Each case runs twice, on small tensors (a virtual run keeps their values and runs the CPU's
kernel) and on large ones (meta kernels, which take every dtype), so the answer cannot come from the CPU: the
problem is found in both, and the run goes on with the op computed as the fix would (upcast).
"""

from __future__ import annotations

import pytest
import torch

import torchdoctor

F8 = torch.float8_e4m3fn
SIZES = {"small": (4, 4), "large": (512, 256)}  # kept values (CPU kernels) / meta (no values)


def _f8(shape: tuple[int, ...], device: str) -> torch.Tensor:
    return torch.randn(*shape, device=device).to(F8)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(("device", "verb", "said"), [
    ("cuda:0", "mul", '"mul_cuda" not implemented for \'Float8_e4m3fn\''),
    ("cuda:0", "add", '"ufunc_add_CUDA" not implemented for \'Float8_e4m3fn\''),
    ("cuda:0", "div", '"div_true_cuda" not implemented for \'Float8_e4m3fn\''),
    ("xpu:0", "add", '"add_xpu" not implemented for \'Float8_e4m3fn\''),
    ("xpu:0", "sub", '"add_xpu" not implemented for \'Float8_e4m3fn\''),
    ("xpu:0", "mul", '"mul_xpu" not implemented for \'Float8_e4m3fn\''),
])
def test_float8_arithmetic_is_found_and_the_run_goes_on(device: str, verb: str, said: str, size: str) -> None:
    with torchdoctor.virtual_devices(device, raise_on_exit=False) as sim:
        a, b = _f8(SIZES[size], device), _f8(SIZES[size], device)
        c = getattr(torch, verb)(a, b)
        after = c.to(torch.bfloat16).sum()  # the program goes on past the op the device refuses
    assert after.dtype == torch.bfloat16 and c.dtype == F8 and c.shape == a.shape
    found = [p for p in sim.problems if p.kind == "unsupported_dtype"]
    assert len(found) == 1, sim.problems
    assert said in found[0].message and f"aten.{verb}" in (found[0].op or "")
    assert "compute dtype (bfloat16 or float32)" in found[0].message
    assert not [p for p in sim.problems if p.kind in ("unsupported", "unsupported_op")]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("device", ["cuda:0", "xpu:0"])
def test_float8_data_ops_the_gpus_have_are_quiet(device: str, size: str) -> None:
    shape = SIZES[size]
    with torchdoctor.virtual_devices(device, raise_on_exit=False) as sim:
        a, b = _f8(shape, device), _f8(shape, device)
        idx = torch.zeros(shape, dtype=torch.long, device=device)
        outs = [torch.cat([a, b]), torch.stack([a, b]), torch.where(a.float() > 0, a, b), a == b, a != b,
                a.flip(0), a[torch.tensor([0, 1], device=device)], a.gather(0, idx), a.clone().zero_(),
                torch.zeros_like(a), a.t().contiguous(), a.view(-1),
                torch.nn.functional.embedding(torch.tensor([0, 1], device=device), a)]
        host = outs[7].float().cpu() if size == "small" else None  # the CPU has no float8 gather: the device's answer
    assert sim.ok and not sim.problems, sim.problems
    assert all(o.device == torch.device(device) for o in outs)
    if host is not None:
        assert torch.equal(host, a.float().cpu()[0].expand(shape))


def test_float8_in_place_add_on_cuda_writes_the_programs_tensor() -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        a = torch.full((4, 4), 1.0, device="cuda:0").to(F8)
        a.add_(a.clone())  # in place: the program's own tensor holds the sum, as the fixed program's would
        total = a.float().sum().item()
    assert [(p.kind, p.op) for p in sim.problems] == [("unsupported_dtype", "aten.add_.Tensor")], sim.problems
    assert total == 32.0


@pytest.mark.parametrize("size", SIZES)
def test_float8_matmul_on_cuda_needs_scaled_mm(size: str) -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        a = _f8(SIZES[size], "cuda:0")
        a @ a.t()
    assert [p.kind for p in sim.problems] == ["unsupported_dtype"], sim.problems
    assert "\"addmm_cuda\" not implemented for 'Float8_e4m3fn'" in sim.problems[0].message
    assert "torch._scaled_mm" in sim.problems[0].message


def test_float8_on_mps_cannot_even_be_held() -> None:
    with torchdoctor.virtual_devices("mps", raise_on_exit=False) as sim:
        x = torch.randn(4, 4).to(F8)
        x.to("mps")
    assert [p.kind for p in sim.problems] == ["unsupported_dtype"]
    assert "does not have support for that dtype" in sim.problems[0].message


def test_simulate_of_a_model_that_computes_in_its_float8_storage_dtype() -> None:
    class Backbone(torch.nn.Module):  # ComfyUI #14285: the storage dtype taken as the compute dtype
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)
            self.dtype = F8

        def forward(self, img: torch.Tensor) -> torch.Tensor:
            x = torch.zeros(img.shape[0], 4, 8, dtype=self.dtype, device=img.device)
            x[:, :2] = img[:, :2].to(self.dtype)
            mask = torch.ones(1, 4, 1, device=img.device, dtype=self.dtype)
            return self.proj((x * mask).float())

    for profile in (None, "h100", "rtx4090"):
        report = torchdoctor.simulate(Backbone(), (torch.randn(2, 4, 8),), "cuda", profile=profile)
        assert [p.kind for p in report.problems] == ["unsupported_dtype"], (profile, report.problems)
        assert "mul_cuda" in report.problems[0].message


@pytest.mark.parametrize("size", SIZES)
def test_float8_times_a_python_number_is_found_too(size: str) -> None:
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        a = _f8(SIZES[size], "cuda:0")
        b = a * 2  # this CPU build refuses it ("mul_cpu_reduced_float"), meta takes it: CUDA has no kernel either way
        noise = torch.randn_like(b, dtype=F8)  # no CPU kernel draws float8: drawn in float32 and stored, the run goes on
    assert [(p.kind, p.op) for p in sim.problems] == [("unsupported_dtype", "aten.mul.Tensor")], sim.problems
    assert b.dtype == noise.dtype == F8 and noise.shape == a.shape

"""Device choice from injected facts and on this machine; dtype capabilities checked against ops run here."""

from __future__ import annotations

import dataclasses
import json
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import torchdoctor
from torchdoctor._env.devices import (
    DeviceChoice,
    DeviceUnavailableError,
    capabilities,
    choose_device,
    decide,
    pick_device,
    recommend_dtype,
    unavailable_reason,
)
from torchdoctor._env.report import collect_facts

CPU_FACTS = {"torch": {"version": "2.13.0+cpu", "build": "cpu"}, "platform": {"system": "Linux", "machine": "x86_64"}}
NV = {"vendor": "nvidia", "name": "NVIDIA GeForce RTX 4090", "capability": "8.9"}
CUDA_BUILD = {"version": "2.8.0+cu128", "build": "cuda", "cuda": "12.8"}


def facts(**over: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"torch": dict(CPU_FACTS["torch"]), "platform": dict(CPU_FACTS["platform"])}
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


BOTH = facts(torch=CUDA_BUILD, cuda_available=True, cuda_device_count=2, xpu_available=True, xpu_device_count=1,
             devices=[NV, dict(NV, index=1)], drivers={"nvidia": "570.133.20", "intel": "xe"})


# --- choice from facts -----------------------------------------------------------------------------------


def test_cuda_beats_xpu_and_the_reason_says_how_to_force_xpu() -> None:
    choice = choose_device(facts=BOTH)
    assert choice.device == torch.device("cuda:0")
    assert choice.source == "priority"
    assert "CUDA is available (NVIDIA GeForce RTX 4090, 2 devices)" in choice.reason
    assert "priority CUDA > XPU > MPS > CPU" in choice.reason
    assert "TORCHDOCTOR_DEVICE=xpu" in choice.reason and "pick_device('xpu')" in choice.reason
    assert [(c.device, c.available) for c in choice.candidates] == [("cuda:0", True), ("xpu:0", True), ("mps:0", False), ("cpu", True)]


def test_explicit_argument_then_environment_then_priority() -> None:
    assert pick_device("xpu", facts=BOTH) == torch.device("xpu:0")
    env = dict(BOTH, env={"TORCHDOCTOR_DEVICE": "xpu"})
    choice = choose_device(facts=env)
    assert (choice.device, choice.source) == (torch.device("xpu:0"), "environment")
    assert "TORCHDOCTOR_DEVICE=xpu" in choice.reason
    assert choose_device("cuda:1", facts=env).device == torch.device("cuda:1")  # the argument wins over the variable
    assert choose_device("cpu", facts=env).source == "argument"
    assert pick_device(facts=dict(BOTH, env={"TORCHDOCTOR_DEVICE": "auto"})) == torch.device("cuda:0")


@pytest.mark.parametrize("over, expected", [
    (dict(xpu_available=True, xpu_device_count=1, torch={"version": "2.8.0+xpu", "build": "xpu"}), "xpu:0"),
    (dict(mps_available=True, platform={"system": "Darwin", "machine": "arm64"}, torch={"version": "2.8.0", "build": "mps", "mps_built": True}), "mps:0"),
    (dict(cuda_available=True, cuda_device_count=1, mps_available=True), "cuda:0"),
    ({}, "cpu"),
])
def test_priority_order(over: dict[str, Any], expected: str) -> None:
    assert pick_device(facts=facts(**over)) == torch.device(expected)


def test_explicit_unavailable_choice_raises_with_the_reason() -> None:
    with pytest.raises(DeviceUnavailableError, match=r"CPU-only build of torch 2\.13\.0\+cpu") as info:
        pick_device("cuda", facts=CPU_FACTS)
    assert isinstance(info.value, RuntimeError)
    assert "pick_device('cuda')" in str(info.value) and "Fix: torchdoctor.pick_device()" in str(info.value)
    with pytest.raises(DeviceUnavailableError, match=r"TORCHDOCTOR_DEVICE=xpu.*CPU-only build"):
        pick_device(facts=facts(env={"TORCHDOCTOR_DEVICE": "xpu"}))
    with pytest.raises(DeviceUnavailableError, match=r"cuda:3 does not exist: 2 CUDA devices visible \(cuda:0\.\.cuda:1\)"):
        pick_device("cuda:3", facts=BOTH)
    with pytest.raises(DeviceUnavailableError, match="not a device torchdoctor can choose"):
        pick_device("gpu", facts=BOTH)


@pytest.mark.parametrize("over, fragment", [
    (dict(torch=CUDA_BUILD), "no NVIDIA driver or GPU found"),
    (dict(torch=CUDA_BUILD, drivers={"nvidia": "570.1"}, devices=[NV], env={"CUDA_VISIBLE_DEVICES": ""}), "CUDA_VISIBLE_DEVICES='' hides every GPU"),
    (dict(torch=CUDA_BUILD, drivers={"nvidia": "570.1"}, devices=[NV], availability_source="probe",
          probed={"cuda": {"available": False, "error": "RuntimeError: The NVIDIA driver on your system is too old"}}), "driver on your system is too old"),
    (dict(torch={"version": "2.8.0+xpu", "build": "xpu"}), "no Intel GPU driver"),
    (dict(torch={"version": "2.8.0+xpu", "build": "xpu"}, drivers={"intel": "xe"}, env={"ONEAPI_DEVICE_SELECTOR": "opencl:*"}), "leaves no Level Zero GPU"),
    (dict(torch={"importable": False, "error": "OSError: libtorch_cuda.so"}), "torch does not import"),
])
def test_unavailable_reasons(over: dict[str, Any], fragment: str) -> None:
    kind = "xpu" if "xpu" in str(over.get("torch", {}).get("build")) else "cuda"
    assert fragment in (unavailable_reason(facts(**over), kind) or "")


def test_mps_reasons() -> None:
    assert unavailable_reason(CPU_FACTS, "mps") == "MPS needs macOS on Apple silicon (this is Linux)"
    mac = facts(platform={"system": "Darwin", "machine": "x86_64", "rosetta": True})
    assert unavailable_reason(mac, "mps") == "Python runs under Rosetta (x86_64)"


def test_torch_that_does_not_import_gives_no_device() -> None:
    broken = facts(torch={"importable": False, "error": "OSError: boom"})
    assert decide(broken)["device"] is None
    with pytest.raises(DeviceUnavailableError, match="torch does not import"):
        choose_device(facts=broken)


def test_choice_is_frozen_and_serialisable() -> None:
    choice = choose_device(facts=BOTH)
    with pytest.raises(dataclasses.FrozenInstanceError):
        choice.reason = "x"  # type: ignore[misc]
    doc = json.loads(json.dumps(choice.to_dict()))
    assert doc["device"] == "cuda:0" and doc["candidates"][1] == {"device": "xpu:0", "available": True, "reason": "XPU is available (1 device)"}
    assert DeviceChoice.from_doc(doc) == choice


def test_injected_facts_are_not_changed() -> None:
    before = json.dumps(BOTH, sort_keys=True)
    choose_device(facts=BOTH)
    assert json.dumps(BOTH, sort_keys=True) == before


# --- on this machine (a CPU-only build) ------------------------------------------------------------------


def test_this_machine_picks_cpu_with_the_build_as_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHDOCTOR_DEVICE", raising=False)
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this test describes a CPU-only machine")
    choice = torchdoctor.choose_device()
    assert choice.device == torch.device("cpu")
    assert isinstance(torchdoctor.pick_device(), torch.device)
    if torch.version.cuda is None and torch.version.hip is None:
        assert f"CPU-only build of torch {torch.__version__}" in choice.reason
        with pytest.raises(DeviceUnavailableError, match=f"CPU-only build of torch {torch.__version__}".replace("+", r"\+")):
            torchdoctor.pick_device("cuda")


def test_environment_variable_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHDOCTOR_DEVICE", "cpu")
    assert choose_device().source == "environment"
    monkeypatch.setenv("TORCHDOCTOR_DEVICE", "definitely-not")
    with pytest.raises(DeviceUnavailableError, match="not a device"):
        pick_device()
    assert pick_device("cpu") == torch.device("cpu")


def test_live_choice_agrees_with_collected_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHDOCTOR_DEVICE", raising=False)
    assert pick_device() == pick_device(facts=collect_facts())


# --- capabilities ----------------------------------------------------------------------------------------


def direct(family: str, dtype: torch.dtype) -> bool:
    """The probe ops written out again, independently, on CPU."""
    def x(*shape: int) -> torch.Tensor:
        return (torch.rand(*shape) + 0.5).to(dtype)

    ops = {
        "storage": lambda: x(2, 2).float(),
        "matmul": lambda: torch.mm(x(2, 2), x(2, 2)),
        "conv": lambda: torch.nn.Conv2d(1, 1, 2, bias=False).to(dtype)(x(1, 1, 3, 3)),
        "layer_norm": lambda: torch.nn.LayerNorm(2).to(dtype)(x(2, 2)),
        "softmax": lambda: F.softmax(x(2, 2), -1),
        "sdpa": lambda: F.scaled_dot_product_attention(x(1, 1, 2, 2), x(1, 1, 2, 2), x(1, 1, 2, 2)),
        "scaled_mm": lambda: torch._scaled_mm(x(16, 16), x(16, 16).t(), torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.bfloat16),
    }
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return bool(torch.isfinite(ops[family]().float()).all())
    except Exception:
        return False


def test_cpu_capabilities_agree_with_running_the_ops() -> None:
    caps = capabilities("cpu")
    assert caps["device"] == "cpu" and caps["probed"] is True
    assert set(caps["dtypes"]) >= {"float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}
    for name, row in caps["dtypes"].items():
        for family, ran in row.items():
            assert ran == direct(family, getattr(torch, name)), (name, family)
        assert ("scaled_mm" in row) == name.startswith("float8")
    assert {"float32", "bfloat16", "float16"} <= set(caps["compute"])
    assert set(caps["storage"]) == set(caps["dtypes"])
    for name, fams in caps["errors"].items():  # every failure says why
        assert all(not caps["dtypes"][name][fam] and msg for fam, msg in fams.items())


def test_float8_on_cpu_is_storage_with_scaled_mm_compute_but_no_conv() -> None:
    row = capabilities("cpu")["dtypes"]["float8_e4m3fn"]
    assert row["storage"] and not row["conv"] and not row["layer_norm"]
    # the kernel that refuses (and so the wording) differs by CPU: "... not implemented for 'Float8_e4m3fn'" or
    # "Promotion for Float8 Types is not supported"; both name float8
    assert "Float8" in capabilities("cpu")["errors"]["float8_e4m3fn"]["conv"]


def test_capabilities_are_cached_and_copies() -> None:
    first = capabilities("cpu")
    first["dtypes"]["float32"]["matmul"] = "changed"
    assert capabilities(torch.device("cpu")) == capabilities("cpu:0") != first
    assert capabilities("cpu")["dtypes"]["float32"]["matmul"] is True


@pytest.mark.parametrize(("flags", "bf16_runs", "expected"), [
    (("avx512_bf16",), True, "bfloat16"), (("amx_bf16", "avx512_bf16"), True, "bfloat16"), (("bf16",), True, "bfloat16"),
    ((), True, "float32"), (("avx512_bf16",), False, "float32"),
])
def test_recommend_dtype_on_cpu_follows_the_documented_rule_on_every_cpu(
        monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], bf16_runs: bool, expected: str) -> None:
    """Both sides of the native-bf16 rule run on every machine: the CPU's flags are forced either way."""
    from torchdoctor._env import devices as devices_mod, facts

    monkeypatch.setattr(facts, "cpu_info", lambda root="/": ("forced CPU", flags))
    caps = {"compute": ["float32", "float16"] + (["bfloat16"] if bf16_runs else [])}
    name, why = devices_mod._recommend(torch, torch.device("cpu"), caps)
    assert name == expected
    assert ("native bf16 instructions (" in why) == (expected == "bfloat16")


def test_recommend_dtype_on_this_cpu_agrees_with_its_capabilities() -> None:
    assert capabilities("cpu")["recommended"] == str(recommend_dtype("cpu")).removeprefix("torch.")


def test_capabilities_refuse_meta_and_unbuilt_devices() -> None:
    with pytest.raises(ValueError, match="meta tensors have no kernels"):
        capabilities("meta")
    if torch.version.cuda is None and torch.version.hip is None:
        with pytest.raises(DeviceUnavailableError, match="cannot probe cuda:0"):
            capabilities("cuda")


def test_minimal_injected_facts() -> None:
    choice = choose_device(facts={"cuda_available": True, "xpu_available": True})
    assert choice.device == torch.device("cuda:0")
    assert "CUDA is available (1 device)" in choice.reason and "TORCHDOCTOR_DEVICE=xpu" in choice.reason
    assert pick_device(facts={}) == torch.device("cpu")
    assert pick_device(facts={"xpu_available": True}) == torch.device("xpu:0")

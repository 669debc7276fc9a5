"""Device choice and dtype capabilities.

Choice: an explicit argument, then ``TORCHDOCTOR_DEVICE``, then CUDA > XPU > MPS > CPU. XPU is never picked where
CUDA works unless asked. An explicit choice (argument or variable) that cannot be used raises
``DeviceUnavailableError`` (a ``RuntimeError``) naming the reason; it never falls back silently. The decision is a
pure function of facts (``torchdoctor._env``), so it can be tested, and explained, for machines we do not have.

Capabilities: which dtypes really run small ops (2x2 / 1x1x3x3 tensors) per family on a device, probed once per
device and cached.

>>> choice = choose_device(facts={"torch": {"version": "2.13.0+cpu", "build": "cpu"}})
>>> str(choice.device), choice.source
('cpu', 'priority')
"""

from __future__ import annotations

import copy
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchdoctor._env.complete import complete_facts
from torchdoctor._env.versions import oneapi_hides_gpus, visible_count
from torchdoctor._env.virtual import VIRTUAL, virtual_view  # noqa: F401 (VIRTUAL: the runtime's older hook)
from torchdoctor._report.text import public_types

if TYPE_CHECKING:  # pragma: no cover
    import torch

PRIORITY = ("cuda", "xpu", "mps", "cpu")
_NAMES = {"cuda": "CUDA", "xpu": "XPU", "mps": "MPS", "cpu": "CPU"}
_ORDER = "priority CUDA > XPU > MPS > CPU"


class DeviceUnavailableError(RuntimeError):
    """An explicitly requested device (argument or ``TORCHDOCTOR_DEVICE``) cannot be used here; says why."""


@dataclass(frozen=True)
class Candidate:
    device: str
    available: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "available": self.available, "reason": self.reason}


@dataclass(frozen=True)
class DeviceChoice:
    """The device chosen, why (``reason``), by what (``source``: argument, environment, priority), and every candidate."""

    device: torch.device
    reason: str
    candidates: tuple[Candidate, ...]
    source: str = "priority"

    def to_dict(self) -> dict[str, Any]:
        from torchdoctor._placement import device_str

        return {"device": device_str(self.device), "reason": self.reason, "source": self.source,
                "candidates": [c.to_dict() for c in self.candidates]}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> DeviceChoice:
        import torch

        cands = tuple(Candidate(c["device"], bool(c["available"]), c["reason"]) for c in doc.get("candidates", ()))
        return cls(torch.device(doc["device"]), doc["reason"], cands, doc.get("source", "priority"))


public_types(DeviceChoice)


# --- the decision, from facts only -----------------------------------------------------------------------


def _why_not(f: Mapping[str, Any], kind: str) -> str | None:
    """Why device type ``kind`` is unavailable according to the facts, or None when it is available."""
    t, env, drv, p = f["torch"], f["env"], f["drivers"], f["platform"]
    v = t["version"] or "?"
    if not t["importable"]:
        return f"torch does not import ({t['error']})"
    if kind == "cpu":
        return None
    if f[f"{kind}_available"]:
        return None
    probed = f["availability_source"] in ("probe", "torch")
    if kind == "cuda":
        if t["build"] not in ("cuda", "rocm"):
            return _other_build(t, v, "CUDA")
        for var in ("CUDA_VISIBLE_DEVICES",) + (("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES") if t["build"] == "rocm" else ()):
            if visible_count(env.get(var), 64) == 0:
                return f"{var}={env[var]!r} hides every GPU"
        if t["build"] == "cuda" and not (drv["nvidia"] or any(d.get("vendor") == "nvidia" for d in f["devices"])):
            return "no NVIDIA driver or GPU found"
        if t["build"] == "rocm" and not drv["rocm"]:
            return "no AMD GPU with the ROCm driver (/dev/kfd) found"
        err = (f["probed"].get("cuda") or {}).get("error")
        return "torch.cuda.is_available() is False" + (f" ({err})" if err else "") if probed else "no CUDA device visible"
    if kind == "xpu":
        ipex = f["packages"].get("intel-extension-for-pytorch") or ""
        if t["build"] != "xpu" and "+xpu" not in ipex:
            return _other_build(t, v, "XPU")
        if oneapi_hides_gpus(env.get("ONEAPI_DEVICE_SELECTOR")):
            return f"ONEAPI_DEVICE_SELECTOR={env['ONEAPI_DEVICE_SELECTOR']!r} leaves no Level Zero GPU"
        if not drv["intel"] and not probed:
            return "no Intel GPU driver (i915 / xe) found"
        return "torch.xpu.is_available() is False" if probed else "no Intel GPU found"
    if kind == "mps":
        if p["system"] and p["system"] != "Darwin":
            return f"MPS needs macOS on Apple silicon (this is {p['system']})"
        if p["rosetta"]:
            return "Python runs under Rosetta (x86_64)"
        if not t["mps_built"]:
            return f"torch {v} was built without MPS" if t["build"] else "not available according to the facts"
        return "torch.backends.mps.is_available() is False (macOS 12.3+ on Apple silicon needed)"
    return None


def _other_build(t: Mapping[str, Any], version: str, wanted: str) -> str:
    if t["build"] == "cpu":
        return f"CPU-only build of torch {version}"
    if not t["build"]:
        return "not available according to the facts"
    return f"torch {version} is a {str(t['build']).upper()} build without {wanted}"


def _count(f: Mapping[str, Any], kind: str) -> int:
    return int(f.get(f"{kind}_device_count") or 0) if kind in ("cuda", "xpu") else 1


_VENDOR = {"cuda": ("nvidia", "amd"), "xpu": ("intel",), "mps": ("apple",), "cpu": ()}


def _label(f: Mapping[str, Any], kind: str) -> str:
    """``CUDA is available (NVIDIA GeForce RTX 4090, 2 devices)``."""
    if kind == "cpu":
        return "the CPU is always available"
    names = [d["name"] for d in f["devices"] if d.get("name") and d.get("vendor") in _VENDOR[kind]]
    n = max(_count(f, kind), 1)
    count = f"{n} device{'s' if n > 1 else ''}" if kind != "mps" else ""
    detail = ", ".join(x for x in (names[0] if names else "", count if not names or n > 1 else "") if x)
    return f"{_NAMES[kind]} is available" + (f" ({detail})" if detail else "")


def unavailable_reason(facts: Mapping[str, Any], device: str) -> str | None:
    """Why ``device`` (``'cuda:1'``, ``'xpu'``, ...) cannot be used according to ``facts``; None if it can."""
    f = complete_facts(facts)
    text = str(device).strip().lower()
    kind, _, index = text.partition(":")
    if kind == "meta" or (kind == "cpu" and index in ("", "0")):
        return _why_not(f, "cpu")
    if kind not in ("cuda", "xpu", "mps") or (index and not index.isdigit()):
        return f"{device!r} is not a device torchdoctor can choose (use cpu, cuda, cuda:N, xpu, xpu:N or mps)"
    why = _why_not(f, kind)
    if why is None and index and kind in ("cuda", "xpu") and _count(f, kind) and int(index) >= _count(f, kind):
        n = _count(f, kind)
        span = f"{kind}:0..{kind}:{n - 1}" if n > 1 else f"{kind}:0"
        why = f"{kind}:{index} does not exist: {n} {_NAMES[kind]} device{'s' if n > 1 else ''} visible ({span})"
    if why is None and index and kind == "mps" and index != "0":
        why = "there is only mps:0"
    return why


def _candidates(f: Mapping[str, Any]) -> list[Candidate]:
    out = []
    for kind in PRIORITY:
        why = _why_not(f, kind)
        out.append(Candidate("cpu" if kind == "cpu" else f"{kind}:0", why is None, _label(f, kind) if why is None else why))
    return out


def _index_str(text: str) -> str:
    kind, _, index = text.partition(":")
    return kind if kind in ("cpu", "meta") else f"{kind}:{index or 0}"


def decide(facts: Mapping[str, Any], preferred: str | None = None) -> dict[str, Any]:
    """The device decision as JSON (``device``, ``reason``, ``source``, ``candidates``). Pure; raises on a bad explicit choice."""
    f = complete_facts(facts)
    cands = _candidates(f)
    docs = [c.to_dict() for c in cands]
    env_value = (f["env"].get("TORCHDOCTOR_DEVICE") or "").strip()
    from_env = None if env_value.lower() in ("", "auto") else env_value
    for source, value, said in (("argument", preferred, f"pick_device({preferred!r})"),
                                ("environment", from_env, f"TORCHDOCTOR_DEVICE={env_value}")):
        if value is None:
            continue
        why = unavailable_reason(f, value)
        if why is not None:
            raise DeviceUnavailableError(
                f"{value} was requested ({said}) but cannot be used: {why}.\n"
                "Fix: torchdoctor.pick_device()  # no argument and TORCHDOCTOR_DEVICE unset: the best available device")
        device = _index_str(str(value).strip().lower())
        return {"device": device, "reason": f"requested explicitly ({said})", "source": source, "candidates": docs}
    if not f["torch"]["importable"]:
        reason = f"torch does not import ({f['torch']['error']})"
        return {"device": None, "reason": reason, "source": "priority", "candidates": docs}
    chosen = next(c for c in cands if c.available)
    others = [c.device.split(":")[0] for c in cands if c.available and c is not chosen and c.device != "cpu"]
    if chosen.device == "cpu":
        # MPS off macOS says nothing the reader needs; the build reason usually covers CUDA and XPU at once
        relevant = [c for c in cands[:-1] if not (c.device.startswith("mps") and f["platform"]["system"] not in (None, "Darwin"))]
        reasons = list(dict.fromkeys(c.reason for c in relevant))
        why = reasons[0] if len(reasons) == 1 else "; ".join(f"{c.device.split(':')[0]}: {c.reason}" for c in relevant)
        reason = f"no accelerator available: {why} ({_ORDER})"
    else:
        reason = f"{chosen.reason}; {_ORDER}"
    for other in others:
        reason += f". {_NAMES[other]} is available too: TORCHDOCTOR_DEVICE={other} or torchdoctor.pick_device({other!r}) uses it"
    return {"device": chosen.device, "reason": reason, "source": "priority", "candidates": docs}


def decide_safely(facts: Mapping[str, Any]) -> dict[str, Any]:
    """``decide`` for reports: an unusable ``TORCHDOCTOR_DEVICE`` becomes ``device: None`` with the reason."""
    try:
        return decide(facts)
    except DeviceUnavailableError as exc:
        f = complete_facts(facts)
        return {"device": None, "reason": str(exc).splitlines()[0], "source": "environment",
                "candidates": [c.to_dict() for c in _candidates(f)]}


def choose_device(preferred: str | torch.device | None = None, *, facts: Mapping[str, Any] | None = None) -> DeviceChoice:
    """Choose a device and say why: argument, then ``TORCHDOCTOR_DEVICE``, then CUDA > XPU > MPS > CPU.

    Without ``facts``, availability comes from torch's own checks for the backends compiled in (no device context
    is created). Raises ``DeviceUnavailableError`` when an explicit choice cannot be used.

    >>> choose_device(facts={"cuda_available": True, "xpu_available": True, "cuda_device_count": 1,
    ...     "torch": {"version": "2.8.0+cu128", "build": "cuda"}}).device
    device(type='cuda', index=0)
    """
    from torchdoctor._env.facts import device_facts

    f = {**device_facts(), **(virtual_view() or {}).get("facts", {})} if facts is None else facts
    pref = None if preferred is None else str(preferred)
    doc = decide(f, pref)
    if doc["device"] is None:
        raise DeviceUnavailableError(f"no device can be chosen: {doc['reason']}")
    return DeviceChoice.from_doc(doc)


def pick_device(preferred: str | torch.device | None = None, *, facts: Mapping[str, Any] | None = None) -> torch.device:
    """The device to use: ``choose_device(...).device``.

    >>> pick_device(facts={"torch": {"version": "2.13.0+cpu", "build": "cpu"}})
    device(type='cpu')
    """
    return choose_device(preferred, facts=facts).device


# --- capabilities: small real ops per family and dtype ---------------------------------------------------

DTYPES = ("float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
FAMILIES = ("storage", "matmul", "conv", "layer_norm", "softmax", "sdpa")
COMPUTE_FAMILIES = ("matmul", "conv", "layer_norm", "softmax", "sdpa")
_CACHE: dict[str, dict[str, Any]] = {}
_LOCK = threading.Lock()


def _ops(torch: Any) -> dict[str, Callable[[Any, Any], Any]]:
    F = torch.nn.functional

    def t(shape: tuple[int, ...], dt: Any, d: Any) -> Any:
        return torch.arange(1, 1 + int(torch.tensor(shape).prod()), dtype=torch.float32).reshape(shape).div(8).to(d).to(dt)

    return {
        "storage": lambda dt, d: t((2, 2), dt, d).to(torch.float32),
        "matmul": lambda dt, d: t((2, 2), dt, d) @ t((2, 2), dt, d),
        "conv": lambda dt, d: F.conv2d(t((1, 1, 3, 3), dt, d), t((1, 1, 2, 2), dt, d)),
        "layer_norm": lambda dt, d: F.layer_norm(t((2, 2), dt, d), (2,), t((2,), dt, d), t((2,), dt, d)),
        "softmax": lambda dt, d: torch.softmax(t((2, 2), dt, d), dim=-1),
        "sdpa": lambda dt, d: F.scaled_dot_product_attention(*(t((1, 1, 2, 2), dt, d) for _ in range(3))),
        # FP8 compute is a scaled matmul; 16x16 is the smallest shape CUDA accepts.
        "scaled_mm": lambda dt, d: torch._scaled_mm(t((16, 16), dt, d), t((16, 16), dt, d).t(), torch.tensor(1.0, device=d),
                                                    torch.tensor(1.0, device=d), out_dtype=torch.bfloat16),
    }


def run_op(family: str, dtype: torch.dtype, device: torch.device | str) -> str | None:
    """Run one probe op; None when it ran and gave finite numbers, else the error (first line)."""
    import torch

    d = torch.device(device)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = _ops(torch)[family](dtype, d)
            if not bool(torch.isfinite(out.to(torch.float32).cpu()).all()):
                return "non-finite result"
        return None
    except Exception as exc:
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def capabilities(device: torch.device | str = "cpu") -> dict[str, Any]:
    """Which dtypes run which op families on ``device`` (probed with tiny real ops, cached per device).

    Returns ``{"device", "probed", "dtypes": {dtype: {family: bool}}, "compute", "storage", "errors",
    "recommended", "recommended_reason"}``. ``compute`` lists the dtypes every compute family runs in; for float8
    it means ``torch._scaled_mm`` runs (how FP8 is computed). Raises ``DeviceUnavailableError`` if no tensor can be
    made on the device.

    >>> caps = capabilities("cpu")
    >>> caps["dtypes"]["float32"]["matmul"], "float32" in caps["compute"]
    (True, True)
    """
    import torch

    from torchdoctor._placement import device_str

    d = torch.device("cpu") if torch.device(device).type == "cpu" else torch.device(device)  # one CPU, any index
    key = device_str(d)
    if d.type == "meta":
        raise ValueError("meta tensors have no kernels: capabilities are for real devices (cpu, cuda:N, xpu:N, mps)")
    here = virtual_view()
    if here is not None and d.type == here["type"]:  # never cached: the profile's answer, not the machine's
        return {**_probe_device(torch, d, key, here["run"]), "probed": False, "virtual": True}
    with _LOCK, here["outside"]() if here else threading.Lock():  # the machine's probe is not the run's own ops
        if key not in _CACHE:
            try:
                torch.zeros(1, device=d)
            except Exception as exc:
                raise DeviceUnavailableError(f"cannot probe {key}: {type(exc).__name__}: {exc}") from exc
            _CACHE[key] = _probe_device(torch, d, key)
        return copy.deepcopy(_CACHE[key])


def _probe_device(torch: Any, d: Any, key: str, run: Callable[[str, Any], str | None] | None = None) -> dict[str, Any]:
    """``run(family, dtype)`` -> None when it runs, else the error (default: a real op on ``d``)."""
    run = run or (lambda fam, dt: run_op(fam, dt, d))
    table: dict[str, dict[str, bool]] = {}
    errors: dict[str, dict[str, str]] = {}
    for name in DTYPES:
        dt = getattr(torch, name, None)
        if not isinstance(dt, torch.dtype):
            continue
        row = {fam: run(fam, dt) for fam in FAMILIES + (("scaled_mm",) if name.startswith("float8") else ())}
        table[name] = {fam: err is None for fam, err in row.items()}
        if any(row.values()):
            errors[name] = {fam: err for fam, err in row.items() if err}
    # float8 is computed through a scaled matmul, the others through every family
    compute = [n for n, row in table.items()
               if (row.get("scaled_mm") if n.startswith("float8") else all(row[k] for k in COMPUTE_FAMILIES))]
    caps: dict[str, Any] = {"device": key, "probed": True, "dtypes": table, "compute": compute,
                            "storage": [n for n, row in table.items() if row["storage"]], "errors": errors}
    rec, why = _recommend(torch, d, caps)
    caps.update(recommended=rec, recommended_reason=why)
    return caps


def _recommend(torch: Any, d: Any, caps: Mapping[str, Any]) -> tuple[str, str]:
    """The dtype rule, per device type (documented in ``recommend_dtype``)."""
    ok = set(caps["compute"])
    if d.type == "cpu":
        from torchdoctor._env.facts import cpu_info

        native = [f for f in cpu_info()[1] if f in ("avx512_bf16", "amx_bf16", "bf16")]
        if "bfloat16" in ok and native:
            return "bfloat16", f"bf16 runs every op family and the CPU has native bf16 instructions ({', '.join(native)})"
        return "float32", "no native bf16 instructions on this CPU: bf16 would be emulated, float16 is slow on CPU"
    if d.type == "mps" and "float16" in ok:
        return "float16", "float16 is the fast, fully supported half type on MPS"
    if d.type == "cuda" and "bfloat16" in ok and not getattr(torch.version, "hip", None):
        major = torch.cuda.get_device_capability(d)[0]
        if major < 8:
            if "float16" in ok:
                return "float16", f"capability {major}.x has no native bf16"
            return "float32", "no half-precision dtype runs every op family here"
    for name in ("bfloat16", "float16"):
        if name in ok:
            return name, f"{name} runs every op family on {d.type}"
    return "float32", "no half-precision dtype runs every op family here"


def recommend_dtype(device: torch.device | str = "cpu") -> torch.dtype:
    """The compute dtype to use on ``device``, from its probed capabilities.

    Rule: CPU -> bfloat16 when bf16 runs every family *and* the CPU has native bf16 instructions (x86 AVX512_BF16 or
    AMX-BF16, ARM BF16), else float32 (emulated bf16 and CPU float16 are slower than float32). MPS -> float16.
    CUDA -> bfloat16 on capability 8.0+ (and ROCm), float16 below. XPU and others -> bfloat16, then float16, then
    float32, whichever runs every family first.

    >>> import torch
    >>> recommend_dtype("cpu") in (torch.bfloat16, torch.float32)
    True
    """
    import torch

    return getattr(torch, capabilities(device)["recommended"])  # type: ignore[no-any-return]
public_types(DeviceUnavailableError)

"""Hardware branches of the libraries under test, forced either way so the suite runs the same on every CPU.

bitsandbytes 0.50 asks the CPU once, through ``bitsandbytes.functional.has_avx512bf16()``, and reads the answer
in three places:

* at import, ``bitsandbytes/backends/cpu/ops.py`` (``from bitsandbytes.functional import has_avx512bf16``):
  with AVX512-BF16 it tries the ``kernels`` package (without it: the log line "Failed to load CPU
  gemm_4bit_forward from kernels-community ..." on stderr) and registers its fused ``gemv_4bit`` CPU kernel;
* when a ``Linear4bit`` is built, ``bitsandbytes/nn/modules.py`` stores it as ``support_avx512bf16_for_cpu``;
* in ``Linear4bit.forward``, that attribute: eval mode and an input without grad repack the weight in place into
  the CPU layout (uint8 [out, in/2], ``quant_state.packing_format_for_cpu``), which asserts ``out % 32 == 0`` and
  reshapes ``absmax`` per block of inputs (``in`` a multiple of the block size, 64: "shape '[32, 0]' is invalid"
  for a 32-input layer). Shapes valid on both branches: ``VALID_4BIT`` below.

(``backends/cpu/ops.py`` also reads ``torch.backends.cpu.get_cpu_capability() == "AVX512"`` for its int8 matmul
and a dequantize fallback at block sizes >= 2048; the suite uses neither.)

``pin_at_import`` replaces the function as ``bitsandbytes.functional`` is first imported, so every read above sees
the forced answer; ``tests/conftest.py`` pins the portable branch (``TD_TEST_BNB_AVX512BF16`` unset or ``0``) in
the test process, and ``SITE`` does the same in a child process (torchrun ranks, CLI runs) through its
``sitecustomize``. ``bnb_cpu_branch`` (a fixture, exported by ``tests/conftest.py``) runs a test on both branches
of the per-layer check.

Where the AVX512-BF16 kernel cannot run, bitsandbytes behaves in one of two ways: with the import branch forced on
a CPU without it, its fused ``gemv_4bit`` is native AVX512 code and the process dies (SIGILL, exit 132); with the
portable import branch and a layer forced to repack, its default ``gemv_4bit`` reads the packed bytes as portable
ones and returns other numbers. So on both, ``packed_gemv`` (torch ops reading the packed layout) stands in for
the fused kernel: the forced branch then computes what a CPU with AVX512-BF16 computes, numbers included.

>>> BRANCHES
('portable', 'avx512bf16')
>>> forced_answer("1"), forced_answer("0"), forced_answer(None), forced_answer("host")
(True, False, False, None)
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ENV = "TD_TEST_BNB_AVX512BF16"  # "0" (default) / "1": the answer bitsandbytes gets; "host": the CPU's own
BRANCHES = ("portable", "avx512bf16")
VALID_4BIT = (64, 64)  # (in_features, out_features) of the smallest Linear4bit both branches run (block size 64)
SITE = Path(__file__).parent / "site"  # put on PYTHONPATH of a child: its sitecustomize pins from ENV
_TARGET = "bitsandbytes.functional"
_CPU_OPS = "bitsandbytes.backends.cpu.ops"
_HOST_ATTR = "_td_host_has_avx512bf16"  # the library's own probe, kept on the module for host_has_avx512bf16()


def forced_answer(value: str | None) -> bool | None:
    """The answer a value of ``ENV`` forces; None leaves the CPU's own answer."""
    if value is None or value.strip() in ("", "0"):
        return False
    if value.strip() == "1":
        return True
    if value.strip() == "host":
        return None
    raise ValueError(f"{ENV}={value!r}: use 0, 1 or host")


def _answer(value: bool) -> Callable[[], bool]:
    def has_avx512bf16() -> bool:  # the forced answer, under the library's own name
        return value

    return has_avx512bf16


def _force(functional: ModuleType, value: bool) -> None:
    if not hasattr(functional, _HOST_ATTR):
        setattr(functional, _HOST_ATTR, functional.has_avx512bf16)
    functional.has_avx512bf16 = _answer(value)


class _Loader(importlib.abc.Loader):
    """Runs bitsandbytes.functional's own loader, then swaps its CPU probe before any importer binds the name."""

    def __init__(self, inner: importlib.abc.Loader, value: bool) -> None:
        self.inner, self.value = inner, value

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _force(module, self.value)


class _CpuOpsLoader(_Loader):
    """Runs bitsandbytes' CPU kernels module on the forced answer; where that answer is "yes" on a CPU that says no,
    its fused ``gemv_4bit`` (native AVX512-BF16 code: SIGILL, exit 132, on such a CPU) is replaced by
    ``packed_gemv``, which reads the same layout with torch ops."""

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        if self.value and not host_has_avx512bf16():
            import torch

            torch.library.register_kernel("bitsandbytes::gemv_4bit", "cpu")(packed_gemv)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, value: bool) -> None:
        self.value = value
        self.left = {_TARGET: _Loader, _CPU_OPS: _CpuOpsLoader}

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        loader = self.left.pop(name, None)
        if loader is None:
            return None
        if not self.left:
            sys.meta_path.remove(self)  # both seen: nothing more to do here
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = loader(spec.loader, self.value)
        return spec


def packed_gemv(A: Any, B: Any, shapeB: Sequence[int], absmax: Any, code: Any, blocksize: int) -> Any:
    """``A @ W.T`` for a weight in bitsandbytes' AVX512-BF16 CPU layout (``_convert_weight_packed_for_cpu``: uint8
    [N, K/2], 32 rows interleaved per block, ``absmax`` bf16 [K/blocksize, N]), in torch ops: the test stand-in
    for the fused kernel on a CPU that cannot run it, computing what that kernel computes (bf16 out)."""
    import torch

    n, k = int(shapeB[0]), int(shapeB[1])
    packed = B.contiguous().view(torch.uint8).reshape(-1, 32)
    nibbles = torch.cat([packed & 0xF, (packed >> 4) & 0xF], dim=-1)  # the converter's low then high halves
    q = nibbles.reshape(n // 32, k // 2, 32, 2).transpose(1, 2).reshape(n, k).long()
    scale = absmax.float().t().repeat_interleave(blocksize, dim=1)[:, :k]
    weight = (code.float()[q] * scale).to(torch.bfloat16)
    out = torch.nn.functional.linear(A.to(torch.bfloat16), weight)
    return out.to(A.dtype)


def pin_at_import(value: bool | None) -> str:
    """Force bitsandbytes' CPU answer before it is imported. Returns how: ``"import"`` (every read forced),
    ``"late"`` (already imported: the import-time branch stays as taken; later layers are forced) or ``"host"``."""
    if value is None:
        return "host"
    functional = sys.modules.get(_TARGET)
    if functional is not None:
        _force(functional, value)
        for name in ("bitsandbytes.nn.modules", "bitsandbytes.backends.cpu.ops"):
            if (mod := sys.modules.get(name)) is not None:
                mod.has_avx512bf16 = functional.has_avx512bf16  # type: ignore[attr-defined]
        return "late"
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(value))
    return "import"


def pin_from_env() -> str:
    return pin_at_import(forced_answer(os.environ.get(ENV)))


def host_has_avx512bf16() -> bool:
    """What this CPU answers bitsandbytes (its native probe, not the forced answer)."""
    import bitsandbytes.functional as functional

    probe = getattr(functional, _HOST_ATTR, functional.has_avx512bf16)
    return bool(probe())


def avx512bf16_kernel_registered() -> bool:
    """True when bitsandbytes took the AVX512-BF16 branch at import (its fused CPU ``gemv_4bit`` is there)."""
    import bitsandbytes.backends.cpu.ops as cpu_ops

    return hasattr(cpu_ops, "gemm_4bit_forward_kernel")


def child_env(branch: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a child Python process that takes ``branch`` (see ``BRANCHES``) at import."""
    full = dict(os.environ if env is None else env)
    full[ENV] = "1" if branch == "avx512bf16" else "0"
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), full.get("PYTHONPATH", "")) if p)
    return full


class Branch:
    """One forced branch of bitsandbytes' per-layer CPU check, for the test that asked for it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.avx512bf16 = name == "avx512bf16"

    def __repr__(self) -> str:
        return f"Branch({self.name!r})"

    def repacks(self, layer: Any, x: Any) -> bool:
        """Whether ``layer.forward(x)`` repacks, read from the conditions bitsandbytes itself checks."""
        import torch

        return (self.avx512bf16 and x.device.type == "cpu" and not layer.training
                and not (torch.is_grad_enabled() and x.requires_grad)
                and not getattr(layer.weight.quant_state, "packing_format_for_cpu", False))

    def apply(self, model: Any) -> Any:
        """Set the answer on 4-bit layers built before the branch was forced (a module-scoped model)."""
        import bitsandbytes as bnb

        for m in model.modules():
            if isinstance(m, bnb.nn.Linear4bit):
                m.support_avx512bf16_for_cpu = self.avx512bf16
        return model


def force_branch(monkeypatch: Any, name: str) -> Branch:
    """Force the per-layer check for layers built from now on (restored by ``monkeypatch``)."""
    if name not in BRANCHES:
        raise ValueError(f"unknown bitsandbytes CPU branch {name!r}: use one of {BRANCHES}")
    import bitsandbytes.functional as functional
    import bitsandbytes.nn.modules as modules

    answer = _answer(name == "avx512bf16")
    monkeypatch.setattr(functional, "has_avx512bf16", answer)
    monkeypatch.setattr(modules, "has_avx512bf16", answer)
    return Branch(name)


def branch_fixture(request: Any, monkeypatch: Any) -> Iterator[Branch]:
    """Body of the ``bnb_cpu_branch`` fixture (parametrized over ``BRANCHES`` in ``tests/conftest.py``). On the
    AVX512-BF16 branch without bitsandbytes' fused kernel registered (the portable import branch), the packed layout
    is computed by ``packed_gemv`` for the test, as the kernel would: otherwise bitsandbytes' default ``gemv_4bit``
    would read the packed bytes as portable ones and return other numbers."""
    branch = force_branch(monkeypatch, request.param)
    lib = None
    if branch.avx512bf16 and not avx512bf16_kernel_registered():
        import torch

        lib = torch.library.Library("bitsandbytes", "FRAGMENT")  # destroyed below: the kernel is the test's only
        torch.library.register_kernel("bitsandbytes::gemv_4bit", "cpu", packed_gemv, lib=lib)
    try:
        yield branch
    finally:
        if lib is not None:
            lib._destroy()

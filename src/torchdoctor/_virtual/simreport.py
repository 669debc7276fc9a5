"""What ``simulate`` found, as a frozen report: its problems, the fix by parts, and how long building the TARGET
and the run took, apart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from torchdoctor._placement import device_str, dtype_str
from torchdoctor._report.htmlmap import HtmlMapMixin
from torchdoctor._report.model import Problem
from torchdoctor._report.text import EXIT_USAGE, exit_code as exit_code_of, schema
from torchdoctor._rules.profile import DeviceProfile
from torchdoctor._virtual.groups import grouped
from torchdoctor._virtual.prove import Fix, fix_text, patch_of
from torchdoctor._virtual.recorder import _culprits_then_rest
from torchdoctor._virtual.session import whence_line

__all__ = ["SimulationReport"]


@dataclass(frozen=True, repr=False)
class SimulationReport(HtmlMapMixin):
    """What ``simulate`` found: ``.ok``, ``.problems`` (every problem, not only the first), ``.to_dict()``.
    ``device``/``dtype`` are torch objects here and strings in ``to_dict()``."""

    device: torch.device
    dtype: torch.dtype | None
    data: str
    profile: DeviceProfile
    problems: tuple[Problem, ...]
    ops: int = 0
    seconds: float = 0.0
    stopped: str | None = None  # why the run ended early, if it did
    summary: tuple[dict[str, Any], ...] = ()  # tensors by device and dtype after the move
    culprits: int = 0  # the first ``culprits`` problems are model tensors that caused the ones after them
    fix: str | None = None  # the fix as code, on the user's model (paths are the same as the copy's)
    forward: bool = True  # a forward (or the user's call) ran; False: only the move was checked
    assumed: str | None = None  # weights on meta taken as loaded there (a model built on meta), said in the report
    # what was expected and where each came from: device/dtype/profile and device_source/dtype_source/profile_source
    expected: dict[str, str] = field(default_factory=dict)
    fixes: tuple[Fix, ...] = ()  # the fix by parts, each proven or not by a re-run with it applied
    built_seconds: float | None = None  # building the TARGET (importing its file, its factory), not in ``seconds``

    @property
    def nothing_to_check(self) -> bool:
        """No tensor was there and no op ran (``simulate(42, device="cuda:1")``): ``ok`` holds, yet nothing was
        checked, as ``torchdoctor simulate`` says with exit 2."""
        return not self.problems and self.ops == 0 and not self.summary and not self.stopped

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok

    def exit_code(self) -> int:
        """0 ok, 1 problems, 2 something could not be simulated (an ``unsupported_op``, a nested tensor ...) or
        there was nothing to check."""
        return EXIT_USAGE if self.nothing_to_check else exit_code_of(self.problems)

    def to_dict(self) -> dict[str, Any]:
        p = self.profile
        return {
            "schema": schema("simulate"), "ok": self.ok, "nothing_to_check": self.nothing_to_check,
            "device": device_str(self.device),
            "dtype": dtype_str(self.dtype) if self.dtype is not None else None, "data": self.data,
            "profile": {"type": p.type, "count": p.count, "capability": list(p.capability), "memory": p.memory,
                        "name": p.name},
            "problems": [q.to_dict() for q in self.problems], "ops": self.ops, "seconds": round(self.seconds, 4),
            "built_seconds": None if self.built_seconds is None else round(self.built_seconds, 4),
            "stopped": self.stopped, "summary": list(self.summary), "fix": self.fix, "forward": self.forward,
            "assumed": self.assumed, "expected": dict(self.expected), "fixes": [f.to_dict() for f in self.fixes],
            # every fix's diff as one patch git apply takes whole (None: none, or diffs no one patch can carry)
            "patch": d[0] if len(d := patch_of(self.fixes)) == 1 else None,
        }

    def text(self, limit: int = 40) -> str:
        ran = next((p for p in self.problems if p.role == "run"), None)  # the code ran in another dtype than asked
        where = device_str(self.device) + (f" in {ran.found} ({ran.expected} asked for)" if ran is not None else
                                           f" in {dtype_str(self.dtype)}" if self.dtype else "")
        took = f"{self.seconds:.2f} s" if self.built_seconds is None else \
            f"built in {self.built_seconds:.2f} s; simulated in {self.seconds:.2f} s"
        head = f"{self.ops} ops on {'' if self.device.type == 'cpu' else 'virtual '}{where}, {took}"
        if self.nothing_to_check:
            return f"nothing to check: no tensors and no tensor op ({head}); pass a model, a pipeline or a Target"
        ok = "ok: no placement problems" if self.forward else \
            "ok: the move left nothing behind (no forward ran: pass inputs, or from the command line return " \
            "torchdoctor.Target(model, args), to check the forward)"
        lines = [f"{ok} ({head})"] if self.ok else \
            [f"{len(self.problems)} problem(s) ({head}):", *_culprits_then_rest(*_grouped(self.problems, self.culprits),
                                                                                limit)]
        if self.assumed:  # right under the headline: it qualifies every line after it
            lines.insert(1, self.assumed)
        if self.stopped:
            lines.append(f"stopped early: {self.stopped}")
        lines.extend(f"  {g['device']:<8} {g['dtype']:<14} {g['tensors']:>7} tensors" for g in self.summary[:limit])
        if self.expected:
            lines.append(whence_line(self.expected))
        if self.fixes or self.fix:
            lines.extend(fix_text(self.fixes) or ["Fix:", *(f"    {line}" for line in (self.fix or "").splitlines())])
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def _grouped(problems: tuple[Problem, ...], culprits: int) -> tuple[tuple[Problem, ...], int]:
    shown, n = grouped(problems, culprits)
    return tuple(shown), n


def positional(inputs: Any, device: Any, dtype: Any) -> tuple[Any, Any, Any]:
    """``simulate``'s (inputs, device, dtype), with a device and dtype written where the inputs go as ``Module.to``
    takes them (``simulate(model, "cuda:1", torch.bfloat16)``): a string or ``torch.device`` is never inputs."""
    if isinstance(inputs, (str, torch.device)) and (device is None or isinstance(device, torch.dtype) or dtype is None
                                                    and isinstance(getattr(torch, str(device), None), torch.dtype)):
        return None, inputs, device if dtype is None else dtype
    return inputs, device, dtype


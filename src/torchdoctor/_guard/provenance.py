"""Blame the culprit: which of the model's own tensors made a failure happen, before the op where it surfaced.

Nothing here runs on the happy path. At a failure, the policy's view of the guarded model (the same decisions scan
makes) lists the off-policy tensors; they are ranked by whether they hold the value the failing op found wrong and
by whether their module ran in this forward before the failing module (the order guard's pre-hooks recorded).
A float32 that entered by promotion (an fp32 embedding in a bf16 model) is named at the module where it entered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from torchdoctor._report.model import Problem

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._walk import Walk

_KINDS = {"dtype": ("dtype",), "device": ("device", "meta"), "meta": ("meta",), "unsupported_dtype": ("dtype",)}


@dataclass(frozen=True)
class Suspect:
    problem: Problem  # the policy's problem for the tensor, with its path in the guarded model
    ran: bool  # its module ran in this forward before (or around) the failing module
    matches: bool  # it holds the value the failing op found wrong

    @property
    def entered_at(self) -> str:
        return self.problem.module_path or "<root>"

    def line(self) -> str:
        p = self.problem
        where = f" (entered at `{self.entered_at}`)" if self.ran else ""
        return f"{p.path}: {p.tensors[0] if p.tensors else p.found}  is {p.found}, expected {p.expected}{where}"


def policy_problems(walk: Walk) -> list[Problem]:
    """The guarded model's off-policy tensors, as ``scan`` would report them (computed once per map)."""
    from torchdoctor._scan.policy import Policy

    return Policy(walk, None, None, False).judge()


def suspects(problems: list[Problem], kind: str, bad: set[str], ran_paths: list[str],
             failing_path: str | None) -> list[Suspect]:
    """Off-policy tensors that may have caused a ``kind`` failure, best first. ``bad`` are the values (``float32``,
    ``cpu``) the failing op found wrong; ``ran_paths`` the module paths that started in this forward, in order."""
    kinds = _KINDS.get(kind, (kind,))
    order = {p: i for i, p in enumerate(ran_paths)}
    out = []
    for p in problems:
        if p.kind not in kinds:
            continue
        mp = p.module_path or ""
        ran = mp in order or (failing_path is not None and _under(failing_path, mp))
        matches = p.found in bad or (p.kind == "meta" and kind in ("device", "meta"))
        out.append((not matches, not ran, order.get(mp, len(order)), p.path, Suspect(p, ran, matches)))
    out.sort(key=lambda x: x[:4])
    return [x[4] for x in out if x[4].matches or x[4].ran]


def ran_paths(modules: dict[int, str], ran: list[nn.Module]) -> list[str]:
    """Paths of the modules that started in this forward, first start first."""
    seen: dict[str, None] = {}
    for m in ran:
        p = modules.get(id(m))
        if p is not None:
            seen.setdefault(p, None)
    return list(seen)


def headline(s: Suspect, kind: str, where: str, surfaced: str) -> str:
    p = s.problem
    enter = f"; {p.found} entered at `{s.entered_at}`" if s.ran and p.kind != "meta" else ""
    return (f"{kind} mismatch caused by `{p.path}` ({p.found}, expected {p.expected}){enter}; it surfaced in "
            f"{where}: {surfaced}")


def _under(path: str, prefix: str) -> bool:
    return not prefix or path == prefix or path.startswith(prefix + ".")


def target_of(p: Problem) -> Any:
    """The value a suspect's fix casts or moves it to."""
    import torch

    from torchdoctor._placement import parse_device, parse_dtype

    if p.kind == "dtype":
        return parse_dtype(p.expected)
    try:
        return parse_device(p.expected)
    except ValueError:
        return torch.device("cpu")

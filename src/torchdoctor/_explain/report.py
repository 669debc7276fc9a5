"""Result types of ``explain`` and their rendering (text like the CLI, and JSON). Torch-free.

>>> d = Diagnosis("dtype_mismatch", "Matrix multiply with two different dtypes", "mat1 is float32, mat2 bfloat16.",
...               ("The input was not cast.",), (("Cast the input", "x = x.to(w.dtype)"),), "torchdoctor env", 0.9,
...               ("RuntimeError: mat1 and mat2 must have the same dtype",),
...               alternatives=(Alternative("input_weight_type_mismatch", 0.3, "a layer cast apart from its input"),))
>>> print(ExplainReport((d,)))  # doctest: +ELLIPSIS
torchdoctor explain: 1 error(s) recognised, best first
<BLANKLINE>
[1] dtype_mismatch (0.90): Matrix multiply with two different dtypes
  what happened: mat1 is float32, mat2 bfloat16.
  or: input_weight_type_mismatch (0.30): a layer cast apart from its input
...
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload
from torchdoctor._report.text import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, public_types
from torchdoctor._report.views import ResultViews

__all__ = ["Alternative", "Diagnosis", "ExplainReport", "SCHEMA", "UNPROVEN", "environment_fix", "render", "to_json"]

SCHEMA = "torchdoctor/explain/1"  # torchdoctor._report.schema("explain"), without importing torch


# explain reads text only: it never applies a fix to a failing state, so no fix of its own is proven (issue 41,
# point 1). A fix that is code is labelled so; a pure environment or app fix (a shell command, an app's flag or
# setting) changes no tensor the text names, so there is nothing about it that a re-run of the failing op could prove.
UNPROVEN = "unproven (from the error text only)"
_ENVIRONMENT = ("pip ", "pip3 ", "python ", "python3 ", "python_embeded", "venv/", "./webui", "webui", "set ",
                "--", "settings >", "invokeai.yaml", "nvidia-smi", "docker ", "export ", "git ", "conda ", "brew ",
                "sudo ", "cuda_visible_devices=", "torchrun ", "remove --", "# comfyui:", "# sd.next:", "vllm ",
                "torchdoctor env")


def environment_fix(code: str) -> bool:
    """Whether a fix is a command, a flag or an app setting rather than code of the user's program.

    >>> environment_fix("python main.py --disable-ipex-optimize"), environment_fix("x = x.to(w.dtype)")
    (True, False)
    """
    return code.lstrip().lower().startswith(_ENVIRONMENT)


@dataclass(frozen=True)
class Alternative:
    """Another category the same error fits, with how likely it is and why."""

    category: str
    confidence: float
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"category": self.category, "confidence": round(self.confidence, 3), "why": self.why}


@dataclass(frozen=True)
class Diagnosis:
    """One recognised error: what happened, why (ranked), how to fix it (code), how to confirm it, and the other
    categories it could belong to (``alternatives``, best first)."""

    category: str
    title: str
    what_happened: str
    likely_causes: tuple[str, ...]
    fixes: tuple[tuple[str, str], ...]
    confirm_with: str
    confidence: float
    evidence: tuple[str, ...]
    signature: str = ""
    count: int = 1
    alternatives: tuple[Alternative, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"category": self.category, "title": self.title, "what_happened": self.what_happened,
                "likely_causes": list(self.likely_causes),
                "fixes": [{"title": t, "code": c, "proven": False,
                           "kind": "environment" if environment_fix(c) else "code"} for t, c in self.fixes],
                "confirm_with": self.confirm_with,
                "confidence": round(self.confidence, 3), "evidence": list(self.evidence),
                "signature": self.signature, "count": self.count,
                "alternatives": [a.to_dict() for a in self.alternatives]}

    def text(self) -> str:
        lines = [f"{self.category} ({self.confidence:.2f}): {self.title}", f"  what happened: {self.what_happened}"]
        lines += [f"  or: {a.category} ({a.confidence:.2f}): {a.why}" for a in self.alternatives]
        lines.append("  likely causes:")
        lines += [f"    {i}. {c}" for i, c in enumerate(self.likely_causes, 1)]
        lines.append("  fixes:")
        for title, code in self.fixes:
            lines.append(f"    - {title}:" if environment_fix(code) else f"    - {title} [{UNPROVEN}]:")
            lines += [f"        {ln}" for ln in code.splitlines()]
        first = self.confirm_with.splitlines()[0] if self.confirm_with else ""
        lines.append(f"  confirm with: {first}" + ("" if "\n" not in self.confirm_with else " ..."))
        lines += [f"  > {e}" for e in self.evidence]
        if self.count > 1:
            lines.append(f"  (seen {self.count} times)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


@dataclass(frozen=True)
class ExplainReport(ResultViews, Sequence[Diagnosis]):
    """What ``torchdoctor.explain`` found: the diagnoses, best first. A sequence (index it, iterate it, ``len``),
    false when nothing was recognised; ``ok`` is True when nothing was found. ``str()`` renders like the CLI,
    ``to_dict()`` is the CLI's JSON document."""

    diagnoses: tuple[Diagnosis, ...] = ()
    source: str | None = None
    nothing_to_check: bool = False  # the text was empty or blank: no answer either way (exit 2, as scan's)

    @property
    def ok(self) -> bool:
        return not self.diagnoses

    def exit_code(self) -> int:
        """The CLI's exit code: 1 an error recognised, 0 none, 2 nothing to check (an empty text)."""
        return EXIT_USAGE if self.nothing_to_check else EXIT_PROBLEMS if self.diagnoses else EXIT_OK

    @overload
    def __getitem__(self, index: int) -> Diagnosis: ...

    @overload
    def __getitem__(self, index: slice) -> list[Diagnosis]: ...

    def __getitem__(self, index: int | slice) -> Diagnosis | list[Diagnosis]:
        if isinstance(index, slice):
            return list(self.diagnoses[index])  # a slice of the old list was a list
        return self.diagnoses[index]

    def __len__(self) -> int:
        return len(self.diagnoses)

    def __iter__(self) -> Iterator[Diagnosis]:
        return iter(self.diagnoses)

    def __bool__(self) -> bool:
        return bool(self.diagnoses)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ExplainReport):
            return self.diagnoses == other.diagnoses and self.source == other.source
        if isinstance(other, (list, tuple)):  # code written against the old list compares with []
            return list(self.diagnoses) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict[str, Any]:
        return {**to_json(self.diagnoses, self.source), "nothing_to_check": self.nothing_to_check}

    def __str__(self) -> str:
        if self.nothing_to_check:
            return ("torchdoctor explain: nothing to check: the text was empty (paste the error, or give a file: "
                    "torchdoctor explain error.log)")
        return render(self.diagnoses)

    def __repr__(self) -> str:
        cats = ", ".join(d.category for d in self.diagnoses[:5]) + (", ..." if len(self.diagnoses) > 5 else "")
        return f"ExplainReport({len(self.diagnoses)} diagnoses: [{cats}])"


public_types(Diagnosis, ExplainReport)


def render(diagnoses: Sequence[Diagnosis]) -> str:
    if not diagnoses:
        return "torchdoctor explain: no known device/dtype error found"
    head = f"torchdoctor explain: {len(diagnoses)} error(s) recognised, best first"
    return "\n\n".join([head] + [f"[{i}] {d.text()}" for i, d in enumerate(diagnoses, 1)])


def to_json(diagnoses: Sequence[Diagnosis], source: str | None = None) -> dict[str, Any]:
    return {"schema": SCHEMA, "source": source, "diagnoses": [d.to_dict() for d in diagnoses]}

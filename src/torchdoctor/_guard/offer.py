"""What a guard report offers beside its text: ``patch`` (a unified diff of the user's file, or None), ``proof`` (the
"fix proven" / "fix unproven" line) and ``to_dict()`` for ``--json``. A diff whose re-run was refuted by the same
kind of placement error is never offered (hunt U29); one this machine could not run (no CUDA here) still is, said
unproven."""

from __future__ import annotations

import functools
import re
from typing import Any

_REFUTED = re.compile(r": \w*(Error|Exception): ")  # a proof's re-run that raised


def with_patch(err: Any, patch: str | None, lines: list[str]) -> Any:
    """The report's machine-readable extras on the error: ``patch`` (a unified diff of the user's file, or None),
    ``proof`` (the "fix proven" / "fix unproven" line) and ``to_dict()`` for ``--json``."""
    err.proof = next((x for x in reversed(lines) if x.startswith(("fix proven", "fix unproven"))), None)
    if err.proof is not None and err.proof.startswith("fix unproven") and (hit := _REFUTED.search(err.proof)):
        from torchdoctor._guard.message import placement_category

        said = placement_category(err.proof[hit.end():])  # refuted (not: this machine cannot run it): no diff (U29)
        patch = None if said and said.endswith("mismatch") else patch
    err.patch = patch
    if patch:
        err.args = (f"{err.args[0]}\nPatch (git apply):\n" + "".join(f"    {x}" for x in patch.splitlines(True)),)
    err.to_dict = functools.partial(error_dict, err)  # a partial, not a lambda: the error stays picklable
    return err


def error_dict(err: Any) -> dict[str, Any]:
    """A guard report as JSON-ready data: where, what, the fix, its proof and its diff."""
    return {"module_path": err.module_path, "module_type": err.module_type, "op": err.op,
            "problems": [p.to_dict() for p in err.problems], "fix": err.fix,
            "proof": getattr(err, "proof", None), "patch": getattr(err, "patch", None),
            "message": str(err.args[0]) if err.args else ""}

"""The pack's two parts, written against torchdoctor's public API only (``explain``, ``scan``)."""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import torchdoctor

log = logging.getLogger("torchdoctor.comfyui")


class LogExplainer(logging.Handler):
    """Explains the placement errors in log records (ComfyUI's executor logs a node's exception with its
    traceback); says each distinct error once, on the ``torchdoctor.comfyui`` logger."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("torchdoctor"):
            return
        try:
            exc = record.exc_info[1] if record.exc_info else None
            found = torchdoctor.explain(exc if exc is not None else record.getMessage(), limit=1)
            if not found:
                return
            d = found[0]
            first = (str(exc).strip().splitlines() or [""])[0] if exc is not None else d.what_happened
            with self._lock:
                if (d.category, first) in self._seen:
                    return
                self._seen.add((d.category, first))
            # explain reads text only: a code fix is a proposal nothing ran (an app flag or a command is not labelled)
            first_fix = d.to_dict()["fixes"][0] if d.fixes else None
            label = " [unproven (from the error text only)]" if first_fix and first_fix["kind"] == "code" else ""
            fix = f"\n  fix{label}: {first_fix['code']}" if first_fix else ""
            log.warning("torchdoctor: %s (%s)%s\n  more: torchdoctor explain <this log>", d.title, d.category, fix)
        except Exception:  # a diagnostic must never break the app it watches
            pass


_INSTALLED: list[LogExplainer] = []


def install_log_explainer(logger: logging.Logger | None = None) -> LogExplainer:
    """Add the explainer to ``logger`` (the root logger: ComfyUI configured it before loading custom nodes); once."""
    if not _INSTALLED:
        _INSTALLED.append(LogExplainer())
        (logger or logging.getLogger()).addHandler(_INSTALLED[0])
    return _INSTALLED[0]


def check_report(patcher: Any) -> Any:
    """The scan of a ComfyUI MODEL (a ModelPatcher), with paths as the model's own (``diffusion_model.…``).

    The patcher itself is what is scanned, so the node answers exactly what ``torchdoctor.scan(patcher)`` answers
    (one policy): a model the patcher loaded on its ``load_device`` is judged against it; a partial (lowvram) load is
    judged the same way, its layers left on the offload device being quiet because they cast their weights per call
    (``comfy_cast_weights``, ``weight_function``); a model at rest on the offload device until sampling is quiet
    where it rests. The patcher's own state (``backup``, ``patches``) keeps the app's conventions."""
    report = torchdoctor.scan(patcher)
    if not hasattr(patcher, "model"):  # a bare module handed in by another pack
        return report
    problems = tuple(dataclasses.replace(p, path=p.path[len("model."):], module_path=_relative(p.module_path))
                     if p.path.startswith("model.") else p for p in report.problems)
    return dataclasses.replace(report, problems=problems)


def _relative(path: str | None) -> str | None:
    if path == "model":
        return ""
    return path[len("model."):] if path is not None and path.startswith("model.") else path


def check_model(patcher: Any) -> tuple[str, bool]:
    """(report text, ok) for a ComfyUI MODEL (``check_report``), headed by the state the patcher is in."""
    module = getattr(patcher, "model", patcher)
    load = getattr(patcher, "load_device", None)
    current = getattr(module, "device", None)
    lowvram = bool(getattr(module, "model_lowvram", False))
    loaded = load is not None and current is not None and str(current) == str(load) and not lowvram
    report = check_report(patcher)
    if loaded:
        head = f"{type(module).__name__} on its load device {load}"
    elif lowvram:
        head = f"{type(module).__name__} partially loaded on {load} (lowvram: the layers left on the offload " \
               f"device cast their weights per call)"
    else:
        head = f"{type(module).__name__} at rest on {current} until ComfyUI loads it on {load} for sampling"
    return f"torchdoctor placement check: {head}\n{report.text()}", report.ok


class PlacementCheck:
    """ComfyUI node: MODEL in, MODEL (unchanged) and the report out."""

    CATEGORY = "utils/torchdoctor"
    FUNCTION = "check"
    RETURN_TYPES = ("MODEL", "STRING")
    RETURN_NAMES = ("model", "report")
    OUTPUT_NODE = True
    DESCRIPTION = "Lists every tensor of the model that is not on its load device or in its dtype, by path."

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:  # noqa: N802 - ComfyUI's name
        return {"required": {"model": ("MODEL",)}}

    def check(self, model: Any) -> tuple[Any, str]:
        text, ok = check_model(model)
        (log.info if ok else log.warning)(text)
        return model, text

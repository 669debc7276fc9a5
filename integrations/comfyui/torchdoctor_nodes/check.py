"""The pack's two parts, written against torchdoctor's public API only (``explain``, ``scan``)."""

from __future__ import annotations

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
            fix = f"\n  fix: {d.fixes[0][1]}" if d.fixes else ""
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


def check_model(patcher: Any) -> tuple[str, bool]:
    """(report text, ok) for a ComfyUI MODEL: its module scanned against its load device when it is fully loaded
    there; partially loaded (lowvram) or offloaded models keep weights on the offload device by design, so they
    are scanned without a device expectation (dtype and meta problems only)."""
    module = getattr(patcher, "model", patcher)
    load = getattr(patcher, "load_device", None)
    current = getattr(module, "device", None)
    lowvram = bool(getattr(module, "model_lowvram", False))
    loaded = load is not None and current is not None and str(current) == str(load) and not lowvram
    report = torchdoctor.scan(module, device=load if loaded else None)
    if loaded:
        head = f"{type(module).__name__} on its load device {load}"
    elif lowvram:
        head = f"{type(module).__name__} partially loaded on {load} (lowvram: the rest stays on the offload device)"
    else:
        head = f"{type(module).__name__} not loaded on {load} yet (on {current}): device not judged"
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

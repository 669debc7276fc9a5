"""torchdoctor for SD.Next and AUTOMATIC1111 / Forge, in one step: put the ``torchdoctor-check`` folder in the app's
``extensions/`` folder and install torchdoctor in the app's Python (``python -m pip install torchdoctor``).

After a model loads (``script_callbacks.on_model_loaded``) and after every generation, once the LoRA / extra networks
of that generation were unloaded (``Script.postprocess`` runs after them), the loaded model is scanned against the
app's device; problems are logged by path with the fix, on the ``torchdoctor`` logger. Nothing is changed.
"""

from __future__ import annotations

import logging
from typing import Any

from modules import script_callbacks, scripts, shared

log = logging.getLogger("torchdoctor.webui")


def _device() -> Any:
    try:
        from modules import devices

        return devices.device
    except Exception:  # an app without modules.devices
        return getattr(shared, "device", None)


def check(sd_model: Any, when: str) -> Any:
    """Scan ``sd_model`` (a diffusers pipeline in SD.Next, an LDM module in A1111) against the app's device."""
    if sd_model is None:
        return None
    try:
        import torchdoctor

        report = torchdoctor.scan(sd_model, device=_device())
    except Exception as exc:  # a diagnostic must never break the app it watches
        log.debug("torchdoctor: cannot scan after %s: %s", when, exc)
        return None
    if not report.ok:
        log.warning("torchdoctor: after %s, %s", when, report.text())
    return report


script_callbacks.on_model_loaded(lambda sd_model: check(sd_model, "model load"))


class TorchdoctorCheck(scripts.Script):
    def title(self) -> str:
        return "torchdoctor placement check"

    def show(self, is_img2img: bool) -> Any:
        return scripts.AlwaysVisible

    def postprocess(self, p: Any, processed: Any, *args: Any) -> None:
        check(getattr(p, "sd_model", None) or getattr(shared, "sd_model", None), "generation (LoRA unloaded)")

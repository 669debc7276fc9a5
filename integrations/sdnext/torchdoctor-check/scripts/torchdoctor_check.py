"""torchdoctor for SD.Next and AUTOMATIC1111 / Forge, in one step: put the ``torchdoctor-check`` folder in the app's
``extensions/`` folder and install torchdoctor in the app's Python by the README's one route, its two lines with the
app's interpreter in place of ``python``::

    python -c "import torch; print('torch==' + torch.__version__)" > torch-pin.txt
    python -m pip install -c torch-pin.txt /path/to/torchdoctor

It checks at two moments, read from the apps' own code (SD.Next 058a7f0 ``modules/sd_models.py``,
``modules/processing.py``, ``modules/lora``; Forge dfdcbab ``modules/sd_models.py``, ``backend/patcher``):

- after a model loads (``script_callbacks.on_model_loaded``): SD.Next calls it once the model's offload is set up
  (in its default balanced offload the components rest on the cpu under its own accelerate hook and are moved per
  call); Forge calls it with its engine, whose model patchers keep the models on their offload device until sampling;
- after every generation (``Script.postprocess``, after the images are decoded): the model as the generation left
  it. Its LoRA networks are still applied then: SD.Next's ``extra_networks.deactivate`` restores the weights only
  when forced (by default they stay fused, or with their backups beside them, until a later generation changes
  the networks), and the webui restores its LoRA weights at the next activation.

The loaded model is scanned against the app's device with the one placement policy (``torchdoctor.scan``: offload
hooks, model patchers, layers that cast their weights per call and weight backups are read as the apps intend);
problems are logged by path with the fix, on the ``torchdoctor.webui`` logger. Nothing is changed. The three apps
load this file the same way (``extensions/<ext>/scripts/*.py`` imported by file name, ``Script`` subclasses
registered); ``docs/integrations.md`` has the moments in detail.
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
    """Scan ``sd_model`` (a diffusers pipeline in SD.Next, an LDM module in A1111, an engine holding model patchers
    in Forge) against the app's device: the answer ``torchdoctor.scan(sd_model, device=<the app's device>)`` gives."""
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
        check(getattr(p, "sd_model", None) or getattr(shared, "sd_model", None), "generation")

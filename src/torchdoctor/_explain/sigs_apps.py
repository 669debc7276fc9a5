"""Texts an app raises itself around a step it runs (issue 40, point 6), with their plain-PyTorch causes.

These messages are the apps' own words, so a paste of one came from that app even when nothing else in it names
the app: ``apps.step_fixes`` then adds the app's own switch for that step. Read from the apps' code (2026-11):
the webui's launcher refuses to start when torch cannot use the GPU (AUTOMATIC1111 ``modules/launch_utils.py``
"Torch is not able to use GPU; add --skip-torch-cuda-test"; Forge dfdcbab words it "Your device does not support
the current version of Torch/CUDA!"), and the NaN check SD.Next 058a7f0 and AUTOMATIC1111 run after the UNet and
the VAE (``modules/devices.py`` ``test_for_nans``: "A tensor with all NaNs was produced in VAE."; Forge's check
is a no-op, so Forge never prints it).
"""

from __future__ import annotations

from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import define as _sig

__all__: list[str] = []

_HALF_ALT = ("unsupported_dtype_on_device", 0.3, "a GPU without working half precision (GTX 16xx, some AMD and "
             "Intel cards) gives NaN in float16 too")

_sig("app.webui_gpu_test", "no_accelerator", "The web UI's launcher found no usable GPU",
     ("Torch is not able to use GPU", "does not support the current version of Torch/CUDA"),
     "The web UI checks that torch can use the GPU before it starts (torch.cuda.is_available()), and the check "
     "failed: the torch in the web UI's own venv is a CPU-only build, or its CUDA does not match the driver.",
     (("na.webui_venv", 2.0), ("na.no_driver", 1.0)), confidence=0.9)
_sig("app.nan_check", "dtype_mismatch", "The app's NaN check found an all-NaN result",
     ("A tensor with all NaNs was produced",),
     "After the[ {where}] ran, the app found a result that is all NaN: float16 overflowed there (the VAEs of SD "
     "1.x and SDXL overflow in float16), or the GPU has no working half precision.",
     (("dt.nan_half", 2.0),), r"all NaNs was produced in (?P<where>Unet|VAE)", confidence=0.85,
     alternatives=(_HALF_ALT,))

_c("na.webui_venv",
   "The web UI runs its own Python (its venv folder, or the portable build's python), and the torch installed "
   "there cannot use the GPU: a CPU-only wheel, a wheel for another CUDA than the driver supports, or no "
   "NVIDIA GPU at all.",
   'venv/bin/python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())"',
   ("Install a CUDA build of torch into the web UI's own venv",
    "venv/bin/python -m pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu124"),)
_c("dt.nan_half",
   "The[ {where}] ran in float16 and a value overflowed (float16 ends at about 65504), which turns the result "
   "into NaN: the usual case is the VAE, which the app runs in half precision unless told otherwise.",
   "torchdoctor env",
   ("In plain diffusers, decode with the VAE in float32", "pipe.vae.to(torch.float32)\n"
    "image = pipe.vae.decode(latents.to(torch.float32) / pipe.vae.config.scaling_factor).sample"),
   ("Or run in bfloat16, whose range is float32's (GPUs with bf16)", "pipe.to(torch.bfloat16)"))

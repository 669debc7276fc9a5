"""The app's own fix (issue 26, point 5): when the text or its stack shows ComfyUI, SD.Next, Forge, AUTOMATIC1111,
kohya sd-scripts or InvokeAI, the diagnosis also names the flag or setting of that app, beside the generic fix.

People who hit these errors in an app rarely edit its code: "--disable-ipex-optimize" helps a ComfyUI user where
"call model.to('xpu') before ipex.optimize" cannot. Checked against the apps' own argument parsers and
settings (2026-11): ComfyUI ``comfy/cli_args.py``; SD.Next ``modules/cmd_args.py`` and its options table; Forge's
backend arguments (``--always-gpu``, ``--always-high-vram``, ``--vae-in-fp32``, ``--attention-pytorch``);
sd-scripts' ``--no_half_vae``; InvokeAI's ``device`` / ``precision`` / ``attention_type`` keys. The AUTOMATIC1111
flags and Forge's ``--all-in-fp32`` are their documented names, not re-checked (docs/explain.md).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.context import MAC, find_word
from torchdoctor._explain.present import Present
from torchdoctor._explain.signatures import define as _sig

__all__ = ["APPS", "app_fixes", "app_of", "step_fixes"]

# Words that show the app in a lower-cased text whose backslashes were turned into slashes; first match wins,
# so Forge (a webui fork) comes before AUTOMATIC1111.
APPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ComfyUI", ("comfyui", "comfy/", "custom_nodes/", "!!! exception during processing", "comfy.", "ksampler",
                 "python_embeded")),
    ("SD.Next", ("sdnext", "sd.next", "vladmandic", "| sd |")),
    ("Forge", ("webui-forge", "modules_forge", "forge-neo", "forge-classic", "sd-webui-forge")),
    ("AUTOMATIC1111", ("stable-diffusion-webui", "commandline_args", "webui-user", "extensions-builtin",
                       "modules/processing.py", "sd_hijack")),
    ("sd-scripts", ("sd-scripts", "kohya", "train_network.py", "sdxl_train", "library/train_util.py")),
    ("InvokeAI", ("invokeai", "invoke-ai", "/api/v1/sessions")),
)

_DEV, _MIX, _Q = "device_mismatch", "mixed_device_model", "quantization_device"
_DT, _IW, _UD = "dtype_mismatch", "input_weight_type_mismatch", "unsupported_dtype_on_device"
_BO, _NA = "backend_op_missing", "no_accelerator"

# (app, categories) -> fixes (title, code); the code is what the user types or sets, not Python.
_FIXES: dict[tuple[str, tuple[str, ...]], tuple[tuple[str, str], ...]] = {
    ("ComfyUI", (_MIX,)): (
        ("ComfyUI: do not run IPEX's optimize on a model that lowvram loaded partly",
         "python main.py --disable-ipex-optimize"),
        ("ComfyUI: or keep whole models on the GPU (no partial loading)", "python main.py --highvram  # or --gpu-only")),
    ("ComfyUI", (_DEV, _Q)): (
        ("ComfyUI: keep every model on the GPU (no partial loading or offload)",
         "python main.py --gpu-only  # or --highvram"),
        ("ComfyUI: find the custom node that left a tensor behind", "python main.py --disable-all-custom-nodes")),
    ("ComfyUI", (_DT, _IW)): (
        ("ComfyUI: compute in one precision", "python main.py --force-fp32  # or --fp32-vae / --bf16-vae for the VAE"),),
    ("ComfyUI", (_UD,)): (
        ("ComfyUI: run in a precision this device has",
         "python main.py --force-fp32  # on a Mac: --force-fp16 and an fp16 (not fp8) checkpoint"),),
    ("ComfyUI", (_BO,)): (
        ("ComfyUI: use PyTorch's attention instead of xformers",
         "python main.py --use-pytorch-cross-attention  # or --disable-xformers"),),
    ("ComfyUI", (_NA,)): (
        ("ComfyUI portable: install a CUDA build of torch into ComfyUI's own Python",
         "python_embeded\\python.exe -m pip install torch torchvision torchaudio --index-url "
         "https://download.pytorch.org/whl/cu124"),
        ("ComfyUI: or run on the CPU", "python main.py --cpu")),
    ("SD.Next", (_DEV, _MIX, _Q)): (
        ("SD.Next: turn model offloading off",
         'Settings > Model Offloading > Model offload mode: none  (config.json "diffusers_offload_mode": "none")'),),
    ("SD.Next", (_DT, _IW, _UD)): (
        ("SD.Next: full precision for the model and the VAE",
         'Settings > Compute Settings: no-half, no-half VAE  (config.json "no_half": true, "no_half_vae": true)'),),
    ("SD.Next", (_BO,)): (
        ("SD.Next: use PyTorch's scaled-dot-product attention",
         'Settings > Compute Settings > Attention: Scaled-Dot-Product  (config.json '
         '"cross_attention_optimization": "Scaled-Dot-Product")'),),
    ("SD.Next", (_NA,)): (
        ("SD.Next: reinstall torch for your GPU", "./webui.sh --reinstall --use-cuda  # or --use-ipex / --use-rocm"),),
    ("Forge", (_DEV, _MIX, _Q)): (
        ("Forge: keep models on the GPU", "--always-gpu  # or --always-high-vram (COMMANDLINE_ARGS)"),),
    ("Forge", (_DT, _IW, _UD)): (
        ("Forge: compute in full precision", "--all-in-fp32  # or --vae-in-fp32 for the VAE (COMMANDLINE_ARGS)"),),
    ("Forge", (_NA,)): (
        ("Forge: reinstall its torch", "set COMMANDLINE_ARGS=--reinstall-torch  # webui-user.bat"),),
    ("Forge", (_BO,)): (
        ("Forge: use PyTorch's attention", "--attention-pytorch  # or --disable-xformers (COMMANDLINE_ARGS)"),),
    ("AUTOMATIC1111", (_DT, _IW, _UD)): (
        ("AUTOMATIC1111: full precision", "set COMMANDLINE_ARGS=--no-half --no-half-vae  # or --upcast-sampling"),),
    ("AUTOMATIC1111", (_DEV, _MIX)): (
        ("AUTOMATIC1111: keep models on the GPU", "remove --medvram / --lowvram from COMMANDLINE_ARGS"),),
    ("AUTOMATIC1111", (_BO,)): (
        ("AUTOMATIC1111: PyTorch attention instead of xformers", "set COMMANDLINE_ARGS=--opt-sdp-attention"),),
    ("AUTOMATIC1111", (_NA,)): (
        ("AUTOMATIC1111: --skip-torch-cuda-test only hides this; reinstall the CUDA torch",
         "set COMMANDLINE_ARGS=--reinstall-torch"),),
    ("sd-scripts", (_DT, _IW)): (
        ("sd-scripts: one training precision, VAE in float32", "--mixed_precision bf16 --no_half_vae"),),
    ("sd-scripts", (_UD,)): (
        ("sd-scripts: bf16 needs an Ampere (8.0+) GPU; use fp16 there", "--mixed_precision fp16 --no_half_vae"),),
    ("sd-scripts", (_BO,)): (("sd-scripts: PyTorch attention instead of xformers", "--sdpa"),),
    ("InvokeAI", (_DT, _IW, _UD)): (("InvokeAI: full precision", "invokeai.yaml:  precision: float32"),),
    ("InvokeAI", (_DEV, _MIX, _Q)): (("InvokeAI: name the device explicitly", "invokeai.yaml:  device: cuda"),),
    ("InvokeAI", (_BO,)): (("InvokeAI: attention without xformers", "invokeai.yaml:  attention_type: torch-sdp"),),
    ("InvokeAI", (_NA,)): (("InvokeAI: run on the CPU, or reinstall with the CUDA torch",
                            "invokeai.yaml:  device: cpu"),),
}


# On a Mac there is no CUDA build to install: the app runs on the Apple GPU (mps), and the code that asked for CUDA
# (a custom node, an extension) is what must change.
_MAC_FIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "ComfyUI": (
        ("ComfyUI on a Mac: ComfyUI itself runs on the Apple GPU; check that this torch sees it (no CUDA build "
         "exists for macOS)", 'python -c "import torch; print(torch.backends.mps.is_available())"'),
        ("ComfyUI: or run everything on the CPU", "python main.py --cpu")),
    "InvokeAI": (("InvokeAI on a Mac: use the Apple GPU", "invokeai.yaml:  device: mps"),),
}
# ComfyUI's portable build (python_embeded) is Windows-only: a log with POSIX paths runs ComfyUI from a venv
_COMFY_POSIX_NA = (
    ("ComfyUI: install a CUDA build of torch into the Python that runs ComfyUI (its venv active)",
     "python -m pip install --force-reinstall torch torchvision torchaudio --index-url "
     "https://download.pytorch.org/whl/cu124"),
    ("ComfyUI: or run on the CPU", "python main.py --cpu"))
# On an Intel GPU (XPU, IPEX images) a CUDA build is no answer either: ComfyUI runs on the XPU build of torch, and
# the code that asked for CUDA (a node) must change
_COMFY_XPU_NA = (
    ("ComfyUI on an Intel GPU: ComfyUI itself runs on the XPU; check that this torch sees it (a CUDA build cannot use "
     "an Intel GPU)", 'python -c "import torch; print(torch.xpu.is_available())"'),
    ("ComfyUI: if it prints False, install the XPU build of torch into the Python that runs ComfyUI",
     "python -m pip install --force-reinstall torch torchvision torchaudio --index-url "
     "https://download.pytorch.org/whl/xpu"),
    ("ComfyUI: or run everything on the CPU", "python main.py --cpu"))
_INTEL = ("xpu", "ipex", "intel arc", "arc a770", "arc a750", "arc b580", "oneapi")
_WEB_MAC = (("On a Mac the web UI runs on the Apple GPU: start it without CUDA flags",
             "./webui.sh  # no --use-cuda / --reinstall-torch: no CUDA build exists for macOS"),)


def _on_mac(context: str, flags: frozenset[str]) -> bool:
    return "windows" not in flags and any(find_word(context, w) != -1 for w in MAC)


# Pieces several app words hold: where one is absent, so is every word that holds it (one scan for five Forge words)
_GUARDS = ("comfy", "custom_nodes", "forge", "webui", "train", "invoke")
_HELD = {w: next((g for g in _GUARDS if g in w and g != w), None) for _, words in APPS for w in words}


def _shows(context: str, look: Present | None) -> str | None:
    """``app_of``, through ``look`` where given (the diagnosis's own look-ups in ``context``: what its rule words
    already got, and a long context's shape), a word skipped where a piece it holds is absent."""
    known: dict[str, bool] = {} if look is None else look.known
    has: Callable[[str], bool] = context.__contains__ if look is None else look
    for app, words in APPS:
        for w in words:
            got = known.get(w)
            if got is None:
                held = _HELD[w]
                if held is not None:
                    h = known.get(held)
                    if h is None:
                        h = known[held] = has(held)
                    if not h:
                        known[w] = False
                        continue
                got = known[w] = has(w)
            if got:
                return app
    return None


@lru_cache(maxsize=64)  # asked per diagnosis by app_fixes and step_fixes, each scan a whole context per word
def app_of(context: str) -> str | None:
    """The app a lower-cased text (``\\`` read as ``/``) shows, or None.

    >>> app_of('file "c:/comfyui_windows_portable/comfyui/execution.py", line 327, in execute')
    'ComfyUI'
    >>> app_of("06:13:46-025320 error    exception: input type ... | sd | info | launch | starting sd.next") is None
    False
    >>> app_of("plain traceback") is None
    True
    """
    return _shows(context, None)


# Steps an app runs itself, by the error signature they raise: when a paste shows no app and no program of its own
# around the error, the app that runs the step is a likely source, and its switch for that step is among the fixes
# (issue 40, point 6). Each entry: (words of the text that pick the app, the text is the app's own, fixes). ComfyUI
# calls ipex.optimize on every model it loads to an Intel GPU (comfy/model_management.py), which refuses a model
# that lowvram loaded partly; IPEX's words are IPEX's, so a program of the user's own calling it gets no app switch.
# The other texts are the apps' own messages (below), so any paste holding them came from the app.
_STEPS: dict[str, tuple[tuple[str, bool, tuple[tuple[str, str], ...]], ...]] = {
    "mixed.ipex_optimize": (("", False, (
        ("If ComfyUI raised this (it runs ipex.optimize on each model it loads): skip that step",
         "python main.py --disable-ipex-optimize"),
        ("Or in ComfyUI keep whole models on the GPU (no partial loading)",
         "python main.py --highvram  # or --gpu-only"))),),
    "app.webui_gpu_test": (
        ("torch/cuda", True, (
            ("Forge: reinstall its torch (--skip-torch-cuda-test only skips the check; generation then fails "
             "or runs on the CPU)", "set COMMANDLINE_ARGS=--reinstall-torch  # webui-user.bat, then run it"),)),
        ("", True, (
            ("AUTOMATIC1111: reinstall its torch (--skip-torch-cuda-test only skips the check; generation then "
             "fails or runs on the CPU)", "set COMMANDLINE_ARGS=--reinstall-torch  # webui-user.bat, then run it"),
            ("AUTOMATIC1111: or run on the CPU on purpose",
             "set COMMANDLINE_ARGS=--skip-torch-cuda-test --use-cpu all --no-half"))),
    ),
    "app.nan_check": (
        ("produced in unet", True, (
            ("SD.Next / AUTOMATIC1111: run the UNet in full precision, or upcast only where it overflows",
             "--no-half  # or --upcast-sampling; SD.Next: Settings > Compute Settings"),
            ("SD.Next / AUTOMATIC1111: the VAE in full precision too", "--no-half-vae"))),
        ("", True, (
            ("SD.Next / AUTOMATIC1111: run the VAE in full precision",
             "--no-half-vae  # SD.Next: Settings > Compute Settings > no-half VAE"),)),
    ),
}
_PRECISION = (_DT, _IW, _UD)
_REDUCED = frozenset({"half", "bf16", "fp8"})


def _own_program(context: str) -> bool:
    """Whether a frame of the traceback is in a program's own file (not a library installed in site-packages):
    then that program, not an app, ran the step."""
    p = context.find('file "')
    for _ in range(200):
        if p == -1:
            return False
        end = context.find('"', p + 6)
        path = context[p + 6: end if end != -1 else p + 300]
        if "site-packages" not in path and "/lib/python" not in path and "dist-packages" not in path:
            return True
        p = context.find('file "', p + 6)
    return False


def step_fixes(signature: str, context: str, look: Present | None = None) -> tuple[tuple[str, str], ...]:
    """The switch of the app that runs the failing step itself, for a paste that shows no app (a bare message,
    or frames inside libraries only, or, for the apps' own texts, any frames).

    >>> bare = "runtimeerror: the model is mixed with different device type"
    >>> [code for _, code in step_fixes("mixed.ipex_optimize", bare)]
    ['python main.py --disable-ipex-optimize', 'python main.py --highvram  # or --gpu-only']
    >>> step_fixes("mixed.ipex_optimize", 'file "/home/me/app/load.py", line 3, in load')
    ()
    >>> [code for _, code in step_fixes("app.nan_check", "a tensor with all nans was produced in vae.")]
    ['--no-half-vae  # SD.Next: Settings > Compute Settings > no-half VAE']
    """
    steps = _STEPS.get(signature, ())  # (most signatures have none: no app asked for)
    if not steps or (app_of(context) if look is None else _shows(context, look)) is not None:
        return ()
    for words, own_text, fixes in steps:
        if words in context:
            return fixes if own_text or not _own_program(context) else ()
    return ()


def app_fixes(category: str, context: str, flags: frozenset[str] = frozenset(), look: Present | None = None
              ) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """The app shown in ``context`` and its own fixes for ``category`` (none when no app shows). ``look``: the
    diagnosis's own look-ups in ``context`` (``present.Present``), asked and filled.

    An app's precision flags are offered only where they can be the cause: they choose between float16,
    bfloat16 and float32, so an error between float32 and float64 alone (a plugin's own float64 tensor) gets none.
    """
    app = app_of(context) if look is None else _shows(context, look)
    if app is None:
        return None, ()
    if category in _PRECISION and "fp64" in flags and not flags & _REDUCED or "code_dtype" in flags \
            or "to_numpy" in flags:  # (and a GPU tensor the code hands to numpy: its own conversion is the fix)
        return app, ()  # (numpy's missing bfloat16, an Intel GPU's missing float64: the code's own cast is the fix)
    if category == _NA and _on_mac(context, flags):
        return app, _MAC_FIXES.get(app, _WEB_MAC)
    if category == _NA and app == "ComfyUI" and ("xpu" in flags or any(find_word(context, w) != -1 for w in _INTEL)):
        return app, _COMFY_XPU_NA
    if category == _NA and app == "ComfyUI" and "windows" not in flags and 'file "/' in context:
        return app, _COMFY_POSIX_NA
    for (name, cats), fixes in _FIXES.items():
        if name == app and category in cats:
            return app, fixes
    return app, ()


# --- texts an app raises itself around a step it runs (issue 40, point 6), with their plain-PyTorch causes -------
# These messages are the apps' own words, so a paste of one came from that app even when nothing else in it names
# the app: step_fixes then adds the app's own switch for that step. Read from the apps' code (2026-11): the webui's
# launcher refuses to start when torch cannot use the GPU (AUTOMATIC1111 modules/launch_utils.py "Torch is not able
# to use GPU; add --skip-torch-cuda-test"; Forge dfdcbab words it "Your device does not support the current version
# of Torch/CUDA!"), and the NaN check SD.Next 058a7f0 and AUTOMATIC1111 run after the UNet and the VAE
# (modules/devices.py test_for_nans: "A tensor with all NaNs was produced in VAE."; Forge's check is a no-op).
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

"""explain, issue 40 point 6: texts raised by a step an app runs itself get that app's switch, even in a bare paste.

The texts are the apps' own messages, read from their code (``_explain/apps.py`` names the files): the webui
launcher's GPU check (AUTOMATIC1111's wording and Forge's), the NaN check SD.Next and AUTOMATIC1111 run after the
UNet and the VAE, and IPEX's refusal inside ComfyUI's ``ipex.optimize`` step. A plugin's own tensor never gets an
app-wide flag.
"""

from __future__ import annotations

from explain.test_issue41_quoting import codes, top

NAN_VAE = ("modules.devices.NansException: A tensor with all NaNs was produced in VAE. This could be because "
           "there's not enough precision to represent the picture. Try adding --no-half-vae commandline argument "
           "to fix this. Use --disable-nan-check commandline argument to disable this check.")
NAN_UNET = ("NansException: A tensor with all NaNs was produced in Unet. This could be either because there's not "
            "enough precision to represent the picture, or because your video card does not support half type. "
            "Use --disable-nan-check commandline argument to disable this check.")
A1111_GPU = ("RuntimeError: Torch is not able to use GPU; add --skip-torch-cuda-test to COMMANDLINE_ARGS variable "
             "to disable this check")
FORGE_GPU = ("RuntimeError: Your device does not support the current version of Torch/CUDA! Consider download "
             "another version: \nhttps://github.com/lllyasviel/stable-diffusion-webui-forge/releases/tag/latest")


def test_nan_check_of_the_vae_gets_no_half_vae_beside_the_plain_fix() -> None:
    d = top(NAN_VAE)
    assert (d.category, d.signature) == ("dtype_mismatch", "app.nan_check")
    assert "After the VAE ran" in d.what_happened
    got = codes(d)
    assert got[0].startswith("pipe.vae.to(torch.float32)")  # the plain-PyTorch fix first
    assert any(c.startswith("--no-half-vae") for c in got[1:])
    assert not any(c.startswith("--no-half ") for c in got)  # the UNet's switch is not the VAE's


def test_nan_check_of_the_unet_gets_no_half_or_upcast() -> None:
    d = top(NAN_UNET)
    assert "After the Unet ran" in d.what_happened
    assert any(c.startswith("--no-half  # or --upcast-sampling") for c in codes(d))


def test_nan_check_inside_an_sdnext_log_gets_its_settings() -> None:
    log = ("11:02:45-553810 ERROR    Processing: args={'prompt': 'x'} | sd | sdnext\n"
           '  File "/home/u/sdnext/modules/devices.py", line 709, in test_for_nans\n' + NAN_VAE)
    got = codes(top(log))
    assert got[0].startswith("Settings > Compute Settings: no-half, no-half VAE")


def test_webui_gpu_test_in_a_bare_paste_names_each_launchers_switch() -> None:
    a1111 = top(A1111_GPU)
    assert (a1111.category, a1111.signature) == ("no_accelerator", "app.webui_gpu_test")
    assert any("--reinstall-torch" in c for c in codes(a1111))
    assert "venv" in a1111.likely_causes[0]
    forge = top(FORGE_GPU)
    assert forge.signature == "app.webui_gpu_test"
    titles = [t for t, _ in forge.fixes]
    assert any(t.startswith("Forge: reinstall its torch") for t in titles), titles
    assert not any(t.startswith("AUTOMATIC1111") for t in titles)


def test_app_step_texts_are_the_apps_own_so_frames_do_not_hide_the_switch() -> None:
    # a webui installed in a folder named nothing like the app: the frames are the app's, not a program's own
    framed = ('  File "D:\\ai\\sd\\modules\\devices.py", line 709, in test_for_nans\n'
              "    raise NansException(message)\n" + NAN_VAE)
    assert any(c.startswith("--no-half-vae") for c in codes(top(framed)))


def test_ipex_step_switch_stays_only_where_comfyui_can_have_run_it() -> None:
    bare = top("RuntimeError: The model is mixed with different device type")
    assert "python main.py --disable-ipex-optimize" in codes(bare)
    own = ('  File "/home/me/app/serve.py", line 40, in load\n    model = ipex.optimize(model.eval())\n'
           "RuntimeError: The model is mixed with different device type")
    assert not any("python main.py" in c for c in codes(top(own)))


def test_a_plugins_own_float64_tensor_in_an_sdnext_log_gets_no_app_precision_flag() -> None:
    log = ('  File "/home/u/sdnext/extensions/sd-color-fix/scripts/color.py", line 31, in postprocess\n'
           "    out = image @ self.matrix\n"
           "RuntimeError: expected m1 and m2 to have the same dtype, but got: float != double")
    d = top(log)
    got = codes(d)
    assert not any("no-half" in c or "no_half" in c for c in got), got
    assert any("extensions/sd-color-fix/scripts/color.py:31" in c for c in d.likely_causes), d.likely_causes

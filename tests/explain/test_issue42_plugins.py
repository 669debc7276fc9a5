"""Issue 42 point 5: explain names the plugin an app log's traceback runs through (a ComfyUI custom node, an
AUTOMATIC1111 / Forge / SD.Next extension, built-in extension or script) in its update and disable steps, whatever
the category; and the families session 10's held-out collection showed (a ComfyUI desktop log on a Mac, a Python
banner's "AMD64") are read as what they are."""

from __future__ import annotations

import pytest

from torchdoctor._explain.api import Diagnosis, explain
from torchdoctor._explain.context import find_word
from torchdoctor._explain.plugins import plugin_fields


def top(text: str) -> Diagnosis:
    found = explain(text)
    assert found, text
    return found[0]


def codes(d: Diagnosis) -> list[str]:
    return [c for _, c in d.fixes]


def titles(d: Diagnosis) -> str:
    return "\n".join(t for t, _ in d.fixes)


DEVICE = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
MPS64 = ("TypeError: Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64. "
         "Please use float32 instead.")
DESERIALIZE = ("RuntimeError: Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is "
               "False. If you are running on a CPU-only machine, please use torch.load with "
               "map_location=torch.device('cpu') to map your storages to the CPU.")
XFORMERS = "NotImplementedError: No operator found for `memory_efficient_attention_forward` with inputs:"
HALF_BIAS = "RuntimeError: Input type (c10::Half) and bias type (float) should be the same"


@pytest.mark.parametrize("frame,message,plugin,update,disable", [
    # ComfyUI custom node, Windows portable paths, a device error
    ('  File "D:\\ComfyUI_windows_portable\\ComfyUI\\custom_nodes\\ComfyUI-IPAdapter-plus\\utils.py", line 177, in '
     'encode', DEVICE, "ComfyUI-IPAdapter-plus", "git -C custom_nodes/ComfyUI-IPAdapter-plus pull",
     "mv custom_nodes/ComfyUI-IPAdapter-plus custom_nodes/ComfyUI-IPAdapter-plus.disabled"),
    # an AUTOMATIC1111 extension (its scripts/ folder is the extension's), a dtype error
    ('  File "/home/u/stable-diffusion-webui/extensions/sd-webui-controlnet/scripts/controlnet.py", line 900, in '
     'process', HALF_BIAS, "sd-webui-controlnet", "git -C extensions/sd-webui-controlnet pull",
     'config.json: "disabled_extensions": ["sd-webui-controlnet"]'),
    # an SD.Next extension on Windows, torch.load of a CUDA checkpoint
    ('  File "C:\\sdnext\\extensions\\sd-webui-reactor\\scripts\\reactor_swapper.py", line 120, in load',
     DESERIALIZE, "sd-webui-reactor", "git -C extensions/sd-webui-reactor pull",
     'config.json: "disabled_extensions": ["sd-webui-reactor"]'),
    # a Forge built-in extension ships with the app: updating it is updating the app
    ('  File "C:\\forge\\extensions-builtin\\sd_forge_controlnet\\scripts\\controlnet.py", line 400, in process',
     XFORMERS, "sd_forge_controlnet", "git -C . pull", 'config.json: "disabled_extensions": ["sd_forge_controlnet"]'),
    # a web UI's own script (scripts/ at the web UI's root), on a Mac
    ('  File "/Users/u/stable-diffusion-webui/modules/scripts.py", line 700, in run\n'
     '  File "/Users/u/stable-diffusion-webui/scripts/xyz_grid.py", line 800, in run', MPS64, "xyz_grid.py",
     "git -C . pull", "Script: None  # the Script menu under the prompt"),
])
def test_the_plugin_is_named_in_its_update_and_disable_steps(frame: str, message: str, plugin: str, update: str,
                                                            disable: str) -> None:
    d = top("Traceback (most recent call last):\n" + frame + "\n    x = f(x)\n" + message)
    got = codes(d)
    at = [next((i for i, c in enumerate(got) if c.split("  #")[0] == want.split("  #")[0]), -1)
          for want in (update, disable)]
    assert -1 not in at and at[0] < at[1], got
    assert plugin in titles(d)
    assert not any("<node>" in c or "<name>" in c for c in got), got
    assert any(plugin.replace(".py", "") in e for e in d.evidence)  # the frame, as the log wrote it


def test_the_innermost_plugin_frame_wins() -> None:
    text = ('  File "/home/u/ComfyUI/custom_nodes/ComfyUI-Impact-Pack/modules/impact/sample.py", line 10, in s\n'
            '  File "/home/u/ComfyUI/custom_nodes/ComfyUI-Advanced-ControlNet/adv_control/utils.py", line 55, in f\n'
            + DEVICE)
    got = codes(top(text))
    assert "git -C custom_nodes/ComfyUI-Advanced-ControlNet pull" in got
    assert not any("ComfyUI-Impact-Pack" in c for c in got)


def test_a_scripts_folder_outside_a_web_ui_is_no_plugin() -> None:
    """A project's own scripts/ folder, a package's scripts/ and kohya's sd-scripts/ are not web UI scripts."""
    for frame in ('  File "/home/u/proj/scripts/train.py", line 3, in main',
                  '  File "/venv/lib/python3.10/site-packages/pkg/scripts/run.py", line 3, in main\n'
                  '  File "/home/u/stable-diffusion-webui/modules/processing.py", line 1, in p',
                  '  File "/home/u/kohya_ss/sd-scripts/sdxl_train_network.py", line 185, in <module>'):
        assert "plugin" not in plugin_fields(frame + "\n" + DEVICE), frame
        assert not any(c.startswith("Script: ") for c in codes(top(frame + "\n" + DEVICE)))


def test_comfyui_desktop_on_a_mac_is_not_told_to_install_cuda() -> None:
    """The ComfyUI desktop app's bundle path is a Mac: no "install a CUDA build", no python_embeded (collection 8:
    Comfy-Org/ComfyUI#6783, LykosAI/StabilityMatrix#1283)."""
    log = ("# ComfyUI Error Report\n## Error Details\n- **Node Type:** JanusImageGeneration\n"
           "- **Exception Type:** AssertionError\n- **Exception Message:** Torch not compiled with CUDA enabled\n"
           "## Stack Trace\n"
           '  File "/Applications/ComfyUI.app/Contents/Resources/ComfyUI/execution.py", line 327, in execute\n')
    d = top(log)
    assert d.category == "no_accelerator"
    got = codes(d)
    assert not any("python_embeded" in c or "whl/cu" in c or "uninstall -y torch" in c for c in got), got
    assert any("torch.backends.mps.is_available()" in c for c in got)
    assert any("Mac" in c for c in d.likely_causes)
    # the same report on Windows keeps the portable build's CUDA install
    win = log.replace("/Applications/ComfyUI.app/Contents/Resources/ComfyUI", "C:\\ComfyUI_windows_portable\\ComfyUI")
    assert any("python_embeded" in c for c in codes(top(win)))


def test_a_python_banner_amd64_is_no_amd_gpu() -> None:
    """"[MSC v.1929 64 bit (AMD64)]" in a ComfyUI start-up banner is the CPU architecture, not DirectML (collection
    8: LarryJane491/Lora-Training-in-Comfy#56); an AMD card named in the text still is."""
    banner = ("** Platform: Windows\n** Python version: 3.10.11 (tags/v3.10.11:7d4cc5a, Apr  5 2023, 00:38:17) "
              "[MSC v.1929 64 bit (AMD64)]\n"
              '  File "C:\\ComfyUI\\venv\\Lib\\site-packages\\torch\\cuda\\__init__.py", line 289, in _lazy_init\n'
              "AssertionError: Torch not compiled with CUDA enabled")
    assert "DirectML" not in top(banner).likely_causes[0]
    card = banner.replace("** Platform: Windows", "** Platform: Windows, AMD Radeon RX 7900 XTX (directml)")
    assert "DirectML" in top(card).likely_causes[0]


def test_whole_token_words() -> None:
    assert find_word("python 3.10 (amd64)", r"\bamd\b") == -1 and find_word("an amd card", r"\bamd\b") == 3
    assert find_word("timestamps", r"\bmps\b") == -1 and find_word("device='mps:0'", r"\bmps\b") == 8
    assert find_word("plain substring", "sub") == 6


def test_a_doubled_separator_still_names_the_node() -> None:
    """A repr'd or JSON-escaped Windows path left as the log wrote it (two backslashes between folders)."""
    got = plugin_fields("['  File \"D:\\\\ComfyUI\\\\custom_nodes\\\\ComfyUI-Foo\\\\sub\\\\nodes.py\", line 5, in f']")
    assert got["plugin"] == "ComfyUI-Foo" and got["plugin_at"] == "custom_nodes/ComfyUI-Foo/sub/nodes.py:5"
    assert got["node_dir"] == "custom_nodes/ComfyUI-Foo"


def test_comfyui_on_linux_is_not_told_to_use_the_windows_portable_python() -> None:
    log = ("!!! Exception during processing !!! Torch not compiled with CUDA enabled\nTraceback (most recent call "
           'last):\n  File "/home/u/ComfyUI/execution.py", line 327, in execute\n'
           "AssertionError: Torch not compiled with CUDA enabled")
    got = codes(top(log))
    assert not any("python_embeded" in c for c in got), got
    assert any(c.startswith("python -m pip install --force-reinstall torch") and "whl/cu" in c for c in got)

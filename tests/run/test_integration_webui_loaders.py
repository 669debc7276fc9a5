"""The webui extension (``integrations/sdnext/torchdoctor-check``) loaded and checking as Forge and SD.Next run it
(issue 40 point 7).

Forge's mechanisms, re-created in a few lines from reading Forge dfdcbab (``modules/scripts.py`` ``list_scripts`` /
``load_scripts``, ``modules/script_loading.py``, ``modules/script_callbacks.py``, ``modules/sd_models.py``
``forge_model_reload``, ``backend/diffusion_engine/base.py``, ``backend/patcher/base.py``); no Forge code is copied:

- the loader lists ``extensions/<ext>/scripts/*.py``, puts the extension's folder first on ``sys.path`` while a file
  loads, imports each file as a module named after its file name (``spec_from_file_location(basename, path)``), and
  registers every ``Script`` subclass the module defines; the runner keeps the scripts whose ``show`` answers
  ``AlwaysVisible`` and calls ``postprocess(p, processed, *args)`` after a generation, reporting a script's error;
- ``on_model_loaded(callback, *, name=None)``; ``model_loaded_callback(sd_model)`` calls each callback with the
  engine right after a model loads, reporting a callback's error;
- the engine is not a module: ``forge_objects`` holds the UNet, CLIP and VAE as model patchers (``model``,
  ``load_device``, ``offload_device``, ``current_device``), which rest on the offload device after loading and are
  moved to the load device by memory management for sampling.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from torchdoctor._virtual.session import virtual_devices

PACK = Path(__file__).resolve().parents[2] / "integrations" / "sdnext" / "torchdoctor-check"


class _Forge:
    """Forge's ``modules`` as an extension sees them, with its loader and runner."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
        self.callbacks: list[tuple[Any, str | None]] = []
        self.errors: list[str] = []
        self.scripts: list[type] = []
        pkg = types.ModuleType("modules")
        cb = types.ModuleType("modules.script_callbacks")
        cb.on_model_loaded = self._on_model_loaded  # type: ignore[attr-defined]
        scripts = types.ModuleType("modules.scripts")

        class Script:
            def show(self, is_img2img: bool) -> Any:
                return True

            def postprocess(self, p: Any, processed: Any, *args: Any) -> None:
                pass

        self.Script, self.AlwaysVisible = Script, object()
        scripts.Script, scripts.AlwaysVisible = Script, self.AlwaysVisible  # type: ignore[attr-defined]
        shared = types.ModuleType("modules.shared")
        shared.sd_model = None  # type: ignore[attr-defined]
        devices = types.ModuleType("modules.devices")
        devices.device = torch.device(device)  # type: ignore[attr-defined]
        devices.cpu = torch.device("cpu")  # type: ignore[attr-defined]
        self.shared = shared
        for name, mod in (("modules", pkg), ("modules.script_callbacks", cb), ("modules.scripts", scripts),
                          ("modules.shared", shared), ("modules.devices", devices)):
            monkeypatch.setitem(sys.modules, name, mod)
            if "." in name:
                setattr(pkg, name.split(".")[1], mod)

    def _on_model_loaded(self, callback: Any, *, name: str | None = None) -> None:
        self.callbacks.append((callback, name))

    def load_scripts(self, extensions_dir: Path) -> None:
        for ext in sorted(os.listdir(extensions_dir)):
            folder = extensions_dir / ext / "scripts"
            if not folder.is_dir():
                continue
            for filename in sorted(os.listdir(folder)):
                path = folder / filename
                if path.suffix.lower() != ".py" or not path.is_file():
                    continue
                saved = sys.path
                try:
                    sys.path = [str(extensions_dir / ext)] + sys.path
                    spec = importlib.util.spec_from_file_location(os.path.basename(path), path)
                    assert spec is not None and spec.loader is not None
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    self.scripts += [c for c in module.__dict__.values()
                                     if inspect.isclass(c) and issubclass(c, self.Script) and c is not self.Script]
                except Exception as exc:  # the loader reports a broken script and goes on
                    self.errors.append(f"Error loading script: {filename}: {exc}")
                finally:
                    sys.path = saved

    def model_loaded(self, engine: Any) -> None:
        self.shared.sd_model = engine  # type: ignore[attr-defined]
        for callback, _ in self.callbacks:
            try:
                callback(engine)
            except Exception as exc:
                self.errors.append(f"model_loaded_callback: {exc}")

    def generation_done(self, p: Any) -> None:
        for cls in self.scripts:
            script = cls()
            if script.show(False) is not self.AlwaysVisible:
                continue
            try:
                script.postprocess(p, types.SimpleNamespace(images=[]))
            except Exception as exc:
                self.errors.append(f"Error calling: postprocess: {exc}")


class _Patcher:  # Forge's model patcher: the model at rest on its offload device until memory management loads it
    def __init__(self, model: torch.nn.Module, load: str) -> None:
        self.model, self.load_device, self.offload_device = model, torch.device(load), torch.device("cpu")
        self.current_device = self.offload_device

    def load(self) -> None:
        self.model.to(self.load_device)
        self.current_device = self.load_device


class _Unet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.diffusion_model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))


def _engine(load: str) -> Any:
    objects = types.SimpleNamespace(unet=_Patcher(_Unet(), load), clip=_Patcher(torch.nn.Linear(4, 4), load),
                                    vae=_Patcher(torch.nn.Conv2d(4, 3, 1), load), clipvision=None)
    return types.SimpleNamespace(forge_objects=objects, is_sdxl=True, model_config=None)


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "torchdoctor.webui"]


def test_the_pack_loads_through_forges_loader_and_checks_after_load_and_generation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    extensions = tmp_path / "extensions"
    shutil.copytree(PACK, extensions / "torchdoctor-check")
    (extensions / "sd-webui-other" / "scripts").mkdir(parents=True)  # a neighbour without our script
    (extensions / "sd-webui-other" / "scripts" / "other.py").write_text("X = 1\n")
    forge = _Forge(monkeypatch, "cuda:0")
    forge.load_scripts(extensions)
    assert forge.errors == []
    assert [c.__name__ for c in forge.scripts] == ["TorchdoctorCheck"]
    assert len(forge.callbacks) == 1  # registered at import, as Forge's on_model_loaded takes it
    caplog.set_level(logging.INFO)
    with virtual_devices("cuda:0"):
        engine = _engine("cuda:0")
        forge.model_loaded(engine)  # at rest on the offload device: by design, quiet
        assert _said(caplog) == [] and forge.errors == []
        engine.forge_objects.unet.load()  # memory management loads the UNet for sampling
        p = types.SimpleNamespace(sd_model=engine)
        forge.generation_done(p)
        assert _said(caplog) == [] and forge.errors == []  # loaded whole on its load device: quiet
        # a LoRA patch that put a weight back as a CPU copy while the UNet is loaded on the GPU
        unet = engine.forge_objects.unet.model
        unet.diffusion_model[1].weight = torch.nn.Parameter(torch.zeros(8, 8), requires_grad=False)
        forge.generation_done(p)
    said = _said(caplog)
    assert forge.errors == []
    assert len(said) == 1 and said[0].startswith("torchdoctor: after generation, "), said
    assert "diffusion_model.1.weight" in said[0] and "cuda:0" in said[0]


def test_a_broken_torchdoctor_never_breaks_forges_callbacks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    extensions = tmp_path / "extensions"
    shutil.copytree(PACK, extensions / "torchdoctor-check")
    forge = _Forge(monkeypatch, "cuda:0")
    forge.load_scripts(extensions)
    import torchdoctor

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("scan failed inside")

    monkeypatch.setattr(torchdoctor, "scan", refuse)
    forge.model_loaded(_engine("cpu"))
    forge.generation_done(types.SimpleNamespace(sd_model=None))
    assert forge.errors == [] and _said(caplog) == []


# --- SD.Next (058a7f0): its loader and the moment after a generation in its default LoRA mode ---------------------
# ``modules/script_loading.py`` imports a script like Forge but captures what it prints (except for a few trusted
# folders); ``modules/processing.py`` calls the scripts' ``postprocess`` after ``processing_diffusers`` has ended
# with ``extra_networks.deactivate(p)``, which in the default options (``lora_force_reload`` off) unloads nothing:
# with ``lora_fuse_native`` on (the default) the LoRA stays fused in the weights and ``network_weights_backup`` is
# ``True``; with it off the module keeps ``network_weights_backup`` as a CPU clone of the weight beside it.


def _sdnext_load(path: Path) -> Any:
    import contextlib
    import io

    spec = importlib.util.spec_from_file_location(os.path.basename(path), path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with contextlib.redirect_stdout(io.StringIO()):
        spec.loader.exec_module(module)
    return module


def _sdnext_generate(pipe: torch.nn.Module, fuse_native: bool) -> None:
    """A LoRA applied to the UNet's first layer the way SD.Next's default deactivate leaves it."""
    layer = pipe.unet[0]  # type: ignore[index]
    if fuse_native:
        layer.network_weights_backup = True
    else:
        layer.network_weights_backup = layer.weight.detach().clone().to("cpu")
    with torch.no_grad():
        layer.weight.add_(0.01)  # the LoRA's delta merged in place


@pytest.mark.parametrize("fuse_native", [True, False], ids=["fused-default", "backup"])
def test_sdnext_after_a_generation_with_lora_still_applied_is_quiet_and_a_real_leftover_is_named(
        fuse_native: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    forge = _Forge(monkeypatch, "cuda:0")  # SD.Next's modules offer the same names to an extension
    script = _sdnext_load(PACK / "scripts" / "torchdoctor_check.py")
    (on_loaded, _), = forge.callbacks
    caplog.set_level(logging.INFO)
    with virtual_devices("cuda:0"):
        pipe = torch.nn.ModuleDict({"unet": torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)),
                                    "vae": torch.nn.Conv2d(4, 3, 1)}).to("cuda:0")
        on_loaded(pipe)
        _sdnext_generate(pipe, fuse_native)
        check = script.TorchdoctorCheck()
        check.postprocess(types.SimpleNamespace(sd_model=pipe), None)
        assert _said(caplog) == []  # the LoRA state SD.Next keeps on purpose is not a problem
        pipe["vae"].bias = torch.nn.Parameter(torch.zeros(3))  # a real leftover: a CPU bias in the VAE
        check.postprocess(types.SimpleNamespace(sd_model=pipe), None)
    said = _said(caplog)
    assert len(said) == 1 and said[0].startswith("torchdoctor: after generation, ") and "vae.bias" in said[0], said

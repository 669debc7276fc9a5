"""The one-step integrations under ``integrations/``, loaded as the apps load them, on re-created mechanisms:
ComfyUI's custom-node loader (a package in ``custom_nodes/`` with ``NODE_CLASS_MAPPINGS``), its ModelPatcher (a MODEL
holding the module, ``load_device``, ``offload_device``; the module's ``device`` and ``model_lowvram``; a config that
answers None for unknown attributes) and its executor's logging; the webui's ``modules`` API (``script_callbacks.
on_model_loaded``, ``scripts.Script.postprocess``, ``shared``, ``devices``). No app code is copied."""

from __future__ import annotations

import importlib.util
import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from torchdoctor._virtual.session import virtual_devices

ROOT = Path(__file__).resolve().parents[2] / "integrations"


def _load_comfy_pack(monkeypatch: pytest.MonkeyPatch) -> Any:
    """As ComfyUI's loader does: the folder imported as a package by its path."""
    folder = ROOT / "comfyui" / "torchdoctor_nodes"
    spec = importlib.util.spec_from_file_location("torchdoctor_nodes", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "torchdoctor_nodes", module)
    monkeypatch.delitem(sys.modules, "torchdoctor_nodes.check", raising=False)
    spec.loader.exec_module(module)
    check = sys.modules["torchdoctor_nodes.check"]
    monkeypatch.setattr(module, "check", check, raising=False)
    (installed,) = check._INSTALLED  # loading the pack installed the explainer on the root logger
    assert installed in logging.getLogger().handlers
    logging.getLogger().removeHandler(installed)  # each test installs its own where it wants it
    monkeypatch.setattr(check, "_INSTALLED", [])
    return module


class _Config:  # answers None for unknown attributes, as ComfyUI's model configs do
    def __init__(self) -> None:
        self.unet_config = {"in_channels": 4}

    def __getattr__(self, name: str) -> None:
        return None


class _BaseModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model_config = _Config()
        self.diffusion_model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        self.device = torch.device("cpu")
        self.model_lowvram = False


class _Patcher:
    def __init__(self, model: torch.nn.Module, load: str, offload: str = "cpu") -> None:
        self.model, self.load_device, self.offload_device = model, torch.device(load), torch.device(offload)

    def load(self) -> None:  # what the app's model management does before sampling
        self.model.to(self.load_device)
        self.model.device = self.load_device


def test_comfyui_placement_check_node_finds_a_weight_left_on_the_offload_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pack = _load_comfy_pack(monkeypatch)
    node_cls = pack.NODE_CLASS_MAPPINGS["TorchdoctorPlacementCheck"]
    assert node_cls.INPUT_TYPES() == {"required": {"model": ("MODEL",)}}
    assert node_cls.RETURN_TYPES == ("MODEL", "STRING") and callable(getattr(node_cls(), node_cls.FUNCTION))
    with virtual_devices("cuda:0") as sim:
        patcher = _Patcher(_BaseModel(), "cuda:0")
        patcher.load()
        out, text = node_cls().check(patcher)
        assert out is patcher and "on its load device cuda:0" in text
        assert pack.check.check_model(patcher)[1]  # ok
        # a plugin swaps a weight for a copy on the offload device (as a set_attr helper would)
        patcher.model.diffusion_model[1].weight = torch.nn.Parameter(torch.zeros(8, 8), requires_grad=False)
        out, text = node_cls().check(patcher)
        assert "device diffusion_model.1.weight  f32[8,8]@cpu is on cpu, expected cuda:0" in text
        assert not pack.check.check_model(patcher)[1]
        # partial loading keeps weights on the offload device by design (judged by the policy's mechanisms: layers
        # that cast their weights per call), so the device is not demanded of every tensor
        patcher.model.model_lowvram = True
        _, text = node_cls().check(patcher)
        assert "partially loaded on cuda:0" in text
    assert sim.ok


def test_comfyui_log_explainer_explains_a_caught_node_error_once(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    pack = _load_comfy_pack(monkeypatch)
    logger = logging.getLogger("test.comfy.execution")
    handler = pack.check.install_log_explainer(logger)
    try:
        layer = torch.nn.Linear(4, 4).to(torch.bfloat16)
        caplog.set_level(logging.INFO)
        for _ in range(2):
            try:
                layer(torch.ones(1, 4))
            except Exception:  # the executor catches a node's error and logs it
                logger.error("!!! Exception during processing !!!", exc_info=True)
        # a message logged without its exception: nothing shows ComfyUI, so the first fix is code
        logger.error("RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) "
                     "should be the same")
    finally:
        logger.removeHandler(handler)
    said = [r.getMessage() for r in caplog.records if r.name == "torchdoctor.comfyui"]
    assert len(said) == 2 and "dtype" in said[0]
    # the app's own flag is printed as it is; a code fix says that nothing ran it (explain reads text only)
    assert "\n  fix: python main.py --force-fp32" in said[0]
    assert "\n  fix [unproven (from the error text only)]: " in said[1]


def _webui_modules(monkeypatch: pytest.MonkeyPatch, device: str) -> dict[str, Any]:
    callbacks: dict[str, Any] = {"model_loaded": []}
    pkg = types.ModuleType("modules")
    script_callbacks = types.ModuleType("modules.script_callbacks")
    script_callbacks.on_model_loaded = callbacks["model_loaded"].append  # type: ignore[attr-defined]
    scripts = types.ModuleType("modules.scripts")

    class Script:
        pass

    scripts.Script, scripts.AlwaysVisible = Script, object()  # type: ignore[attr-defined]
    shared = types.ModuleType("modules.shared")
    shared.sd_model = None  # type: ignore[attr-defined]
    devices = types.ModuleType("modules.devices")
    devices.device = torch.device(device)  # type: ignore[attr-defined]
    for name, mod in (("modules", pkg), ("modules.script_callbacks", script_callbacks), ("modules.scripts", scripts),
                      ("modules.shared", shared), ("modules.devices", devices)):
        monkeypatch.setitem(sys.modules, name, mod)
        if "." in name:
            setattr(pkg, name.split(".")[1], mod)
    return {"callbacks": callbacks, "shared": shared}


def test_webui_extension_checks_after_model_load_and_after_a_generation(monkeypatch: pytest.MonkeyPatch,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    app = _webui_modules(monkeypatch, "cpu")
    path = ROOT / "sdnext" / "torchdoctor-check" / "scripts" / "torchdoctor_check.py"
    spec = importlib.util.spec_from_file_location("torchdoctor_check_script", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    (on_loaded,) = app["callbacks"]["model_loaded"]
    caplog.set_level(logging.INFO)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    on_loaded(model)
    assert not [r for r in caplog.records if r.name == "torchdoctor.webui"]  # a correct model: silent
    # a LoRA unload that restores a backup never materialised (a meta placeholder left in the model)
    model[1].weight = torch.nn.Parameter(torch.empty(4, 4, device="meta"), requires_grad=False)
    p = types.SimpleNamespace(sd_model=model)
    extension = script.TorchdoctorCheck()
    assert extension.show(False) is sys.modules["modules.scripts"].AlwaysVisible
    extension.postprocess(p, None)
    said = [r.getMessage() for r in caplog.records if r.name == "torchdoctor.webui"]
    # the extension's own line (94b9501: the check runs on the model as the generation left it)
    assert len(said) == 1 and said[0].startswith("torchdoctor: after generation, ") and "1.weight" in said[0]

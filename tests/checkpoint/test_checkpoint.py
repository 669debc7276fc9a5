"""Checkpoint inspection : files written by the real libraries, read without loading.

Every fixture is written by transformers / diffusers / bitsandbytes / safetensors / torch themselves; no
test ever loads a checkpoint through torchdoctor, and the malicious ones prove that no pickle code runs.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from support.helpers import assert_unchanged
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchdoctor._checkpoint.render import render_checkpoint
from torchdoctor._checkpoint.scan import CheckpointError, role_of, scan_checkpoint
from torchdoctor._cli.checkpoint import scan_path as cli_scan_path
from torchdoctor._cli.common import UsageError
from torchdoctor._cli.main import main
from torchdoctor._checkpoint.torchfile import safe_loads

from support import zoo


def kinds(report) -> list[str]:
    return sorted(p.kind for p in report.problems)


def paths(report) -> list[str]:
    return [t.path for t in report.tensors]


def args(**kw) -> argparse.Namespace:
    base = {"device": None, "dtype": None, "json": False, "plan": False, "limit": 40}
    base.update(kw)
    return argparse.Namespace(**base)


@contextmanager
def saved_on(location: str) -> Iterator[None]:
    """torch.save writes ``location`` as every storage's tag: a cuda:1 file made on CPU."""

    def tagger(obj):
        return location

    torch.serialization.register_package(0, tagger, lambda obj, loc: None)
    try:
        yield
    finally:
        registry = torch.serialization._package_registry
        registry[:] = [entry for entry in registry if entry[1] is not tagger]


# --- fixtures written by the real libraries -------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    return zoo.tiny_llama()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, llama) -> Path:
    d = tmp_path_factory.mktemp("hf") / "tiny-llama"
    llama.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def hf_bin_dir(tmp_path_factory, llama) -> Path:
    """transformers 5 only writes safetensors; a .bin checkpoint is what older transformers wrote: a
    torch.save'd state_dict named pytorch_model.bin next to config.json (it loads with from_pretrained)."""
    d = tmp_path_factory.mktemp("hfbin") / "tiny-llama-bin"
    llama.config.save_pretrained(d)
    torch.save(llama.state_dict(), d / "pytorch_model.bin")
    return d


@pytest.fixture(scope="module")
def sd_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sd") / "tiny-sd"
    zoo.tiny_sd_pipeline().save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def bnb4_state() -> dict[str, torch.Tensor]:
    return dict(zoo.bnb_linear4bit().state_dict())


@pytest.fixture(scope="module")
def bnb8_state() -> dict[str, torch.Tensor]:
    return dict(zoo.bnb_linear8bit().state_dict())


def save_safetensors(state: dict[str, torch.Tensor], path: Path) -> Path:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


# --- safetensors and transformers -----------------------------------------------------------------------------


def test_transformers_safetensors_dir(hf_dir, llama):
    report = assert_unchanged(hf_dir, scan_checkpoint, hf_dir)
    assert report.ok, report.problems
    assert report.extra["layout"] == "transformers"
    assert sorted(paths(report)) == sorted(llama.state_dict())
    by_path = {t.path: t for t in report.tensors}
    w = llama.model.layers[0].mlp.down_proj.weight
    row = by_path["model.layers.0.mlp.down_proj.weight"]
    assert (row.dtype, row.shape, row.device, row.role) == (w.dtype, tuple(w.shape), torch.device("cpu"), "parameter")
    assert row.nbytes == w.nbytes
    assert report.extra["files"][0]["format"] == "safetensors"


def test_single_safetensors_file_metadata_and_dtype_expectation(hf_dir):
    f = hf_dir / "model.safetensors"
    report = scan_checkpoint(f)
    assert report.extra["metadata"]["format"] == "pt"
    assert scan_checkpoint(f, dtype="float32").ok
    bf16 = scan_checkpoint(f, dtype="bf16")
    assert kinds(bf16) == ["dtype"]
    (p,) = bf16.problems
    assert (p.found, p.expected) == ("float32", "bfloat16")
    assert len(p.tensors) == len(report.tensors)
    assert "dtype=torch.bfloat16" in p.message


def test_safetensors_reads_header_only(tmp_path):
    """A sparse 64 MiB file whose data region was never written: scanning it must not read that region."""
    import struct

    header = {"w": {"dtype": "F16", "shape": [32 * 1024 * 1024], "data_offsets": [0, 64 * 1024 * 1024]}}
    raw = json.dumps(header).encode()
    path = tmp_path / "sparse.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + 64 * 1024 * 1024)
    report = scan_checkpoint(path)
    assert [t.compact for t in report.tensors] == ["f16[33554432]@cpu"]
    assert os.stat(path).st_blocks * 512 < 1024 * 1024  # still sparse: nothing was written back either


def test_transformers_bin_dir(hf_bin_dir, llama):
    from transformers import LlamaForCausalLM

    LlamaForCausalLM.from_pretrained(hf_bin_dir)  # the fixture is a checkpoint transformers accepts
    report = assert_unchanged(hf_bin_dir, scan_checkpoint, hf_bin_dir)
    assert report.ok, report.problems
    assert set(paths(report)) == set(llama.state_dict())
    assert report.extra["files"][0]["format"] == "torch-zip"
    assert {t.device for t in report.tensors} == {torch.device("cpu")}


def test_sharded_safetensors_index(tmp_path, llama):
    d = tmp_path / "sharded"
    llama.save_pretrained(d, max_shard_size="100KB")
    index = d / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    for target in (d, index):
        report = scan_checkpoint(target)
        assert report.ok
        assert sorted(paths(report)) == sorted(weight_map)
        assert len(report.extra["files"]) == len(set(weight_map.values())) > 1


def test_sharded_bin_index_via_huggingface_hub(tmp_path, llama):
    from huggingface_hub import save_torch_state_dict

    d = tmp_path / "binshards"
    d.mkdir()
    save_torch_state_dict(dict(llama.state_dict()), d, safe_serialization=False, max_shard_size="100KB")
    report = scan_checkpoint(d)
    weight_map = json.loads((d / "pytorch_model.bin.index.json").read_text())["weight_map"]
    assert sorted(paths(report)) == sorted(weight_map)
    assert {f["format"] for f in report.extra["files"]} == {"torch-zip"}


def test_index_problems(tmp_path, hf_dir):
    d = tmp_path / "idx"
    d.mkdir()
    (d / "model.safetensors").write_bytes((hf_dir / "model.safetensors").read_bytes())
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "model.safetensors", "ghost.weight": "model.safetensors"}})
    )
    report = scan_checkpoint(d)
    assert report.extra["groups"][0]["index_missing"] == ["ghost.weight"]
    assert "model.embed_tokens.weight" in report.extra["groups"][0]["index_extra"]
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00002.safetensors"}}))
    report = scan_checkpoint(d)  # the index is reported, the rest of the directory still read
    (p,) = [p for p in report.problems if p.kind == "unreadable"]
    assert p.path == "model-00002.safetensors" and "missing: listed in model.safetensors.index.json" in p.message
    assert "model.safetensors/model.norm.weight" in paths(report)


# --- diffusers -------------------------------------------------------------------------------------------------


def test_diffusers_pipeline_dir_grouped_per_subfolder(sd_dir):
    report = assert_unchanged(sd_dir, scan_checkpoint, sd_dir)
    assert report.ok, report.problems
    assert report.extra["layout"] == "diffusers"
    groups = {g["group"] for g in report.extra["groups"]}
    assert groups == {"unet", "vae", "text_encoder"}
    assert "unet/conv_in.weight" in paths(report)
    assert any(p.startswith("vae/decoder.") for p in paths(report))
    text = render_checkpoint(report)
    assert "(diffusers layout)" in text and "unet " in text and "text_encoder" in text


def test_diffusers_variant_and_bin_components(tmp_path):
    unet = zoo.tiny_unet()
    d = tmp_path / "unet"
    unet.save_pretrained(d)
    unet.to(torch.float16).save_pretrained(d, variant="fp16", safe_serialization=False)
    report = scan_checkpoint(tmp_path)  # the folder: what from_pretrained loads (the variant only when asked)
    groups = {g["group"]: g for g in report.extra["groups"]}
    assert set(groups) == {"unet"} and report.ok
    assert [s["path"] for s in report.extra["skipped"]] == ["unet/diffusion_pytorch_model.fp16.bin"]
    alone = scan_checkpoint(d / "diffusion_pytorch_model.fp16.bin")  # the variant, scanned by itself
    assert [g["dtypes"] for g in alone.extra["groups"]] == [{"float16": len(unet.state_dict())}]
    assert "conv_in.weight" in paths(alone)


# --- bitsandbytes ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_bnb_4bit_state_dict_roles_and_completeness(tmp_path, bnb4_state, fmt):
    path = tmp_path / ("q.pt" if fmt == "torch" else "q.safetensors")
    torch.save(bnb4_state, path) if fmt == "torch" else save_safetensors(bnb4_state, path)
    report = scan_checkpoint(path)
    assert report.ok, report.problems
    roles = {t.path: t.role for t in report.tensors}
    assert roles["proj.weight"] == roles["proj.bias"] == "parameter"
    for suffix in ("absmax", "quant_map", "nested_absmax", "nested_quant_map", "quant_state.bitsandbytes__nf4"):
        assert roles[f"proj.weight.{suffix}"] == "quant_state"
    assert {t.path: t.dtype for t in report.tensors}["proj.weight"] == torch.uint8


def save_as(state: dict[str, torch.Tensor], path: Path, fmt: str) -> Path:
    if fmt == "safetensors":
        return save_safetensors(state, path.with_suffix(".safetensors"))
    torch.save(state, path, _use_new_zipfile_serialization=fmt == "zip")
    return path


@pytest.mark.parametrize("fmt", ["zip", "legacy", "safetensors"])
@pytest.mark.parametrize("drop", [("nested_absmax",), ("nested_absmax", "nested_quant_map"), ("absmax", "quant_map")])
def test_bnb_4bit_missing_companions(tmp_path, bnb4_state, fmt, drop):
    """Both nested keys gone is only detectable from the packed JSON quant_state (read: 168 bytes)."""
    state = {k: v for k, v in bnb4_state.items() if k.rsplit(".", 1)[-1] not in drop}
    (p,) = scan_checkpoint(save_as(state, tmp_path / "q.pt", fmt)).problems
    assert (p.kind, p.path, p.role) == ("quant_incomplete", "proj.weight", "quant_state")
    assert f"missing {', '.join(f'proj.weight.{d}' for d in drop)};" in p.message
    assert "bitsandbytes 4-bit nf4 weight proj.weight" in p.message


def test_bnb_4bit_not_nested_needs_no_nested_keys(tmp_path):
    state = dict(zoo.bnb_linear4bit(compress_statistics=False, quant_type="fp4").state_dict())
    assert not any("nested" in k for k in state)
    assert scan_checkpoint(save_safetensors(state, tmp_path / "q.safetensors")).ok


def test_bnb_4bit_companions_without_quant_state(tmp_path, bnb4_state):
    state = {k: v for k, v in bnb4_state.items() if "quant_state" not in k}
    (p,) = scan_checkpoint(save_safetensors(state, tmp_path / "q.safetensors")).problems
    assert p.kind == "quant_incomplete" and "without its packed quant_state" in p.message
    assert "proj.weight.quant_state.bitsandbytes__nf4|fp4" in p.expected


def test_bnb_8bit(tmp_path, bnb8_state):
    assert set(bnb8_state) == {"proj.weight", "proj.bias", "proj.SCB", "proj.weight_format"}
    torch.save(bnb8_state, tmp_path / "ok.pt")
    report = scan_checkpoint(tmp_path / "ok.pt")
    assert report.ok and {t.path: t.role for t in report.tensors}["proj.SCB"] == "quant_state"
    for drop, missing in (("proj.SCB", "proj.SCB"), ("proj.weight", "proj.weight")):
        torch.save({k: v for k, v in bnb8_state.items() if k != drop}, tmp_path / "bad.pt")
        (p,) = scan_checkpoint(tmp_path / "bad.pt").problems
        assert p.kind == "quant_incomplete" and f"missing {missing}" in p.message


def test_plain_int8_weight_is_not_bitsandbytes(tmp_path):
    torch.save({"fc.weight": torch.zeros(4, 4, dtype=torch.int8)}, tmp_path / "i8.pt")
    assert scan_checkpoint(tmp_path / "i8.pt").ok


# --- saved devices --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("legacy", [False, True])
def test_saved_on_cuda1(tmp_path, legacy):
    path = tmp_path / "c1.pt"
    with saved_on("cuda:1"):
        torch.save({"w": torch.randn(3, 4), "h": torch.zeros(2, dtype=torch.float16)}, path,
                   _use_new_zipfile_serialization=not legacy)
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA device"):
        torch.load(path)  # the real failure this check predicts
    report = assert_unchanged(path, scan_checkpoint, path)
    assert report.extra["files"][0]["format"] == ("torch-legacy" if legacy else "torch-zip")
    assert {t.device for t in report.tensors} == {torch.device("cuda:1")}
    (p,) = report.problems
    assert (p.kind, p.found, p.tensors) == ("saved_device", "cuda:1", ("w", "h"))
    fix = f'torch.load({json.dumps(str(path))}, map_location="cpu")'
    assert fix in p.message and "this machine has no CUDA device" in p.message
    assert eval(fix, {"torch": torch})["w"].shape == (3, 4)  # the suggested fix works

    (p0,) = scan_checkpoint(path, device="cuda:0").problems
    assert 'map_location="cuda:0"' in p0.message and p0.expected == "cuda:0"
    assert scan_checkpoint(path, device="cuda:1").ok  # would load there as saved


def test_saved_on_cpu_loads_anywhere_and_meta_is_flagged(tmp_path):
    torch.save({"w": torch.zeros(2)}, tmp_path / "cpu.pt")
    assert scan_checkpoint(tmp_path / "cpu.pt", device="cuda:0").ok
    torch.save({"w": torch.zeros(2, device="meta")}, tmp_path / "meta.pt")
    (p,) = scan_checkpoint(tmp_path / "meta.pt").problems
    assert p.kind == "meta" and "hold no data" in p.message


def test_unsupported_dtype_on_target_device(tmp_path):
    torch.save({"w": torch.zeros(2, dtype=torch.float64)}, tmp_path / "f64.pt")
    assert kinds(scan_checkpoint(tmp_path / "f64.pt", device="mps")) == ["unsupported_dtype"]
    assert scan_checkpoint(tmp_path / "f64.pt", device="cpu").ok


# --- pickles: never executed ----------------------------------------------------------------------------------


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["zip", "legacy", "pickle"])
def test_malicious_pickle_never_runs(tmp_path, how):
    marker = tmp_path / "PWNED"
    payload = {"model": {"w": torch.zeros(3)}, "evil": _Evil(marker)}
    path = tmp_path / "evil.pt"
    if how == "pickle":
        path.write_bytes(pickle.dumps(_Evil(marker)))
    else:
        torch.save(payload, path, _use_new_zipfile_serialization=how == "zip")
    modules_before = set(sys.modules)
    report = scan_checkpoint(path)
    assert not marker.exists()
    # nothing the pickle names was imported (torchdoctor's own readers load lazily, in whatever order tests ran)
    assert {m for m in set(sys.modules) - modules_before if not m.startswith("torchdoctor.")} == set()
    (p,) = [p for p in report.problems if p.kind == "unsafe_global"]
    assert p.found == f"{os.system.__module__}.system"
    assert f"touch {marker}" in p.message and "do not load this file" in p.message
    if how != "pickle":
        assert paths(report) == ["model.w"] and p.path == "evil"


def test_unknown_global_is_never_imported(tmp_path):
    module = "torchdoctor_test_never_imported"
    data = b"\x80\x02c" + module.encode() + b"\nboom\nq\x00)\x81q\x01."  # GLOBAL, EMPTY_TUPLE, NEWOBJ
    obj = safe_loads(data)
    assert module not in sys.modules
    assert repr(obj) == f"<not imported: {module}.boom>"


def test_whole_module_pickle_and_lightning_style_ckpt(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.LayerNorm(3))
    torch.save(model, tmp_path / "model.pt")
    report = scan_checkpoint(tmp_path / "model.pt")
    assert paths(report) == list(model.state_dict())
    assert {p.found for p in report.problems} == {
        "torch.nn.modules.container.Sequential",
        "torch.nn.modules.linear.Linear",
        "torch.nn.modules.normalization.LayerNorm",
    }
    assert all("library class" in p.message for p in report.problems)

    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(1, 2)).sum().backward()
    opt.step()
    ckpt = {"epoch": 3, "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "optimizer_states": [opt.state_dict()], "hyper_parameters": argparse.Namespace(lr=1e-3)}
    torch.save(ckpt, tmp_path / "last.ckpt")
    report = scan_checkpoint(tmp_path / "last.ckpt")
    assert "state_dict.model.0.weight" in paths(report)
    assert "optimizer_states.0.state.0.exp_avg" in paths(report)
    (p,) = report.problems
    assert (p.kind, p.found, p.path) == ("unsafe_global", "argparse.Namespace", "hyper_parameters")
    assert "usually harmless" in p.message


def test_real_lightning_sd_ckpt_layout(tmp_path, monkeypatch):
    """An SD 1.x / Lightning 1.x ``.ckpt``: callbacks keyed by a Lightning class, numpy scalars and arrays in the
    loop state. Every global is named once (numpy's ndarray/dtype inside its rebuild call are folded into that
    call's entry), no module is imported, and every tensor is still reported."""
    import types

    import numpy as np

    fake = types.ModuleType("pytorch_lightning.callbacks.model_checkpoint")

    class ModelCheckpoint:
        pass

    ModelCheckpoint.__module__, ModelCheckpoint.__qualname__ = fake.__name__, "ModelCheckpoint"
    fake.ModelCheckpoint = ModelCheckpoint  # type: ignore[attr-defined]
    for name in ("pytorch_lightning", "pytorch_lightning.callbacks"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    w = torch.randn(4, 4)
    ckpt = {"epoch": 6, "global_step": 470000, "pytorch-lightning_version": "1.4.2",
            "state_dict": {"model.diffusion_model.input_blocks.0.0.weight": torch.randn(8, 4, 3, 3),
                           "cond_stage_model.transformer.embeddings.token_embedding.weight": w,
                           "first_stage_model.encoder.conv_in.weight": torch.randn(8, 3, 3, 3).half()},
            "callbacks": {ModelCheckpoint: {"best_model_score": torch.tensor(0.3), "best_k_models": {}}},
            "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": np.int64(6)}}}},
            "optimizer_states": [], "np_score": np.float32(1.5), "arr": np.zeros(3)}
    torch.save(ckpt, tmp_path / "sd-v1.ckpt")
    monkeypatch.undo()  # the scan must not find (or import) pytorch_lightning
    modules_before = set(sys.modules)
    report = scan_checkpoint(tmp_path / "sd-v1.ckpt")
    assert set(sys.modules) == modules_before
    assert sorted(paths(report)) == sorted([f"state_dict.{k}" for k in ckpt["state_dict"]] +
                                           ["callbacks.ModelCheckpoint.best_model_score"])
    by_global = {p.found: p for p in report.problems}
    assert all(p.kind == "unsafe_global" for p in report.problems) and len(by_global) == len(report.problems)
    lightning = by_global["pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint"]
    assert lightning.path == "callbacks" and "library class, harmless to import" in lightning.message
    numpy_calls = {g for g in by_global if g.startswith("numpy")}
    assert numpy_calls and all("plain data type, usually harmless" in by_global[g].message for g in numpy_calls)
    assert "numpy.ndarray" not in by_global and "numpy.dtype" not in by_global  # folded, still named:
    assert any("(with numpy.ndarray)" in by_global[g].message for g in numpy_calls)
    assert any("(with numpy.dtype)" in by_global[g].message for g in numpy_calls)
    assert not any("do not load" in p.message for p in report.problems)


def test_dangerous_global_is_never_folded_into_a_harmless_one(tmp_path):
    import numpy as np

    marker = tmp_path / "PWNED"
    torch.save({"w": torch.zeros(1), "arr": np.array([_Evil(marker)], dtype=object)}, tmp_path / "mixed.pt")
    report = scan_checkpoint(tmp_path / "mixed.pt")
    assert not marker.exists() and paths(report) == ["w"]
    evil = [p for p in report.problems if p.found == f"{os.system.__module__}.system"]
    assert len(evil) == 1 and "do not load this file" in evil[0].message


def test_safetensors_with_pt_metadata_and_tied_bin(tmp_path):
    """The two most common real layouts: safetensors with ``__metadata__ {"format": "pt"}`` and a GPT-2 style
    ``pytorch_model.bin`` whose lm_head shares the embedding's storage."""
    from safetensors.torch import save_file

    emb = torch.randn(16, 4)
    save_file({"wte.weight": emb, "ln.bias": torch.zeros(4)}, str(tmp_path / "m.safetensors"), metadata={"format": "pt"})
    st = scan_checkpoint(tmp_path / "m.safetensors")
    assert st.ok and st.extra["metadata"] == {"format": "pt"} and paths(st) == ["ln.bias", "wte.weight"]
    torch.save({"transformer.wte.weight": emb, "lm_head.weight": emb}, tmp_path / "pytorch_model.bin")
    tied = scan_checkpoint(tmp_path / "pytorch_model.bin")
    assert tied.ok and {t.path: t.alias_of for t in tied.tensors} == {
        "transformer.wte.weight": None, "lm_head.weight": "transformer.wte.weight"}


def test_shared_storage_is_an_alias(tmp_path):
    w = torch.randn(4, 4)
    torch.save({"embed.weight": w, "lm_head.weight": w, "row": w[1]}, tmp_path / "tied.pt")
    report = scan_checkpoint(tmp_path / "tied.pt")
    alias = {t.path: t.alias_of for t in report.tensors}
    assert alias == {"embed.weight": None, "lm_head.weight": "embed.weight", "row": None}
    (group,) = report.summary
    assert group["nbytes"] == w.nbytes  # one storage, counted once


# --- unreadable input: one line, exit 2 -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_files(tmp_path_factory, bnb4_state) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("good")
    torch.save(bnb4_state, d / "zip.pt")
    torch.save(bnb4_state, d / "legacy.pt", _use_new_zipfile_serialization=False)
    save_safetensors(bnb4_state, d / "st.safetensors")
    return {p.name: p for p in d.iterdir()}


def damaged(good_files, tmp_path) -> Iterator[tuple[str, Path]]:
    for name, src in good_files.items():
        data = src.read_bytes()
        for how, bad in (("empty", b""), ("truncated", data[: len(data) // 2]), ("cut-tail", data[:-1]),
                         ("corrupted", data[:8] + b"\xff" * 64 + data[72:])):
            path = tmp_path / f"{how}-{name}"
            path.write_bytes(bad)
            yield how, path


def test_damaged_files_raise_one_line(good_files, tmp_path):
    for how, path in damaged(good_files, tmp_path):
        with pytest.raises(CheckpointError) as info:
            scan_checkpoint(path)
        msg = str(info.value)
        assert "\n" not in msg and msg.startswith(path.name), msg
        if how == "empty":
            assert "empty file" in msg
        if how == "truncated":
            assert "truncated" in msg, msg


def test_cli_scan_path_damaged_is_usage_error(good_files, tmp_path, capsys):
    for how, path in damaged(good_files, tmp_path):
        with pytest.raises(UsageError, match=path.name):
            cli_scan_path(str(path), args())
    assert capsys.readouterr().out == ""


def test_cli_main_exit_codes(good_files, tmp_path, capsys):
    """Through the real CLI: ``torchdoctor scan FILE`` routes existing paths to cli_scan_path."""
    assert main(["scan", str(good_files["st.safetensors"])]) == 0
    out = capsys.readouterr().out
    assert "ok: no problems found" in out and "uint8" in out
    for how, path in damaged(good_files, tmp_path):
        assert main(["scan", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and path.name in err
    with saved_on("cuda:1"):
        torch.save({"w": torch.zeros(2)}, tmp_path / "c1.pt")
    assert main(["scan", str(tmp_path / "c1.pt"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "torchdoctor/scan/1" and doc["ok"] is False
    assert doc["tensors"] == [{"path": "w", "role": "parameter", "device": "cuda:1", "dtype": "float32", "shape": [2],
                               "nbytes": 8, "moved_by_module_to": False, "alias_of": None}]
    assert doc["problems"][0]["kind"] == "saved_device" and doc["files"][0]["saved_on"] == ["cuda:1"]


def test_cli_text_and_json(sd_dir, capsys):
    assert cli_scan_path(str(sd_dir), args()) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith(f"{sd_dir} (diffusers layout): ")
    assert "by saved device and dtype" in text
    assert cli_scan_path(str(sd_dir), args(json=True, dtype="bf16")) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {p["kind"] for p in doc["problems"]} == {"dtype"}
    assert {g["group"] for g in doc["groups"]} == {"unet", "vae", "text_encoder"}
    with pytest.raises(UsageError, match="--plan"):
        cli_scan_path(str(sd_dir), args(plan=True))


def test_other_unreadable_inputs(tmp_path):
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint files"):
        scan_checkpoint(tmp_path / "empty_dir")
    (tmp_path / "x.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(CheckpointError, match="GGUF"):
        scan_checkpoint(tmp_path / "x.gguf")
    (tmp_path / "notes.bin").write_bytes(b"hello world, not a checkpoint")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        scan_checkpoint(tmp_path / "notes.bin")
    with pytest.raises(CheckpointError, match="no such file"):
        scan_checkpoint(tmp_path / "missing.pt")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_files_never_crash(good_files, tmp_path, data):
    """Any damage to a real file gives a report or a CheckpointError, never another exception."""
    src = good_files[data.draw(st.sampled_from(sorted(good_files)))]
    raw = bytearray(src.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    raw = raw[: data.draw(st.integers(0, len(raw)))]
    path = tmp_path / f"fuzz-{src.name}"
    path.write_bytes(bytes(raw))
    try:
        scan_checkpoint(path)
    except CheckpointError as exc:
        assert "\n" not in str(exc)


# --- roles ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, role",
    [
        ("model.layers.0.self_attn.q_proj.weight", "parameter"),
        ("fc.weight.absmax", "quant_state"),
        ("fc.weight.nested_quant_map", "quant_state"),
        ("fc.weight.quant_state.bitsandbytes__fp4", "quant_state"),
        ("fc.SCB", "quant_state"),
        ("fc.weight_format", "quant_state"),
        ("layers.0.qzeros", "quant_state"),
        ("layers.0.qweight", "parameter"),
        ("mlp.down_proj.weight_scale_inv", "quant_state"),
        ("norm.scale", "parameter"),
    ],
)
def test_role_of(key, role):
    assert role_of(key) == role


# --- hostile pickles ------------------------------------------------------------------------------------------


def _unicode(text: str) -> bytes:
    raw = text.encode()
    return b"X" + len(raw).to_bytes(4, "little") + raw


def _getattr_chain(command: str) -> bytes:
    """``getattr(__import__("os"), "system")(command)`` as raw pickle opcodes (protocol 2)."""
    return (b"\x80\x02cbuiltins\ngetattr\n(cbuiltins\n__import__\n" + _unicode("os") + b"\x85R" + _unicode("system")
            + b"tR" + _unicode(command) + b"\x85R.")


def test_import_getattr_chain_never_runs(tmp_path):
    real = tmp_path / "REAL"
    pickle.loads(_getattr_chain(f"touch {real}"))  # the payload is live: plain pickle runs it
    assert real.exists()
    marker = tmp_path / "PWNED"
    (tmp_path / "chain.pkl").write_bytes(_getattr_chain(f"touch {marker}"))
    report = scan_checkpoint(tmp_path / "chain.pkl")
    assert not marker.exists()
    assert {p.found for p in report.problems} == {"builtins.getattr", "builtins.__import__"}
    assert all("do not load this file" in p.message for p in report.problems)


def test_build_on_an_allow_listed_global_is_refused(tmp_path):
    # GLOBAL torch._utils._rebuild_tensor_v2, EMPTY_DICT, MARK 'fn' 'x' SETITEMS, BUILD, STOP
    data = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n}(X\x02\x00\x00\x00fnX\x01\x00\x00\x00xub."
    (tmp_path / "build.pkl").write_bytes(data)
    with pytest.raises(CheckpointError, match="corrupted pickle"):
        scan_checkpoint(tmp_path / "build.pkl")
    torch.save({"w": torch.ones(2)}, tmp_path / "after.pt")
    assert [t.compact for t in scan_checkpoint(tmp_path / "after.pt").tensors] == ["f32[2]@cpu"]


def test_deep_pickle_is_bounded(tmp_path):
    deep: list = [torch.ones(1)]
    for _ in range(400):
        deep = [deep]
    torch.save({"top": torch.zeros(1), "deep": deep}, tmp_path / "deep.pt")
    report = scan_checkpoint(tmp_path / "deep.pt")
    assert report.truncated and "truncated" in kinds(report)
    assert "top" in paths(report)


# --- public entry and odd indexes ----------------------------------------------------------------------------


def test_public_scan_takes_a_path(tmp_path):
    import torchdoctor

    torch.save({"w": torch.zeros(2, dtype=torch.float16)}, tmp_path / "h.pt")
    report = torchdoctor.scan(str(tmp_path / "h.pt"), device="cuda:0", dtype="float32")
    assert kinds(report) == ["dtype"] and report.expected == {"": {"device": "cuda:0", "dtype": "float32"}}
    text = render_checkpoint(report)
    assert "checked against: device cuda:0, dtype float32" in text
    assert report.source == str(tmp_path / "h.pt")


def test_index_cannot_point_outside_its_directory(tmp_path):
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../../etc/passwd"}}))
    with pytest.raises(CheckpointError, match="points outside the checkpoint directory"):
        scan_checkpoint(tmp_path / "m.safetensors.index.json")
    (p,) = scan_checkpoint(tmp_path).problems
    assert p.kind == "unreadable" and "points outside the checkpoint directory" in p.message


def test_plain_pickle_of_a_state_dict(tmp_path):
    """``pickle.dump(state_dict)`` embeds each storage as a tiny torch.save stream; it is read the same way."""
    w = torch.zeros(2)
    with saved_on("cuda:1"), open(tmp_path / "sd.pkl", "wb") as f:
        pickle.dump({"w": w, "p": torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16)), "tied": w}, f)
    report = scan_checkpoint(tmp_path / "sd.pkl")
    assert [(t.path, t.compact, t.alias_of) for t in report.tensors] == [
        ("w", "f32[2]@cuda:1", None), ("p", "bf16[3]@cuda:1", None), ("tied", "f32[2]@cuda:1", "w")]
    assert kinds(report) == ["saved_device"] and report.extra["files"][0]["format"] == "pickle"


class _Smuggled:
    """A storage blob (``torch.storage._load_from_bytes``) whose embedded torch.save stream runs os.system."""

    def __init__(self, marker: Path) -> None:
        inner = [0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001}, _Evil(marker), []]
        self.blob = b"".join(pickle.dumps(x, protocol=2) for x in inner)

    def __reduce__(self):
        return (torch.storage._load_from_bytes, (self.blob,))


def test_globals_inside_an_embedded_storage_are_reported(tmp_path):
    marker = tmp_path / "PWNED"
    (tmp_path / "smuggle.pkl").write_bytes(pickle.dumps({"ok": torch.ones(2), "w": _Smuggled(marker)}))
    report = scan_checkpoint(tmp_path / "smuggle.pkl")
    assert not marker.exists()
    (p,) = report.problems
    assert (p.kind, p.found, p.path) == ("unsafe_global", f"{os.system.__module__}.system", "w")
    assert paths(report) == ["ok"]


def test_gptq_layer_without_scales(tmp_path):
    state = {"l.qweight": torch.zeros(4, 8, dtype=torch.int32), "l.qzeros": torch.zeros(1, 8, dtype=torch.int32),
             "l.scales": torch.ones(1, 64, dtype=torch.float16), "l.g_idx": torch.zeros(32, dtype=torch.int32)}
    assert scan_checkpoint(save_safetensors(state, tmp_path / "ok.safetensors")).ok
    del state["l.scales"]
    (p,) = scan_checkpoint(save_safetensors(state, tmp_path / "bad.safetensors")).problems
    assert (p.kind, p.path) == ("quant_incomplete", "l") and "missing l.scales" in p.message


# --- tensor kinds: one row each, internals hidden, nothing reported that torch.load(weights_only=True) accepts --


def test_sparse_nested_quantized_and_float8_are_one_row_each(tmp_path):
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the nested tensor API's prototype warning
        kinds = {
            "coo": (torch.eye(3).to_sparse(), "f32[3,3]@cpu"),
            "csr": (torch.eye(3).to_sparse_csr(), "f32[3,3]@cpu"),
            "strided_nested": (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "f32[5]@cpu"),
            "jagged": (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged), "f32[5]@cpu"),
            "q": (torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.quint8), "qu8[4]@cpu"),
            "f8": (torch.zeros(2, dtype=torch.float8_e4m3fn), "f8e4m3[2]@cpu"),
            "c": (torch.ones(2, dtype=torch.complex64), "c64[2]@cpu"),
        }
    torch.save({k: v for k, (v, _) in kinds.items()}, tmp_path / "kinds.pt")
    importlib.import_module("torch._dynamo")  # torch's own condition for loading jagged tensors weights-only
    torch.load(tmp_path / "kinds.pt", weights_only=True)  # torch accepts every one of them
    report = scan_checkpoint(tmp_path / "kinds.pt")
    assert report.ok, report.problems
    assert {t.path: t.compact for t in report.tensors} == {k: compact for k, (_, compact) in kinds.items()}

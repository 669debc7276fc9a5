"""Container-level payloads, live: each file is built here, the real loader (torch.load(weights_only=False),
pickle.load or dcp.load, in a subprocess under a timeout) is shown to run its payload (it creates a marker
file), and the scan never says ok. Benign containers (a whole pickled transformers / diffusers model, a
TorchScript archive) get no "can run code" alarm."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoint import containers
from checkpoint.capped import assert_bounded, run_scans
from torchdoctor._checkpoint.scan import CheckpointError, check_checkpoint

_LOADERS = {  # each reads the file at `path`
    "torch.load": "import torch; torch.load(path, weights_only=False)",
    "pickle.load": "import pickle; pickle.load(open(path, 'rb'))",
    "dcp.load": ("import torch; from torch.distributed.checkpoint import load; "
                 "load({'w': torch.zeros(2), 'extra': {'cfg': None}}, checkpoint_id=path)"),
}
# One child process runs every load in turn (one torch import, not one per file), clearing the marker before each.
_RUN_EACH = r"""
import json, os, sys, warnings
warnings.simplefilter("ignore")
marker, loaders, jobs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
ran = {}
for name, loader, path in jobs:
    if os.path.exists(marker):
        os.unlink(marker)
    try:
        exec(loaders[loader], {"path": path})
    except BaseException:  # the load failing after the payload ran does not matter
        pass
    ran[name] = os.path.exists(marker)
print(json.dumps(ran))
"""


def _runs_each(jobs: dict[str, tuple[str, Path]], marker: Path) -> dict[str, bool]:
    """For each name, whether its loader runs the payload of its file (the file's load failing afterwards does
    not matter)."""
    done = subprocess.run([sys.executable, "-c", _RUN_EACH, str(marker), json.dumps(_LOADERS),
                           json.dumps([(name, loader, str(path)) for name, (loader, path) in jobs.items()])],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _runs(loader: str, path: Path, marker: Path) -> bool:
    """Whether ``loader`` runs the payload of ``path``."""
    return _runs_each({"one": (loader, path)}, marker)["one"]


def _can_run(report) -> set[str]:
    return {p.found for p in report.problems if p.kind == "unsafe_global" and "can run code" in p.message}


@pytest.fixture(scope="module")
def payloads(tmp_path_factory):
    d = tmp_path_factory.mktemp("containers")
    marker = d / "MARKER"
    files = {}
    for name, (data, loader) in containers.live_payloads(str(marker)).items():
        (d / name).write_bytes(data)
        files[name] = (d / name, loader)
    return d, marker, files


def test_every_container_payload_runs_under_its_loader(payloads):
    d, marker, files = payloads
    ran = _runs_each({name: (loader, path) for name, (path, loader) in files.items()}, marker)
    # torch's reader picks the first of two duplicate names: the payload written second does not run, but the
    # scan judges every copy (test below)
    assert ran.pop("zip-duplicate-evil-last.pt") is False
    assert all(ran.values()), ran


def test_no_container_payload_is_ok_and_each_names_its_global(payloads):
    d, marker, files = payloads
    for name, (path, _) in files.items():
        report = check_checkpoint(path)
        assert _can_run(report) & {"os.system", "posix.system"}, (name, [p.message for p in report.problems])
        assert not report.ok


def test_the_cli_exits_1_on_each_and_runs_nothing(payloads, tmp_path):
    d, marker, files = payloads
    if marker.exists():
        marker.unlink()
    runs = run_scans([["scan", str(path)] for path, _ in files.values()])
    for run in runs:
        assert_bounded(run)
        assert run.rc == 1 and "can run code" in run.out, run
    assert not marker.exists()


def test_refusals_name_what_they_refused_and_why(payloads):
    _, _, files = payloads
    messages = {name: " ".join(p.message for p in check_checkpoint(path).problems) for name, (path, _) in files.items()}
    assert "two zip members with the same name ('archive/data.pkl', 'archive/data.pkl')" in \
        messages["zip-duplicate-evil-first.pt"]
    assert "names that differ only in case" in messages["zip-duplicate-evil-last.pt"]
    assert "is named b'archive/data.pkX' in its local header" in messages["zip-name-mismatch.pt"]
    assert "nested more than 2 deep" in messages["blobs-nested-3.pkl"]
    assert "followed by 14 more bytes" in messages["pickle-with-trailing-data.pkl"]
    assert "header of" not in messages["legacy-byte8-brace.pt"]  # never sent to the safetensors reader
    for name in ("tar-v7-pickle-name.pt", "tar-ustar.pt"):
        fmt = check_checkpoint(files[name][0]).extra["files"][0]["format"]
        assert fmt == "torch-tar", name


def test_a_tar_whose_storages_member_is_a_symlink_is_refused(tmp_path):
    marker = tmp_path / "MARKER"
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(containers.evil(str(marker)) + pickle.dumps([], 2))
    path = tmp_path / "old.pt"
    path.write_bytes(containers.tar_symlinked_storages(str(target)))
    assert _runs("torch.load", path, marker)  # torch follows the link and unpickles the file it points to
    marker.unlink()
    with pytest.raises(CheckpointError, match="tar member 'storages' is a symlink to '.*elsewhere.bin'"):
        check_checkpoint(path)
    assert not marker.exists()


def test_a_benign_old_tar_is_refused_not_ok(tmp_path):
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in (("storages", pickle.dumps(0, 2) + pickle.dumps([], 2)), ("tensors", pickle.dumps(0, 2)),
                           ("pickle", pickle.dumps({"epoch": 3}, 2))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    (tmp_path / "old.pt").write_bytes(buf.getvalue())
    assert torch.load(tmp_path / "old.pt", weights_only=False) == {"epoch": 3}  # the real loader reads it
    with pytest.raises(CheckpointError, match="tar-format checkpoint from torch < 0.4: its pickles name no global"):
        check_checkpoint(tmp_path / "old.pt")


def test_old_tar_as_pytorch_model_bin_in_a_model_folder(tmp_path):
    marker = tmp_path / "MARKER"
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2"}')
    (folder / "pytorch_model.bin").write_bytes(containers.v7_tar(str(marker)))
    report = check_checkpoint(folder)
    assert _can_run(report) & {"os.system", "posix.system"} and not report.ok
    assert not marker.exists()


def test_a_plain_pickle_with_trailing_data_is_never_plain(tmp_path):
    path = tmp_path / "state.pkl"
    path.write_bytes(pickle.dumps({"epoch": 3}) + b"\x00extra")
    with pytest.raises(CheckpointError, match=r"refused: a pickle of \d+ bytes followed by 6 more bytes: not a "
                                              "plain pickle"):
        check_checkpoint(path)


def test_dcp_non_tensor_value_is_read_as_a_nested_torch_save_stream(tmp_path):
    marker = tmp_path / "MARKER"
    d = containers.dcp_with_value(tmp_path / "dcp", str(marker))
    assert _runs("dcp.load", d, marker)  # dcp.load calls torch.load(weights_only=False) on the value
    marker.unlink()
    report = check_checkpoint(d)
    assert _can_run(report) & {"os.system", "posix.system"} and not report.ok
    assert not marker.exists()


def test_dcp_with_benign_values_is_still_ok(tmp_path):
    from torch.distributed.checkpoint import save

    save({"w": torch.zeros(2), "extra": {"epoch": 3, "name": "run"}}, checkpoint_id=str(tmp_path / "dcp"))
    report = check_checkpoint(tmp_path / "dcp")
    assert report.ok, [p.message for p in report.problems]


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1))


def test_a_whole_pickled_transformers_model_holds_module_classes_not_code(tmp_path):
    path = tmp_path / "llama.pt"
    torch.save(_tiny_llama(), path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path, weights_only=True)  # refused for the classes alone
    report = check_checkpoint(path)
    assert not _can_run(report), [p.message for p in report.problems]
    held = [p for p in report.problems if "holds module classes" in p.message]
    assert len(held) == 1
    assert "holds module classes: torch.load(weights_only=True) refuses it" in held[0].message
    assert "LlamaForCausalLM" in held[0].message and len(report.tensors) > 0


def test_a_whole_pickled_diffusers_model_holds_module_classes_not_code(tmp_path):
    from diffusers import UNet2DModel

    unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8,),
                       down_block_types=("DownBlock2D",), up_block_types=("UpBlock2D",), norm_num_groups=4)
    torch.save(unet, tmp_path / "unet.pt")
    report = check_checkpoint(tmp_path / "unet.pt")
    assert not _can_run(report), [p.message for p in report.problems]
    assert any("holds module classes" in p.message for p in report.problems)


def test_a_model_class_called_with_arguments_can_run_code(tmp_path):
    """The same name used otherwise than a pickled model uses it (REDUCE with arguments) is not excused."""
    from checkpoint.corpus import _call, _p4, _sglobal, _str

    data = _p4(_call(_sglobal("transformers.models.llama.modeling_llama", "LlamaForCausalLM"), _str("x")))
    (tmp_path / "m.pkl").write_bytes(data)
    report = check_checkpoint(tmp_path / "m.pkl")
    assert "transformers.models.llama.modeling_llama.LlamaForCausalLM" in _can_run(report)


def test_torchscript_archives_are_not_flagged(tmp_path):
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    torch.jit.save(scripted, tmp_path / "ts.pt")
    report = check_checkpoint(tmp_path / "ts.pt")
    assert report.ok, [p.message for p in report.problems]
    doc = report.extra["files"][0]
    assert doc["format"] == "torchscript" and "__torch__.* names are TorchScript classes" in doc["notes"][0]


def test_torch_names_outside_a_torchscript_archive_are_still_judged(tmp_path):
    """``__torch__.*`` is excused only where torch.load hands the file to torch.jit.load (constants.pkl there)."""
    from checkpoint.corpus import _call, _p4, _sglobal, zip_pickle

    (tmp_path / "z.pt").write_bytes(zip_pickle(_p4(_call(_sglobal("__torch__.os", "system"), b"N"))))
    assert "__torch__.os.system" in _can_run(check_checkpoint(tmp_path / "z.pt"))


def test_a_torch_export_archive_lists_its_tensors(tmp_path):
    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 3)
            self.register_buffer("scale", torch.ones(3, dtype=torch.bfloat16))

        def forward(self, x):
            return self.lin(x) * self.scale

    torch.export.save(torch.export.export(Tiny(), (torch.randn(1, 2),)), tmp_path / "m.pt2")
    report = check_checkpoint(tmp_path / "m.pt2")
    assert report.ok, [p.message for p in report.problems]
    assert {(t.path, t.dtype.name, t.shape) for t in report.tensors} == {
        ("lin.weight", "float32", (3, 2)), ("lin.bias", "float32", (3,)), ("scale", "bfloat16", (3,))}
    assert report.extra["files"][0]["format"] == "torch-export"


def test_a_torch_export_archive_with_a_pickled_opaque_object_can_run_code(tmp_path):
    marker = tmp_path / "MARKER"
    path = containers.pt2_with_opaque_object(tmp_path / "m.pt2", str(marker))
    code = "import torch, sys; torch.export.load(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=300)
    assert marker.exists()  # torch.export.load pickle.loads the opaque object
    marker.unlink()
    assert _can_run(check_checkpoint(path)) & {"os.system", "posix.system"}
    assert not marker.exists()

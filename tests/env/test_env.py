"""The environment doctor on this machine, on saved facts, and through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import torchdoctor
from torchdoctor._cli.main import main
from torchdoctor._env.devices import capabilities
from torchdoctor._env.complete import complete_facts
from torchdoctor._env.report import EnvReport, collect_facts, env_report

FIXTURES = Path(__file__).parent / "fixtures"
NVIDIA_MACHINE = FIXTURES / "machine_nvidia_cpu_torch.json"
CPU_ONLY_HERE = torch.version.cuda is None and torch.version.hip is None and not torch.backends.mps.is_built()
SUBPROCESS_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["env", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- facts -----------------------------------------------------------------------------------------------


def test_facts_of_this_machine() -> None:
    facts = collect_facts()
    assert json.loads(json.dumps(facts)) == facts  # JSON-native, no default=str needed
    t = facts["torch"]
    assert (t["installed"], t["importable"], t["version"]) == (True, True, torch.__version__)
    assert facts["packages"]["torch"] == torch.__version__
    assert {"torchdoctor", "bitsandbytes", "transformers"} <= set(facts["packages"])
    assert all(k == k.lower() and "_" not in k for k in facts["packages"])  # PEP 503 names
    assert facts["availability_source"] == "inferred" and facts["probed"] == {}
    if CPU_ONLY_HERE:
        assert t["build"] == "cpu" and t["cuda"] is None and t["accelerator"] is None
        assert not (facts["cuda_available"] or facts["xpu_available"] or facts["mps_available"])


@pytest.mark.skipif(not CPU_ONLY_HERE or os.path.exists("/proc/driver/nvidia"), reason="describes this CPU-only machine")
def test_no_accelerator_here() -> None:
    facts = collect_facts()
    assert facts["devices"] == [] and not any(facts["drivers"].values())


def test_device_variables_are_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("PYTORCH_ENABLE_MPS_FALLBACK", "1")
    monkeypatch.setenv("SOME_OTHER_SECRET", "x")
    env = collect_facts()["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["PYTORCH_ENABLE_MPS_FALLBACK"] == "1"
    assert "SOME_OTHER_SECRET" not in env


def fake_tree(root: Path) -> None:
    for rel, text in {
        "sys/class/drm/card0/device/vendor": "0x8086\n",
        "sys/class/drm/card0/device/device": "0x56a0\n",
        "sys/class/drm/card1/device/vendor": "0x1002\n",
        "sys/class/drm/card1/device/product_name": "AMD Instinct MI210\n",
        "sys/class/drm/card0-DP-1/status": "connected\n",
        "proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Fri Feb 28 2025\n",
        "proc/driver/nvidia/gpus/0000:01:00.0/information": "Model: \t\t NVIDIA GeForce RTX 4090\nIRQ: 42\n",
        "opt/rocm/.info/version": "6.4.1-120\n",
        "dev/kfd": "",
    }.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for module in ("xe", "amdgpu", "nvidia"):
        (root / "sys/module" / module).mkdir(parents=True)


def test_inventory_from_sysfs_and_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tree(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no vendor tools
    facts = collect_facts(_root=str(tmp_path))
    got = [(d["vendor"], d["name"], d["source"]) for d in facts["devices"]]
    assert got == [("nvidia", "NVIDIA GeForce RTX 4090", "/proc/driver/nvidia"), ("intel", "Intel GPU 0x56a0", "sysfs"),
                   ("amd", "AMD Instinct MI210", "sysfs")]
    assert facts["drivers"] == {"nvidia": "570.133.20", "intel": "xe", "amdgpu": "amdgpu", "rocm": "6.4.1-120"}
    codes = [f.code for f in env_report(facts).findings]
    if CPU_ONLY_HERE:
        assert "cpu_torch_with_nvidia" in codes and "cpu_only_build" not in codes
        assert facts["cuda_available"] is False  # a CPU build cannot use the GPU it found


def test_inventory_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    # an old driver rejects compute_cap: the second query, without it, must still give the GPUs
    smi.write_text(textwrap.dedent("""\
        #!/bin/sh
        case "$*" in *compute_cap*) echo 'Field "compute_cap" is not a valid field to query.' >&2; exit 2;; esac
        echo "Tesla T4, 15360, 470.57.02"
        echo "Tesla T4, 15360, 470.57.02"
        """))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    facts = collect_facts(_root=str(tmp_path))
    assert [(d["name"], d["memory_mib"], d["index"]) for d in facts["devices"]] == [("Tesla T4", 15360, 0), ("Tesla T4", 15360, 1)]
    assert facts["drivers"]["nvidia"] == "470.57.02" and facts["tools"]["nvidia-smi"] == str(smi)
    assert any("compute_cap" in e for e in facts["errors"])  # the failed first query is recorded, not raised


def fake_dist(site: Path, name: str, version: str, *requires: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def test_installed_metadata_pins_and_duplicates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    fake_dist(site, "xformers", "0.0.28.post3", "torch==2.5.1", "numpy")
    fake_dist(site, "torchvision", "0.28.0+cu130", "numpy", "torch==2.13.0", "pillow!=8.3.*,>=5.3.0")
    fake_dist(site, "ipex_llm", "2.1.0", 'intel_extension_for_pytorch==2.1.10+xpu; extra == "xpu"', "transformers")
    fake_dist(site, "torch", "2.5.1")  # a second torch later on sys.path, as a stray user-site install
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])  # after the venv: the venv's torch is the one imported
    facts = collect_facts()
    assert facts["packages"]["xformers"] == "0.0.28.post3" and facts["packages"]["ipex-llm"] == "2.1.0"
    assert facts["requires"]["xformers"] == ["torch==2.5.1"]
    assert facts["requires"]["torchvision"] == ["torch==2.13.0"]
    assert facts["requires"]["ipex-llm"] == ['intel_extension_for_pytorch==2.1.10+xpu; extra == "xpu"']
    assert facts["duplicates"]["torch"] == [torch.__version__, "2.5.1"]
    codes = {f.code for f in env_report(facts).findings}
    assert {"xformers_torch_mismatch", "duplicate_distributions"} <= codes
    if CPU_ONLY_HERE:
        assert "torchvision_torch_mismatch" in codes


def test_collect_facts_never_raises_on_a_hostile_tree(tmp_path: Path) -> None:
    (tmp_path / "sys/class/drm/card0/device").mkdir(parents=True)
    (tmp_path / "sys/class/drm/card0/device/vendor").mkdir()  # a directory where a file should be
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_bytes(b"\xff\xfe garbage")
    facts = collect_facts(_root=str(tmp_path))
    assert facts["torch"]["importable"] is True and isinstance(facts["errors"], list)


def test_complete_facts_fills_defaults_without_mutating() -> None:
    partial = {"torch": {"version": "2.5.1"}, "packages": {"Intel_Extension_For_PyTorch": "2.5.10+xpu"}}
    full = complete_facts(partial)
    assert partial == {"torch": {"version": "2.5.1"}, "packages": {"Intel_Extension_For_PyTorch": "2.5.10+xpu"}}
    assert full["packages"] == {"intel-extension-for-pytorch": "2.5.10+xpu"}
    assert full["torch"]["importable"] is True and full["drivers"]["nvidia"] is None and full["devices"] == []


# --- a torch that does not import, and no device initialisation ------------------------------------------


def test_broken_torch_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise OSError('libtorch_cuda.so: cannot open shared object file: No such file or directory')\n")
    env = {**SUBPROCESS_ENV, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "torchdoctor", "env", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["facts"]["torch"]["importable"] is False
    assert "libtorch_cuda.so" in doc["facts"]["torch"]["error"]
    assert doc["findings"][0]["code"] == "torch_import_failed" and doc["findings"][0]["severity"] == "error"
    assert doc["device"]["device"] is None and "torch does not import" in doc["device"]["reason"]
    text = subprocess.run([sys.executable, "-m", "torchdoctor", "env"], capture_output=True, text=True, env=env, timeout=300)
    assert text.returncode == 1 and "does not import: OSError: libtorch_cuda.so" in text.stdout
    assert "Traceback" not in text.stderr


def test_no_cuda_or_xpu_initialisation() -> None:
    script = textwrap.dedent("""
        import sys, torch
        def refuse(*a, **k):
            raise AssertionError("device initialised")
        for owner, name in [(torch.cuda, "_lazy_init"), (torch.cuda, "init"), (torch._C, "_cuda_init"),
                            (torch.xpu, "_lazy_init"), (torch.xpu, "init"), (torch._C, "_xpu_init")]:
            if hasattr(owner, name):
                setattr(owner, name, refuse)
        import torchdoctor
        # without --probe, facts and the report do not even ask whether a device is there
        saved = torch.cuda.is_available, torch.cuda.device_count, torch.xpu.is_available, torch.xpu.device_count
        torch.cuda.is_available = torch.cuda.device_count = torch.xpu.is_available = torch.xpu.device_count = refuse
        facts = torchdoctor.collect_facts()
        report = torchdoctor.env_report()
        torch.cuda.is_available, torch.cuda.device_count, torch.xpu.is_available, torch.xpu.device_count = saved
        choice = torchdoctor.choose_device()
        print(facts["torch"]["importable"], report.choice["device"], choice.device, torch.cuda.is_initialized())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300)
    assert done.returncode == 0, done.stderr
    importable, device, chosen, initialised = done.stdout.split()
    assert importable == "True" and initialised == "False" and device == chosen


def test_env_modules_do_not_import_torch() -> None:
    script = "import sys, torchdoctor._env.report, torchdoctor._env.rules, torchdoctor._env.devices; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300)
    assert done.stdout.strip() == "False", done.stderr


# --- the report and the CLI ------------------------------------------------------------------------------


@pytest.mark.skipif(not CPU_ONLY_HERE, reason="describes a CPU-only build")
def test_cli_text_on_this_machine(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TORCHDOCTOR_DEVICE", "CUDA_VISIBLE_DEVICES", "PYTORCH_ENABLE_MPS_FALLBACK", "CUDA_LAUNCH_BLOCKING"):
        monkeypatch.delenv(var, raising=False)
    code, out, err = run_cli(capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "torchdoctor env (this machine; availability inferred)"
    assert f"  torch         {torch.__version__}  build: cpu" in lines
    assert "  accelerators  none found" in lines or os.path.exists("/proc/driver/nvidia")
    assert "  available     no accelerator" in lines
    assert f"  device        cpu: no accelerator available: CPU-only build of torch {torch.__version__} (priority CUDA > XPU > MPS > CPU)" in lines
    assert "  dtype          storage     matmul      conv        layer_norm  softmax     sdpa        scaled_mm" in lines
    assert "  float32        yes         yes         yes         yes         yes         yes         -" in lines
    assert any(line.startswith("  recommended dtype: ") for line in lines)
    assert "findings: 0 error(s), 0 warning(s), 1 info" in lines
    assert any(line.startswith("  [info] cpu_only_build: CPU-only build of torch") for line in lines)


@pytest.mark.skipif(not CPU_ONLY_HERE, reason="describes a CPU-only build")
def test_cli_json_on_this_machine(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHDOCTOR_DEVICE", raising=False)
    code, out, _ = run_cli(capsys, "--json")
    doc = json.loads(out)
    assert code == 0
    assert set(doc) == {"schema", "facts", "findings", "device", "capabilities"} and doc["schema"] == "torchdoctor/env/1"
    assert doc["facts"]["torch"]["version"] == torch.__version__ and doc["facts"]["torch"]["build"] == "cpu"
    assert doc["device"]["device"] == "cpu" and "CPU-only build" in doc["device"]["reason"]
    assert doc["capabilities"] == capabilities("cpu")  # what `env` shows is the direct probe
    assert [f["code"] for f in doc["findings"]] == ["cpu_only_build"]


def test_json_then_facts_round_trip(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run_cli(capsys, "--json")
    doc = json.loads(out)
    whole, part = tmp_path / "env.json", tmp_path / "facts.json"
    whole.write_text(out)
    part.write_text(json.dumps(doc["facts"]))
    for path in (whole, part):
        again_code, again, _ = run_cli(capsys, "--json", "--facts", str(path))
        again_doc = json.loads(again)
        assert again_code == code
        assert again_doc["findings"] == doc["findings"]
        assert again_doc["device"] == doc["device"]
        assert again_doc["facts"] == complete_facts(doc["facts"])
    assert json.loads(run_cli(capsys, "--json", "--facts", str(whole))[1])["capabilities"] == doc["capabilities"]
    assert json.loads(run_cli(capsys, "--json", "--facts", str(part))[1])["capabilities"]["probed"] is False


def test_facts_from_standard_input(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(NVIDIA_MACHINE.read_text()))
    code, out, _ = run_cli(capsys, "--json", "--facts", "-")
    assert code == 1 and json.loads(out)["facts"]["drivers"]["nvidia"] == "570.133.20"


def test_saved_facts_of_a_broken_machine(capsys: pytest.CaptureFixture[str]) -> None:
    before = NVIDIA_MACHINE.read_bytes()
    code, out, _ = run_cli(capsys, "--facts", str(NVIDIA_MACHINE))
    assert NVIDIA_MACHINE.read_bytes() == before  # read-only
    assert code == 1
    assert "torchdoctor env (saved facts; availability inferred)" in out
    assert "  accelerators  nvidia NVIDIA GeForce RTX 4090 (24564 MiB) capability 8.9" in out
    assert "findings: 1 error(s), 1 warning(s), 0 info" in out
    assert "  [error] torchvision_torch_mismatch: torchvision 0.28.0+cu130 does not match torch 2.13.0+cpu" in out
    assert "  [warning] cpu_torch_with_nvidia: torch 2.13.0+cpu is a CPU-only build" in out
    assert "      Fix: pip install --force-reinstall torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" in out
    assert "capabilities: facts from another run" in out


@pytest.mark.parametrize("content, fragment", [
    (None, "cannot read facts file"),
    ("{not json", "is not valid JSON"),
    ('{"hello": 1}', "is not torchdoctor env JSON"),
    ("[1, 2]", "is not torchdoctor env JSON"),
])
def test_bad_facts_file_is_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                content: str | None, fragment: str) -> None:
    path = tmp_path / "facts.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run_cli(capsys, "--facts", str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("torchdoctor env: ") and fragment in err


def test_probe_and_facts_do_not_mix(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "--probe", "--facts", str(NVIDIA_MACHINE))
    assert code == 2 and "cannot be combined with --facts" in err


def test_probe_on_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--probe", "--json")
    doc = json.loads(out)
    assert doc["facts"]["probe"] is True and doc["facts"]["availability_source"] == "probe"
    if CPU_ONLY_HERE:
        assert code == 0 and doc["device"]["device"] == "cpu"
        assert doc["facts"]["probed"] == {"accelerator": {"type": None, "count": 0}}  # no cuda/xpu/mps compiled in


def test_env_report_api(monkeypatch: pytest.MonkeyPatch) -> None:
    saved = json.loads(NVIDIA_MACHINE.read_text())
    before = json.dumps(saved, sort_keys=True)
    environ = dict(os.environ)
    report = torchdoctor.env_report(saved)
    assert json.dumps(saved, sort_keys=True) == before and dict(os.environ) == environ  # read-only
    assert isinstance(report, EnvReport) and not report.ok and not report
    assert report.device is not None and report.device.device == torch.device("cpu")
    assert [f.code for f in report.findings] == ["torchvision_torch_mismatch", "cpu_torch_with_nvidia"]
    doc: dict[str, Any] = report.to_dict()
    assert torchdoctor.env_report(doc).findings == report.findings  # the whole document is accepted too
    assert str(report) == report.text()


def test_unusable_torchdoctor_device_is_reported_not_raised() -> None:
    report = env_report({"torch": {"version": "2.13.0+cpu", "build": "cpu"}, "env": {"TORCHDOCTOR_DEVICE": "cuda"}})
    assert report.device is None and report.choice["device"] is None
    assert "TORCHDOCTOR_DEVICE=cuda" in report.choice["reason"] and "CPU-only build" in report.choice["reason"]
    assert [f.code for f in report.findings][0] == "torchdoctor_device_unavailable"
    assert "device        none: cuda was requested" in report.text()

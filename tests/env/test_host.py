"""The torchvision trap (issue 27, point 10): PyPI's torchvision is a CUDA build with no ``+cu`` tag in its
version; beside a CPU torch ``import torchvision`` fails. env sees it from the wheel's files, without importing
it. Checked on the real PyPI wheel (``torchvision-0.28.0-cp311-...manylinux_2_28_x86_64.whl``), unpacked, never
installed; and ``env --markdown`` carries everything the text does."""

from __future__ import annotations

import glob
import importlib.metadata
import os
import zipfile
from pathlib import Path

import pytest

from torchdoctor._cli.main import main
from torchdoctor._env.host import extension_build, host_facts
from torchdoctor._env.report import env_report

WHEEL_DIRS = (os.environ.get("TORCHDOCTOR_WHEELS", ""), "/opt/pypi-more/files",
              os.path.expanduser("~/.cache/torchdoctor-wheels"))


def _pypi_torchvision() -> str:
    for d in WHEEL_DIRS:
        hits = sorted(glob.glob(os.path.join(d, "torchvision-0.2*-manylinux*_x86_64.whl"))) if d else []
        if hits:
            return hits[0]
    pytest.skip("no PyPI torchvision wheel on this machine: `pip download --no-deps torchvision==0.28.0 -d DIR` "
                "and set TORCHDOCTOR_WHEELS=DIR (nothing is downloaded by the suite)")


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheel = _pypi_torchvision()
    root = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if ".dist-info/" in name or name == "torchvision/_C.so":
                zf.extract(name, root)
    return root


def test_the_pypi_wheel_has_no_cuda_tag_but_its_files_say_cuda(unpacked: Path) -> None:
    dist = next(importlib.metadata.distributions(path=[str(unpacked)]))
    assert dist.metadata["Name"] == "torchvision" and "+" not in dist.version  # no +cu130 on PyPI
    files = [(str(p), str(dist.locate_file(p))) for p in dist.files or []]
    build, evidence = extension_build(files)
    assert build == "cuda" and evidence.startswith("its wheel bundles libcudart")
    # the extension alone says it too (a wheel repacked without its bundled libraries)
    build, evidence = extension_build([(p, r) for p, r in files if p == "torchvision/_C.so"])
    assert build == "cuda" and evidence == "torchvision/_C.so links libtorch_cuda"


def test_env_names_the_trap_beside_a_cpu_torch(unpacked: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(unpacked))
    version = importlib.metadata.version("torchvision")
    host = host_facts({"torchvision": version}, "cpu")
    assert host["wheels"]["torchvision"]["build"] == "cuda"
    facts = {"torch": {"version": "2.13.0+cpu", "build": "cpu"}, "packages": {"torch": "2.13.0+cpu",
             "torchvision": version}, "requires": {"torchvision": ["torch==2.13.0"]}, "host": host}
    findings = {f.code: f for f in env_report(facts=facts).findings}
    hit = findings["torchvision_torch_mismatch"]
    assert hit.severity == "error"
    assert f"torchvision {version} does not match torch 2.13.0+cpu: it is a CUDA build (its wheel bundles libcudart" \
        in hit.message and "and torch is a CPU build" in hit.message
    assert "operator torchvision::nms does not exist" in hit.message
    # a CUDA torch of that version is fine with it: the files are not even read
    assert host_facts({"torchvision": version}, "cuda")["wheels"] == {}


def test_a_cpu_torchvision_is_quiet() -> None:
    facts = {"torch": {"version": "2.13.0+cpu", "build": "cpu"}, "packages": {"torch": "2.13.0+cpu",
             "torchvision": "0.28.0+cpu"}, "host": {"wheels": {"torchvision": {"build": "cpu", "evidence": "x"}}}}
    assert "torchvision_torch_mismatch" not in {f.code for f in env_report(facts=facts).findings}
    assert extension_build([("torchvision/__init__.py", "/nonexistent")]) == (None, "no compiled extension found")


def test_markdown_carries_everything_the_text_does(capsys: pytest.CaptureFixture[str]) -> None:
    report = env_report()
    text, md = report.text(), report.markdown()
    f = report.facts
    for must in ("numpy " + f["packages"]["numpy"], "huggingface-hub " + f["packages"]["huggingface-hub"],
                 f["host"]["os"], "RAM ", "capabilities of cpu", "recommended dtype:", "bfloat16",
                 ", ".join(f["platform"]["cpu_flags"]) or "x86_64"):
        assert must in text and must in md, must
    table = [ln for ln in text.splitlines() if ln.startswith("  float") or ln.startswith("  bfloat16")]
    assert table and all(ln in md.splitlines() for ln in table)  # the dtype capability table, line for line
    assert main(["env", "--markdown"]) in (0, 1)
    assert "capabilities of cpu" in capsys.readouterr().out

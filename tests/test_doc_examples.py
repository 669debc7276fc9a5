"""Every ```python and ```bash block of README.md and docs/*.md runs as written (issue 42, point 2).

Python blocks run with a small, explicit namespace holding the tiny objects their prose names (`pipe`, `model`,
`x`, `opt`, `run_my_pipeline`, ...). Bash blocks run line by line through bash, in a temporary folder holding the
small files the lines name (model.safetensors, my_app.py, app.py, main.py, my_pkg/train.py, crash.log), with the
suite's venv first on PATH so `torchdoctor`, `python` and `pytest` are the installed ones. Lines that cannot run on
any test machine are the explicit list `CANNOT_RUN` in tests/support/doc_examples.py; hardware lines are marked on
the page with `# needs a GPU`, left out of their block's run and run apart, as written, on virtual devices (and
bare, where their error must say how to try them there). Every fence of every page is counted apart from the
extraction: a block that is neither python nor bash is named in `NOT_CODE` with why (an output, a synopsis), so no
block is skipped silently. Blocks that fail on pages this test's owner does not maintain are xfailed by
page and reason in `KNOWN_FAILING`, strictly, so a fix there shows up as XPASS.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor
from support import zoo
from support.doc_examples import NEEDS_GPU, PAGES, ROOT, Block, all_blocks, bash_commands, python_source

BLOCKS = all_blocks()
BIN = str(Path(sys.executable).parent)
TIMEOUT = 120

# page:line of a failing block on a page this test does not own -> why (strict xfail: a fix must remove the entry)
KNOWN_FAILING: dict[str, str] = {}


def _params(lang: str) -> list[Any]:
    out = []
    for b in BLOCKS:
        if b.lang != lang:
            continue
        marks = [pytest.mark.xfail(reason=KNOWN_FAILING[b.id], strict=True)] if b.id in KNOWN_FAILING else []
        out.append(pytest.param(b, id=b.id, marks=marks))
    return out


def test_the_pages_hold_the_examples_this_test_knows() -> None:
    # a renamed page or a dropped fence must not make this test pass by finding nothing
    ids = {b.id.split(":")[0] for b in BLOCKS}
    assert {"README.md", "docs/run.md", "docs/trace.md"} <= ids, ids
    assert sum(b.lang == "python" for b in BLOCKS) >= 3 and sum(b.lang == "bash" for b in BLOCKS) >= 3


# Every fenced block that is not python or bash, by page and its first line, with why it is not run: what a
# command printed, a synopsis, a tree. A block of another language that is not here fails the count below, so
# no block is skipped without a reason on this list.
NOT_CODE: dict[tuple[str, str], str] = {
    ("docs/architecture.md", "src/torchdoctor/"): "the source tree, not a command",
    ("docs/fixes.md", "Fix (proven: a virtual re-run with it applied has no problem left):"): "a report's output",
    ("docs/run.md", "torchdoctor run [--device cuda:1|xpu|mps] [--dtype D] [--profile P] [--count N] "
                    "[--mode explain|strict|fix|warn]"):
        "the usage synopsis (brackets are options)",
    ("docs/run.md", "[device] network: the LoRA network was not moved: `network.to(device)` (network.to('cuda:1')): 24 "
                    "tensors of"): "a summary's output",
    ("docs/run.md", "$ torchdoctor run --device cuda:0 main.py"):
        "a transcript of an app folder (tests/run/test_run_cli.py runs such an app: test_virtual_device_run_names_"
        "the_plugins_line_and_the_helper_that_moved_it)",
    ("docs/run.md", "memory cuda:0  needs 136 GiB on cuda:0, which has 80 GiB (NVIDIA H100 (virtual)); the largest "
                    "tensor is 0.weight (8.0 GiB): ..."): "a report's output",
    ("docs/gpu-agreement.md", "PYTHONPATH=src python bench/gpu_agreement.py --device cpu-check --out /tmp/agreement"):
        "the whole zoo (80 s): tests/gpu_agreement runs its --quick subset and the planted case as written",
    ("docs/gpu-agreement.md", "echo /.agreement-cpu/ >> .git/info/exclude"):
        "writes into the repository's .git: the maintainers' recipe for the GPU machine",
    ("docs/gpu-agreement.md", "PYTHONUNBUFFERED=1 PYTHONPATH=src timeout 500 python3 bench/gpu_agreement.py --out $OUT "
                              "--budget-s 420 --compare-with .agreement-cpu/gpu_agreement.json"):
        "runs on the GPU machine only",
}
_ANY_FENCE = re.compile(r"^[ \t]*(```|~~~)\s*([^\s`]*)")


def _every_fence(page: str) -> list[tuple[int, str, str]]:
    """(line, language, first line) of every fenced block of a page, whatever its language: counted apart from
    the extraction, so a block the extraction misses shows up as a difference."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _ANY_FENCE.match(lines[i])
        if m:
            start, lang = i, m.group(2)
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith(m.group(1)):
                i += 1
            first = lines[start + 1].strip() if start + 1 < i else ""
            out.append((start + 1, lang, first))
        i += 1
    return out


def test_every_block_of_every_page_is_run_or_named_with_its_reason() -> None:
    fences = {page: _every_fence(page) for page in PAGES}
    assert len(fences) == 1 + len(list((ROOT / "docs").glob("*.md")))
    run = {(b.page, b.line) for b in BLOCKS}
    unrun, missed = [], []
    for page, found in fences.items():
        for line, lang, first in found:
            if lang in ("python", "bash"):
                if (page, line) not in run:
                    missed.append(f"{page}:{line}")
            elif (page, first) in NOT_CODE:
                unrun.append((page, first))
            else:
                missed.append(f"{page}:{line} ```{lang} {first!r}: run it as python/bash, or name it in NOT_CODE")
    assert not missed, missed
    assert sorted(unrun) == sorted(NOT_CODE), set(NOT_CODE) - set(unrun)  # no stale entry
    # the count, pinned: a block added or dropped on a page is seen here first
    counts = {lang: sum(1 for f in fences.values() for _, lg, _ in f if (lg or "-") == lang) for lang in
              {(lg or "-") for f in fences.values() for _, lg, _ in f}}
    assert counts == {"python": 4, "bash": 3, "-": 5, "text": 1, "console": 3}, counts
    assert len(BLOCKS) == 7


# ---------------------------------------------------------------------------------------------- python blocks


class _Pipeline(nn.Module):
    """The reader's own pipeline: a plain tensor attribute that `Module.to` leaves behind."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.scale = torch.ones(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.scale


def run_my_pipeline() -> torch.Tensor:
    device = torchdoctor.pick_device()
    return _Pipeline().to(device)(torch.ones(2, 8, device=device))


def build_unet() -> Any:
    return zoo.tiny_unet(torch.bfloat16)


def inputs_on(device: str) -> dict[str, Any]:
    inputs = zoo.build("unet", torch.bfloat16).inputs
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A diffusers LoRA for the tiny UNet, written offline (peft adds the adapters, diffusers saves them)."""
    from diffusers import StableDiffusionPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    unet = zoo.tiny_unet(torch.bfloat16, seed=5)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k"], init_lora_weights=False))
    out = tmp_path_factory.mktemp("lora")
    StableDiffusionPipeline.save_lora_weights(str(out), unet_lora_layers=get_peft_model_state_dict(unet))
    return str(out)


@pytest.fixture()
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Any:
    """What torchrun gives one rank: its environment and an initialised process group (world size 1, gloo)."""
    import torch.distributed as dist

    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29500 + os.getpid() % 1000), "RANK": "0",
                 "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _namespace(lora_dir: str) -> dict[str, Any]:
    model = zoo.tiny_llama(torch.float32)
    x = torch.randint(3, 50, (1, 8))
    opt = torch.optim.Adam(model.parameters())
    model(x).logits.float().sum().backward()
    opt.step()
    return {
        "pipe": zoo.tiny_sd_pipeline(torch.bfloat16), "model": model, "x": x, "opt": opt, "lora_dir": lora_dir,
        "exception_or_log_text": "RuntimeError: Expected all tensors to be on the same device, but found at least "
                                 "two devices, cuda:0 and cpu!",
        "run_my_pipeline": run_my_pipeline, "build_unet": build_unet, "build_model": build_unet,
        "inputs_on": inputs_on,
    }


@pytest.mark.parametrize("block", _params("python"))
def test_python_block_runs_as_written(block: Block, lora_dir: str, one_rank: Any, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a block that writes map.html writes it here
    source = python_source(block)
    if "@pytest.mark" in source:
        _run_as_test_file(source, tmp_path)
        return
    ns = _namespace(lora_dir)
    exec(compile(source, block.id, "exec"), ns)  # noqa: S102 - the documented example is the code under test
    if "run_my_pipeline()" in source:  # raise_on_exit=False leaves the problems readable, by path
        assert [p.path for p in ns["sim"].problems] == ["scale"], ns["sim"].problems
    if "report" in ns and "map.html" in source:
        assert (tmp_path / "map.html").stat().st_size > 1000
    if "t" in ns and "who_moved" in source:
        assert ns["t"].records, "loading and unloading a LoRA under trace records its changes"


GPU_LINES = [(b, line.strip()) for b in BLOCKS if b.lang == "python" for line in b.text.splitlines()
             if NEEDS_GPU in line and not line.lstrip().startswith("#")]
_DEVICE = re.compile(r"""["'](cuda(?::\d+)?|xpu(?::\d+)?|mps)["']""")


def test_the_readme_marks_its_gpu_line() -> None:
    assert [line.split("(")[0] for _, line in GPU_LINES] == ["torchdoctor.move"], GPU_LINES


@pytest.mark.parametrize("block, line", [pytest.param(b, line, id=f"{b.id}:{line[:30]}") for b, line in GPU_LINES])
def test_a_gpu_line_runs_on_virtual_devices_and_says_how_without_them(block: Block, line: str, lora_dir: str) -> None:
    """A line marked `# needs a GPU` is skipped in its block's run; here it runs as written on virtual devices of
    the kind it names, and bare on this machine (which has none) its error says how to try it there."""
    device = _DEVICE.search(line)
    assert device, f"{block.id}: a GPU line names its device: {line}"
    ns = _namespace(lora_dir)
    imports = "\n".join(x for x in block.text.splitlines() if x.startswith(("import ", "from ")))
    exec(compile(imports, block.id, "exec"), ns)  # noqa: S102 - the block's own imports
    if not getattr(torch, device.group(1).split(":")[0]).is_available():
        with pytest.raises(torchdoctor.PlacementError) as err:
            exec(compile(line, block.id, "exec"), ns)  # noqa: S102 - the documented line is the code under test
        assert f"with torchdoctor.virtual_devices('{device.group(1)}'):" in str(err.value), str(err.value)
    with torchdoctor.virtual_devices(device.group(1)) as sim:  # a problem left raises on exit
        exec(compile(line, block.id, "exec"), ns)  # noqa: S102
    assert sim.problems == []
    assert {str(p.device) for p in ns["pipe"].unet.parameters()} == {device.group(1)}


def _run_as_test_file(source: str, tmp_path: Path) -> None:
    """A block of test functions runs as pytest runs it, with the plugin and the names its prose gives."""
    (tmp_path / "conftest.py").write_text("")
    prelude = textwrap.dedent("""
        import sys, torch
        sys.path.insert(0, %r)
        from support import zoo
        from test_doc_examples import build_unet, inputs_on
        model = zoo.tiny_llama()
        x = torch.randint(3, 50, (1, 8))
    """) % str(Path(__file__).parent)
    (tmp_path / "test_block.py").write_text(prelude + source)
    # in this process (torch, transformers and diffusers are imported already); importlib mode keeps the block's
    # module out of sys.modules, so it cannot shadow another test module
    code = pytest.main(["-q", "-p", "no:randomly", "-p", "no:cacheprovider", "--import-mode=importlib",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_block.py")])
    assert code == pytest.ExitCode.OK


# ------------------------------------------------------------------------------------------------ bash blocks

FILES: dict[str, str] = {
    "my_app.py": """
        import torch, torchdoctor
        from torch import nn

        def build_model():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))

        def build_pipe():
            return build_model()

        def build_target():
            return torchdoctor.Target(build_model(), (torch.ones(2, 8),))
    """,
    "app.py": """
        import torch
        from torch import nn
        model = nn.Sequential(nn.Linear(8, 8))
        model.to(torch.float64)
        print(model(torch.ones(1, 8, dtype=torch.float64)).shape)
    """,
    "main.py": """
        import sys, torch
        from torch import nn
        print("serving", sys.argv[1:])
        print(nn.Linear(4, 4)(torch.ones(1, 4)).shape)
    """,
    "my_pkg/__init__.py": "",
    "my_pkg/train.py": """
        import torch
        from torch import nn
        model = nn.Linear(4, 4).to("cuda:1")
        print(model(torch.ones(1, 4, device="cuda:1")).shape)
    """,
    "crash.log": """
          File "main.py", line 3, in <module>
        RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!
    """,
    "test_tiny.py": """
        import torch
        from torch import nn

        def test_forward():
            assert nn.Linear(4, 4)(torch.ones(1, 4)).shape == (1, 4)
    """,
}


# what a documented line must answer with the files above: (exit code, a fragment of its output); a line not
# listed here still must exit 0 or 1 without a traceback
PINNED: dict[str, tuple[int, str]] = {
    "torchdoctor scan model.safetensors": (0, "ok: no problems found"),
    "torchdoctor scan my_app.py:build_pipe --device cuda:0 --dtype bfloat16 --json":
        (1, '"schema": "torchdoctor/scan/1"'),
    "torchdoctor scan my_app.py:build_pipe --device cuda:1 --plan":
        (1, "0.weight  f32[8,8]@cpu -> f32[8,8]@cuda:1"),
    "torchdoctor scan my_app.py:build_pipe --html map.html": (0, "device map written to map.html"),
    "torchdoctor simulate my_app.py:build_target --device xpu --dtype bfloat16":
        (0, "ops on virtual xpu:0 in bfloat16"),
    "torchdoctor simulate my_app.py:build_model --profile t4": (0, "NVIDIA T4"),
    "python -m torchdoctor trace --moves --lora --file moves.jsonl app.py ARGS": (0, "by Sequential.to() at app.py:4"),
    "torchdoctor run main.py --listen": (0, "serving ['--listen']"),
    "torchdoctor run --device cuda:1 --profile a100 -m my_pkg.train ARGS": (0, "on virtual cuda:1 exited with 0"),
    "torchdoctor explain crash.log": (1, "device_mismatch"),
    "torchdoctor env --markdown": (0, "### Environment"),
    "pytest --torchdoctor=strict": (0, "every test runs under guard(mode='strict')"),
}


def _bare(command: str) -> str:
    return command.split(" #")[0].strip()


def test_every_pinned_line_is_still_on_a_page() -> None:
    # a line reworded on the page would otherwise fall back to the weaker "exit 0 or 1" check unnoticed
    lines = {_bare(c) for b in BLOCKS if b.lang == "bash" for c, _ in bash_commands(b)}
    assert set(PINNED) <= lines, sorted(set(PINNED) - lines)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("docs")
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text).lstrip())
    save_file({"layer.weight": torch.ones(4, 4, dtype=torch.bfloat16)}, str(root / "model.safetensors"))
    return root


@pytest.mark.parametrize("block", _params("bash"))
def test_bash_block_runs_as_written(block: Block, workdir: Path) -> None:
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "NO_COLOR": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    commands = [c for c, why in bash_commands(block) if why is None]
    # the lines are independent (each writes its own file, if any), so they start together: one torch import each
    procs = [subprocess.Popen(["bash", "-c", c], cwd=workdir, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for c in commands]
    failures = []
    for command, proc in zip(commands, procs):
        out, _ = proc.communicate(timeout=TIMEOUT)
        # 0 nothing found, 1 problems found; 2 (bad usage) or a traceback means the line does not run as written
        want, fragment = PINNED.get(_bare(command), (None, ""))
        if proc.returncode not in ((want,) if want is not None else (0, 1)) or fragment not in out or (
                "Traceback (most recent call last)" in out):
            failures.append(f"$ {command}\nexit {proc.returncode}\n{out[-1500:]}")
    assert not failures, "\n\n".join(failures)


def test_lines_that_cannot_run_are_named_by_the_explicit_list_or_the_marker() -> None:
    skipped = [(b.id, c, why) for b in BLOCKS if b.lang == "bash" for c, why in bash_commands(b) if why]
    assert skipped, "the README names make demo and pip install"
    assert {c.split()[0] for _, c, _ in skipped} <= {"make", "python", "pip", "git", "torchrun"} | (
        {c.split()[0] for _, c, _ in skipped if NEEDS_GPU in c}), skipped

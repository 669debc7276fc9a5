"""``torchdoctor run`` end to end: unmodified programs in a subprocess (under a timeout), as a user runs them.

Each program re-creates in a few lines a mechanism of the apps the reports come from: an executor that catches a
node's exception and logs it with its traceback (ComfyUI's "!!! Exception during processing !!!"), an app that logs
only the error's text (SD.Next), a helper of the app's own that replaces a parameter for a plugin (ComfyUI's
``comfy/utils.py`` set_attr), threads, argv, cwd and exit codes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TIMEOUT = 300
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchdoctor", "run", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=TIMEOUT)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


CATCHES_AND_LOGS = """
    import logging, os, sys, threading
    import torch
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    log = logging.getLogger("executor")
    print("argv", sys.argv, "cwd", os.getcwd(), "name", __name__, "path0", sys.path[0])
    model = torch.nn.Linear(4, 4).to(torch.bfloat16)

    def node():
        return model(torch.ones(2, 4))  # float32 input into a bfloat16 layer

    try:  # an executor that catches a node's error and logs it with the traceback
        node()
    except Exception:
        log.exception("!!! Exception during processing !!!")
    try:  # the same error again: explained once
        node()
    except Exception:
        log.exception("!!! Exception during processing !!!")
    worker = threading.Thread(target=node, name="worker")
    worker.start(); worker.join()
    threading.Thread(target=lambda: sys.exit(5)).start()  # sys.exit in a thread ends only that thread
    sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize(("code", "command_code"), [(0, 1), (3, 3)])
def test_caught_and_logged_errors_are_explained_once_and_the_exit_code_passes(tmp_path: Path, code: int,
                                                                             command_code: int) -> None:
    """The program's own failure code passes; a program that ends well after placement errors is 1 (problems
    found, as on every verb)."""
    script = write(tmp_path / "app" / "app.py", CATCHES_AND_LOGS)
    proc = run(str(script), str(code), "--flag", cwd=tmp_path)
    assert proc.returncode == command_code, proc.stderr
    assert f"argv ['{script}', '{code}', '--flag']" in proc.stdout
    assert f"cwd {tmp_path}" in proc.stdout and "name __main__" in proc.stdout
    assert f"path0 {script.parent}" in proc.stdout
    assert "ERROR !!! Exception during processing !!!" in proc.stderr  # the program's own logging still works
    summary = proc.stderr[proc.stderr.index("torchdoctor run:"):]
    assert summary.count("[dtype_mismatch]") == 1 and "(x3)" in summary  # twice logged, once in the thread
    assert "logged at app/app.py:10 in node" in summary
    assert "mat1 and mat2 must have the same dtype" in summary
    assert f"exited with {code}" in summary


def test_an_uncaught_error_prints_its_traceback_exits_1_and_is_explained(tmp_path: Path) -> None:
    script = write(tmp_path / "crash.py", """
        import torch
        model = torch.nn.Conv2d(3, 4, 3).to(torch.float16)
        model(torch.ones(1, 3, 8, 8))
    """)
    out = tmp_path / "report.json"
    proc = run("--file", str(out), str(script), cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "torchdoctor/_run" not in proc.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "torchdoctor/run/1" and doc["exit_code"] == 1 and not doc["ok"]
    (finding,) = doc["findings"]
    assert finding["how"] == "raised" and finding["where"] == "crash.py:4 in <module>"
    # explain's category for this text (CPU's conv names the bias): either of the two close ones
    assert finding["category"] in ("dtype_mismatch", "input_weight_type_mismatch")
    assert "Input type (float) and bias type (c10::Half)" in finding["error"]
    assert finding["culprit"] and "<root>" in finding["culprit"]  # guard named the module and the input


def test_text_logged_without_a_traceback_is_explained(tmp_path: Path) -> None:
    script = write(tmp_path / "webui.py", """
        import logging
        log = logging.getLogger("sd")
        try:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                               "cuda:0 and cpu!")
        except RuntimeError as e:  # an app that logs only the message
            log.error(f"Network load: {type(e).__name__}: {e}")
        print("still running")
    """)
    proc = run("--json", str(script), cwd=tmp_path)
    assert proc.returncode == 1  # the program ended well, a placement error was met
    text = proc.stdout
    assert text.startswith("still running\n")
    doc = json.loads(text[text.index("{"):])
    assert [f["category"] for f in doc["findings"]] == ["device_mismatch"]
    assert doc["findings"][0]["how"] == "logged"


def test_module_mode_gets_its_arguments(tmp_path: Path) -> None:
    write(tmp_path / "tool" / "__init__.py", "")
    write(tmp_path / "tool" / "__main__.py", """
        import sys
        print("argv", sys.argv[1:])
        sys.exit(3)
    """)
    proc = run("-m", "tool", "--x", "1", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "argv ['--x', '1']" in proc.stdout
    assert "no placement error" in proc.stderr


COMFY_HELPER = """
    import torch

    def set_attr_param(obj, attr, value):  # the app's helper that swaps a parameter for a plugin
        *parents, name = attr.split(".")
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, name, torch.nn.Parameter(value, requires_grad=False))
"""
PLUGIN = """
    import torch
    from comfy.utils import set_attr_param

    class PatchNode:
        def run(self, model):
            set_attr_param(model, "1.weight", model[1].weight.to("cpu"))  # the plugin's bug
            return model(torch.ones(2, 8, device="cuda"))
"""
COMFY_MAIN = """
    import importlib, logging, sys, traceback
    import torch
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # read at import by the app's model management, and on every model load
    stats = torch.cuda.memory_stats(torch.device("cuda", torch.cuda.current_device()))
    print("cuda", torch.cuda.is_available(), torch.cuda.device_count(), stats["reserved_bytes.all.current"],
          torch.cuda.get_device_properties(0).total_memory)
    sys.path.insert(0, "custom_nodes")
    node = importlib.import_module("pack").PatchNode()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to("cuda")
    print("active", torch.cuda.memory_stats()["active_bytes.all.current"])
    try:
        node.run(model)
    except Exception as e:
        logging.error("!!! Exception during processing !!! %s", e)
        logging.error(traceback.format_exc())
"""


def test_virtual_device_run_names_the_plugins_line_and_the_helper_that_moved_it(tmp_path: Path) -> None:
    write(tmp_path / "comfy" / "__init__.py", "")
    write(tmp_path / "comfy" / "utils.py", COMFY_HELPER)
    write(tmp_path / "custom_nodes" / "pack" / "__init__.py", PLUGIN)
    main = write(tmp_path / "main.py", COMFY_MAIN)
    out = tmp_path / "run.json"
    proc = run("--device", "cuda:0", "--profile", "t4", "--file", str(out), str(main), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # the program exited with 0; "1 problem(s) recorded" is exit 1
    assert f"cuda True 1 0 {15 * 1024**3}" in proc.stdout or "cuda True 1 0 " in proc.stdout
    assert "active 576" in proc.stdout  # two Linear(8, 8) in float32 on the virtual device
    doc = json.loads(out.read_text())
    assert doc["device"] == "cuda:0"
    (problem,) = [p for p in doc["problems"] if p["path"] == "1.weight"]
    assert problem["kind"] == "device" and problem["found"] == "cpu"
    assert problem["where"] == "custom_nodes/pack/__init__.py:8 in run"  # not comfy/utils.py, not torch
    # the trace's record of who replaced it: the helper call, credited to the plugin line that made it
    assert "set_attr_param()" in problem["trace"] and "custom_nodes/pack/__init__.py:7" in problem["trace"]
    summary = proc.stderr[proc.stderr.index("torchdoctor run:"):]
    assert "recorded at custom_nodes/pack/__init__.py:8 in run" in summary
    # every expectation says where it came from (issue 27), in the JSON and the text
    assert doc["expected"] == {"device": "cuda:0 (from --device)", "profile": "t4 (from --profile)"}
    assert "expected: device cuda:0 (from --device); profile t4 (from --profile)" in summary


def test_bad_usage_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, fragment in ((["missing.py"], "does not exist"), (["--device", "cpu", "x.py"], "virtual device"),
                           (["--dtype", "bfloat16", "x.py"], "give --device too"), ([], "needs a program")):
        write(tmp_path / "x.py", "print('ran')")
        proc = run(*args, cwd=tmp_path)
        assert proc.returncode == 2 and fragment in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and "ran" not in proc.stdout


def test_a_virtual_run_that_cannot_go_on_says_why_and_where(tmp_path: Path) -> None:
    # backward and optimizers run on virtual devices now; a custom op with no fake kernel still cannot
    script = write(tmp_path / "train.py", """
        import torch
        lib = torch.library.Library("tdtest_runstop", "DEF")
        lib.define("opaque(Tensor x) -> Tensor")
        lib.impl("opaque", lambda x: x * 2, "CPU")
        model = torch.nn.Linear(4, 4).to("cuda")
        y = torch.ops.tdtest_runstop.opaque(model(torch.ones(2, 4, device="cuda")))
        print("after opaque")
    """)
    proc = run("--device", "cuda:0", str(script), cwd=tmp_path)
    assert proc.returncode == 1 and "after opaque" not in proc.stdout
    assert "tdtest_runstop.opaque.default cannot be simulated" in proc.stderr and "no fake/meta kernel" in proc.stderr
    assert "recorded at train.py:7 in <module>" in proc.stderr and "the virtual run stopped early" in proc.stderr
    assert "Traceback" not in proc.stderr  # the run's own stop is not the program's error


def test_expected_dtype_is_said_as_the_session_parsed_it(tmp_path: Path) -> None:
    """`--dtype bf16` is judged as bfloat16, and the report says so (not the user's spelling)."""
    from torchdoctor._run.program import run as run_program

    script = write(tmp_path / "prog.py", "import torch\nprint(torch.zeros(2).dtype)\n")
    report = run_program(str(script), device="cuda:0", dtype="bf16", sources={"device": "--device", "dtype": "--dtype"})
    assert report.expected["dtype"] == "bfloat16 (from --dtype)"
    assert report.expected["device"] == "cuda:0 (from --device)"

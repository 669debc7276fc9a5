"""``torchdoctor run`` writes a virtual run's fix with the names the program holds (hunt V8, T18's class): a path the
program's ``model`` does not hold is written as the program's own name that does (``gen.mean``, ``net.pos_embed``);
what ``model`` holds, or what no name holds, stays as printed."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from run.test_run_cli import run, write
from torchdoctor._run.names import as_held, held_name


class Gen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.register_buffer("mean", torch.zeros(2))


def test_a_path_is_written_with_the_programs_own_name() -> None:
    model, gen, net = Gen(), Gen(), nn.Sequential(Gen())
    names = {"model": model, "gen": gen, "net": net, "torch": torch}
    assert held_name(".gen.mean.data", names) == "gen.mean.data"  # the path starts with a name of the program
    assert held_name(".fc.weight.data", names) is None  # the program's `model` holds it: as printed
    assert held_name(".fc.weight", {"net": Gen()}) == "net.fc.weight"  # no `model`: the module that has the path
    assert held_name("[0].mean", {"net": net}) == "net[0].mean"
    assert held_name(".nothing.here", names) is None  # nothing holds it: as printed
    fix = SimpleNamespace(kind="path", code="model.gen.mean.data = model.gen.mean.data.to('cuda:0')\n"
                                            "model.fc.bias.data = model.fc.bias.data.to('cuda:0')")
    (same,) = as_held([fix], names)
    assert same.code == "gen.mean.data = gen.mean.data.to('cuda:0')\nmodel.fc.bias.data = model.fc.bias.data.to('cuda:0')"
    advice = SimpleNamespace(kind="note", code="torchdoctor.move(model, 'cuda:0')")
    assert as_held([advice], names)[0].code == "torchdoctor.move(model, 'cuda:0')"



def test_a_component_cast_is_written_with_the_programs_own_name() -> None:
    # a float32 head put on a bf16 network after its cast (the program's `net`): the fix casts the component
    net = nn.Sequential(Gen(), nn.Linear(2, 2))
    names = {"net": net, "torch": torch}
    fix = SimpleNamespace(kind="path", code="model[1].to(torch.bfloat16)  # every floating tensor of 1 is float32")
    assert as_held([fix], names)[0].code == "net[1].to(torch.bfloat16)  # every floating tensor of 1 is float32"
    moved = SimpleNamespace(kind="path", code="torchdoctor.move(model[0].fc, 'cuda:0')")
    assert as_held([moved], names)[0].code == "torchdoctor.move(net[0].fc, 'cuda:0')"
    data = SimpleNamespace(kind="path", code="model[0].mean.data = model[0].mean.data.to('cuda:0')")
    assert as_held([data], names)[0].code == "net[0].mean.data = net[0].mean.data.to('cuda:0')"


RELOAD = """\
    import torch, torch.nn as nn

    class Gen(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.register_buffer("mean", torch.zeros(8))
        def forward(self, z):
            return self.fc(z) - self.mean

    model = Gen().to("cuda:0")  # the trained one
    model(torch.randn(2, 8, device="cuda:0"))
    gen = Gen()
    gen.load_state_dict(model.state_dict())
    gen.to(torch.bfloat16)  # the device forgotten
    gen(torch.randn(1, 8, device="cuda:0", dtype=torch.bfloat16))
"""


def test_run_names_a_reloaded_module_by_the_programs_name_not_as_a_part_of_model(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", RELOAD)
    proc = run("--device", "cuda:0", "--json", str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    doc = json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])
    code = "\n".join(f["code"] for f in doc["fixes"])
    assert "gen.mean" in code and "model.gen" not in code, code  # `model` is the other Gen: it has no `gen`


TWO_GPUS = """\
    import torch, torch.nn as nn
    a, b = nn.Linear(4, 4).to("cuda:0"), nn.Linear(4, 4).to("cuda:1")  # a deliberate split
    h = a(torch.randn(1, 4, device="cuda:0"))
    print(torch.cuda.device_count(), b(h.to("cuda:1")).device)
"""


def test_run_count_gives_the_program_two_gpus(tmp_path: Path) -> None:
    script = write(tmp_path / "split.py", TWO_GPUS)
    proc = run("--device", "cuda:0", "--count", "2", str(script), cwd=tmp_path)
    assert proc.returncode == 0 and "2 cuda:1" in proc.stdout, proc.stderr[-2000:]
    assert "no placement error; ran on cuda:0, cuda:1" in proc.stderr
    one = run("--device", "cuda:0", str(script), cwd=tmp_path)  # one device by default: cuda:1 does not exist
    assert one.returncode == 1 and "cuda:1 does not exist" in one.stderr
    bad = run("--count", "2", str(script), cwd=tmp_path)
    assert bad.returncode == 2 and "--dtype, --profile and --count describe the virtual device" in bad.stderr


IN_MAIN = """\
    import torch, torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("table", torch.ones(4))
        def forward(self, x):
            return self.lin(x) * self.table

    def main():
        with torch.device("cuda"):  # the buffer registered in __init__ under the device context
            net = Net()
        net.table = net.table.cpu()
        print(net(torch.randn(2, 4, device="cuda")).shape)

    if __name__ == "__main__":
        main()
"""


def test_run_names_a_model_held_only_by_a_function_by_that_functions_name(tmp_path: Path) -> None:
    # `net` is a local of main(), gone when the program ends: its name is read when its forward starts
    script = write(tmp_path / "app.py", IN_MAIN)
    proc = run("--device", "cuda:0", "--json", str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    doc = json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])
    code = "\n".join(f["code"] for f in doc["fixes"])
    assert "net.table" in code and "model." not in code, code


CAUGHT = """\
    import torch, torch.nn as nn
    base = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).to(torch.bfloat16)
    merged = base.requires_grad_(False)  # the same object under its new name (as peft's merge_and_unload returns)
    merged[2].float()  # a stray cast by hand
    try:
        merged(torch.randn(2, 16, dtype=torch.bfloat16))
    except RuntimeError as e:
        print("error:", e)
"""


def test_run_writes_guards_fix_with_the_programs_current_name(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", CAUGHT)
    proc = run("--json", str(script), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    doc = json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])
    (finding,) = doc["findings"]
    assert finding["fix_from"] == "guard"
    assert "merged[2].weight.data = merged[2].weight.data.to(torch.bfloat16)" in finding["fix"], finding["fix"]
    assert "model[" not in finding["fix"] and "base[" not in finding["fix"]


NODE = """\
    import logging
    import torch, torch.nn as nn

    class Head(nn.Module):
        def __init__(s):
            super().__init__(); s.enc = nn.Linear(8, 8); s.out = nn.Linear(8, 2)
        def forward(s, x): return s.out(s.enc(x))

    def run_node(x):
        net = Head().to(torch.bfloat16)
        net.out = nn.Linear(8, 2)  # a float32 head built after the cast
        return net(x.to(torch.bfloat16))

    try:  # an app's executor: the node's error logged, the app goes on
        run_node(torch.randn(2, 8))
    except Exception as e:
        logging.getLogger("app").error("!!! Exception during processing !!! %s", e, exc_info=True)
"""


def test_guards_fix_names_the_module_as_the_failing_function_holds_it(tmp_path: Path) -> None:
    script = write(tmp_path / "app.py", NODE)
    proc = run("--json", str(script), cwd=tmp_path)
    doc = json.loads(proc.stdout[proc.stdout.index('{\n  "schema"'):])
    (finding,) = doc["findings"]
    # fixed at the assignment: run keeps a trace
    assert "net.out = nn.Linear(8, 2).to(torch.bfloat16)" in finding["fix"], finding["fix"]
    assert "model." not in finding["fix"]

"""Objects built before a virtual run and moved inside it (a pytest fixture's model under
``@pytest.mark.simulate``): ``Module.to`` and ``param.data = ...to(device)`` must neither crash the interpreter nor
hide a leftover, and the real tensors carry no virtual label once the run is over."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import torchdoctor
from torchdoctor._placement import tensor_device
from torchdoctor._virtual.session import virtual_devices


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = torch.ones(8)  # a plain attribute: Module.to never moves it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def _run(body: str) -> subprocess.CompletedProcess[str]:
    """In a child: a crash of the interpreter must fail this test, not end the test session."""
    code = textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_module_to_of_a_model_built_before_the_run_finds_the_leftover() -> None:
    out = _run("""
        import torch, torchdoctor
        from torch import nn
        from torchdoctor._virtual.session import virtual_devices
        class S(nn.Module):
            def __init__(self):
                super().__init__(); self.lin = nn.Linear(8, 8); self.scale = torch.ones(8)
            def forward(self, x): return self.lin(x) * self.scale
        m = S()
        try:
            with virtual_devices("cuda:1"):
                m.to("cuda:1")
                m(torch.randn(2, 8, device="cuda:1"))
        except torchdoctor.PlacementError as e:
            print([p.path for p in e.problems][:1])
    """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "['scale']"


@pytest.mark.parametrize("data", ["cpu", "meta"])
def test_data_assignment_of_a_real_tensor_takes_the_device_for_the_run(data: str) -> None:
    m = _Scaled()
    with virtual_devices("cuda:1", data=data) as sim:
        m.to("cuda:1")
        m.scale.data = m.scale.data.to("cuda:1")  # the fix torchdoctor suggests, on a tensor made before the run
        assert m.scale.device == torch.device("cuda:1") and m.scale.is_cuda
        y = m(torch.randn(2, 8, device="cuda:1"))
        assert y.device == torch.device("cuda:1")
    assert sim.ok, sim.problems
    assert m.scale.device.type == "cpu" and tensor_device(m.scale).type == "cpu"  # no label outlives the run
    assert torch.equal(m.scale, torch.ones(8))


def test_data_assignment_of_a_real_parameter_in_another_dtype() -> None:
    lin = nn.Linear(8, 8)
    with virtual_devices("cuda:1") as sim:
        lin.weight.data = lin.weight.data.to("cuda:1", torch.bfloat16)
        lin.bias.data = lin.bias.data.to("cuda:1", torch.bfloat16)
        assert lin.weight.dtype == torch.bfloat16 and lin.weight.device == torch.device("cuda:1")
        lin(torch.randn(2, 8, device="cuda:1", dtype=torch.bfloat16))
    assert sim.ok, sim.problems


def test_a_real_tensor_left_on_cpu_is_still_reported() -> None:
    lin = nn.Linear(8, 8)
    with pytest.raises(torchdoctor.PlacementError) as info:
        with virtual_devices("cuda:1"):
            lin.weight.data = lin.weight.data.to("cuda:1")  # the bias stays behind
            lin(torch.randn(2, 8, device="cuda:1"))
    assert [p.path for p in info.value.problems][:1] == ["bias"]


def test_real_tensors_left_behind_are_named_once_by_path() -> None:
    m = _Scaled()  # built before the run and never moved: every tensor is a leftover, each named once
    with pytest.raises(torchdoctor.PlacementError) as info:
        with virtual_devices("cuda:1"):
            m(torch.randn(2, 8, device="cuda:1"))
    assert sorted(p.path for p in info.value.problems) == ["lin.bias", "lin.weight", "scale"]
    assert all("made in forward" not in p.message for p in info.value.problems)


def test_compiler_stance_is_restored_when_runs_in_threads_end_out_of_order() -> None:
    import threading

    import torch._dynamo

    torch.compile(nn.Linear(2, 2), backend="eager")  # dynamo is loaded: runs switch compiled code to eager
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    stances: list[str] = []

    def run_a() -> None:
        with virtual_devices("cuda:1", raise_on_exit=False):
            a_in.set()
            b_in.wait(60)
        a_out.set()

    def run_b() -> None:
        a_in.wait(60)
        with virtual_devices("cuda:1", raise_on_exit=False):
            b_in.set()
            a_out.wait(60)  # the first run ends while this one still runs
            stances.append(torch._dynamo.eval_frame._stance.stance)

    threads = [threading.Thread(target=run_a), threading.Thread(target=run_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert stances == ["force_eager"]  # still eager for the run that goes on
    assert torch._dynamo.eval_frame._stance.stance == "default"  # the last run to end restored it


def test_dynamo_first_imported_during_a_run_leaves_the_process_working() -> None:
    """accelerate's hooks and ``torch.arange(..., device=x.device)`` import ``torch._dynamo`` lazily: when that
    first happens inside a run, dynamo checks the signatures of the functions it replaces in graphs, including
    the one the run patches; a mismatch left dynamo half-imported and every later ``torch.compile`` broken."""
    out = _run("""
        import sys, torch, torchdoctor
        from torch import nn
        assert "torch._dynamo" not in sys.modules
        m = nn.Linear(4, 4)
        def call(model):
            import torch._dynamo  # first import, inside the run
            x = torch.randn(2, 4, device="cuda:1")
            model.to("cuda:1")
            return model(x)
        print(torchdoctor.simulate(m, device="cuda:1", call=call).ok)
        f = torch.compile(lambda x: x * 2, backend="eager")
        print(f(torch.ones(2)).tolist())
        print(torch._has_compatible_shallow_copy_type.__qualname__)  # torch's own again
    """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "[2.0,", "2.0]",
                                  "_VariableFunctionsClass._has_compatible_shallow_copy_type"], out.stdout + out.stderr[-2000:]

"""The maker of a tensor's dtype is the line that chose the dtype (a cast, a factory), not the op that made the tensor
in the dtype it had before: ``x.to(device, dtype=weight_dtype)`` handed to an fp32 layer (kohya's ``--no_half_vae``
inpainting path), a host cast ``(img * 2).to(weight_dtype)`` moved later, ``img.half().to(device)``. The fix is written
at that line with the device kept as written, proven at the failing op; never a no-op ``dtype=torch.float32`` given
to the ``torch.rand`` that made the float32 data."""

from __future__ import annotations

import sys

import torch
from torch import nn

import torchdoctor
from torchdoctor._virtual.castsites import CastSite, _read_from, patched_line

WEIGHT_DTYPE = torch.float16


def _line(text: str) -> int:
    with open(__file__, encoding="utf-8") as fh:
        return next(i for i, line in enumerate(fh, 1) if text in line and "_line(" not in line)


def _one_dtype_problem(sim: object) -> str:
    problems = getattr(sim, "problems")
    assert [p.kind for p in problems] == ["dtype"], [p.message for p in problems]
    return str(problems[0].message)


def test_a_cast_in_the_move_is_the_maker_and_the_fix_keeps_its_device() -> None:
    net = nn.Conv2d(3, 4, 3)
    img = torch.rand(1, 3, 8, 8)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        net.to("cuda:0")
        masked = img * 2
        net(masked.to("cuda:0", dtype=WEIGHT_DTYPE))  # the cast that chose float16
    line = _line("# the cast that chose float16")
    message = _one_dtype_problem(sim)
    assert 'made by `to("cuda:0", dtype=WEIGHT_DTYPE)` at ' in message, message
    assert f"test_cast_line_maker.py:{line})" in message, message
    assert "Tensor.mul" not in message and "torch.rand" not in message
    assert len(sim.fixes) == 1, [f.code for f in sim.fixes]
    fix = sim.fixes[0]
    assert fix.proven, fix.tried
    assert fix.diff is not None and '+        net(masked.to("cuda:0", dtype=torch.float32))' in fix.diff, fix.diff
    assert "torch.rand(1, 3, 8, 8, dtype=" not in fix.diff


def test_a_host_cast_moved_later_is_the_maker_never_the_factory_before_it() -> None:
    net = nn.Linear(8, 4)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        net.to("cuda:0")
        feats = torch.rand(2, 8)
        half = (feats * 2).to(WEIGHT_DTYPE)  # a host cast, moved on the next line
        net(half.to("cuda:0"))
    line = _line("# a host cast, moved on the next line")
    message = _one_dtype_problem(sim)
    assert "made by `to(WEIGHT_DTYPE)` at " in message and f"test_cast_line_maker.py:{line})" in message, message
    fix = sim.fixes[0]
    assert fix.proven and fix.diff is not None, (fix.code, fix.tried)
    assert "+        half = (feats * 2).to(torch.float32)" in fix.diff, fix.diff
    assert "torch.rand(2, 8, dtype=" not in fix.diff  # torch.rand made float32 already: no no-op fix


def test_a_half_method_before_the_move_is_the_maker() -> None:
    net = nn.Linear(8, 4)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        net.to("cuda:0")
        feats = torch.rand(2, 8)
        net(feats.half().to("cuda:0"))  # .half() chose the dtype
    line = _line("# .half() chose the dtype")
    message = _one_dtype_problem(sim)
    assert "made by `half()` at " in message and f"test_cast_line_maker.py:{line})" in message, message
    assert sim.fixes[0].proven and "torch.rand(2, 8, dtype=" not in (sim.fixes[0].diff or "")


def test_an_argument_still_on_the_cpu_keeps_one_fix_for_device_and_dtype() -> None:
    net = nn.Linear(8, 4)
    x = torch.randn(2, 8)
    with torchdoctor.virtual_devices("cuda:0", raise_on_exit=False) as sim:
        net.to("cuda:0")
        net(x.to(WEIGHT_DTYPE))  # cast, never moved
    assert sorted(p.kind for p in sim.problems) == ["device", "dtype"]
    assert all("made by `to(WEIGHT_DTYPE)` at " in p.message for p in sim.problems)
    assert sim.error().fix == "# pass input 0 (input) as tensor.to('cuda:0', torch.float32)"


def test_the_patched_cast_rewrites_only_the_dtype(tmp_path: object) -> None:
    from pathlib import Path

    src = Path(str(tmp_path)) / "app.py"
    lines = ['y = x.to(device, dtype=weight_dtype)\n', 'y = x.to("cuda:0", weight_dtype, non_blocking=True)\n',
             'y = x.to(weight_dtype, non_blocking=True)\n', 'y = x.to(weight_dtype)\n', 'y = x.half()\n']
    src.write_text("".join(lines))
    want = ['y = x.to(device, dtype=torch.float32)', 'y = x.to("cuda:0", torch.float32, non_blocking=True)',
            'y = x.to(torch.float32, non_blocking=True)', 'y = x.to(torch.float32)', 'y = x.to(torch.float32)']
    for i, expected in enumerate(want, 1):
        site = CastSite(f"app.py:{i}", str(src), i, lines[i - 1].strip(), "", torch.float16)
        assert patched_line(site, torch.float32) == expected


def test_a_dtype_written_out_is_read_from_nothing() -> None:
    """``x.to(torch.float16)`` where ``torch`` is a name of the frame (a module's top level): no "attribute of
    module" said."""
    torch_here = sys.modules["torch"]
    frame = sys._getframe()
    site = CastSite("app.py:1", __file__, 1, "y = x.to(torch_here.float16)", "to(torch_here.float16)", torch.float16)
    _read_from(site, frame)
    assert torch_here is torch and site.read_from is None and site.attr is None

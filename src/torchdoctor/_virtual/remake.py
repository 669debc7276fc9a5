"""A factory fix applied in a proof's re-run: the call at that line of the program (``torch.rand(1, 8)`` at
``app.py:23``) makes its tensor as the fix says (``device=`` / ``dtype=`` given, a host-data maker moved after it),
so a fix written as a change of the program's line is proven by running the program with that line changed, never
assumed. Only the re-run's own calls at those lines are changed, while it runs (a function mode, left on exit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

_HOST = frozenset({"from_numpy", "frombuffer", "from_dlpack"})  # no device=: moved after the call
_MOVES = frozenset({"cuda", "to", "xpu", "mps", "cpu"})  # a move at a fixed line (``moveline``): then to the device


class _Remade(torch.overrides.TorchFunctionMode):
    def __init__(self, lines: dict[tuple[str, int, str], tuple[Any, Any]]) -> None:
        super().__init__()
        self.lines = lines
        self.names = {name for _, _, name in lines}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", None)
        if name not in self.names:
            return func(*args, **kwargs)
        from torchdoctor._virtual.origin import user_frame

        f = user_frame(2)
        want = self.lines.get((f.f_code.co_filename, f.f_lineno, name)) if f is not None else None
        if want is None:
            return func(*args, **kwargs)
        device, dtype = want
        if name in _MOVES and args and isinstance(args[0], torch.Tensor):  # the line's move sends it there
            out = func(*args, **kwargs)
            return out.to(device) if isinstance(out, torch.Tensor) and device is not None else out
        if device is not None and name not in _HOST:  # given first: ``device="cuda"`` on a CPU-only build fails
            kwargs["device"] = device
        out = func(*args, **kwargs)
        if dtype is not None and dtype.is_floating_point and isinstance(out, torch.Tensor) and \
                not out.is_floating_point():
            dtype = None  # an index made beside the float (``torch.tensor([1, 2])``): not the call the fix names
        if name in _HOST:
            return out if device is None and dtype is None else out.to(*(x for x in (device, dtype) if x is not None))
        if dtype is None:
            return out
        kwargs["dtype"] = dtype
        return func(*args, **kwargs)


def lines_of(fixes: Sequence[Fix]) -> dict[tuple[str, int, str], tuple[Any, Any]]:
    """(file, line, factory name) -> (device, dtype) each factory fix sets."""
    return {f.remake[:3]: f.remake[3:] for f in fixes if f.remake is not None}


@contextlib.contextmanager
def remade(fixes: Sequence[Fix]) -> Iterator[None]:
    """While a re-run runs: each factory call a fix changes makes its tensor as the fix says (and the factories of
    a call a fix gives its missing ``device=``: ``callsite``)."""
    from torchdoctor._virtual.builtat import rebuilt
    from torchdoctor._virtual.callsite import recalled
    from torchdoctor._virtual.globaldev import reglobals
    from torchdoctor._virtual.intread import float_reads
    from torchdoctor._virtual.libout import outputs_cast
    from torchdoctor._virtual.operandfix import reoperated

    lines = lines_of(fixes)
    with recalled(fixes), reglobals(fixes), rebuilt(fixes), reoperated(fixes), float_reads(fixes), \
            outputs_cast(fixes), _host(lines), _Remade(lines) if lines else contextlib.nullcontext():
        yield


@contextlib.contextmanager
def _host(lines: dict[tuple[str, int, str], tuple[Any, Any]]) -> Iterator[None]:
    """Host-data makers (``torch.from_numpy``) are not seen by a function mode: while the re-run runs, the call at a
    fixed line is followed by the fix's ``.to(...)``, as its diff writes it; torch's own function is put back after
    (any other call passes through unchanged)."""
    from torchdoctor._virtual.origin import user_frame

    host = {k: v for k, v in lines.items() if k[2] in _HOST}
    saved: dict[str, Any] = {}
    for name in {n for _, _, n in host}:
        orig = getattr(torch, name, None)
        if orig is None:
            continue

        def made(*args: Any, _orig: Any = orig, _name: str = name, **kwargs: Any) -> Any:
            out = _orig(*args, **kwargs)
            f = user_frame(1)
            want = host.get((f.f_code.co_filename, f.f_lineno, _name)) if f is not None else None
            if want is None or not isinstance(out, torch.Tensor):
                return out
            return out.to(*(x for x in want if x is not None))

        saved[name] = orig
        setattr(torch, name, made)
    try:
        yield
    finally:
        for name, orig in saved.items():
            setattr(torch, name, orig)

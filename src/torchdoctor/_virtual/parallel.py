"""``nn.DataParallel`` across virtual GPUs: the collective copies a CUDA build does in C++, done as virtual moves.

A program that sees more than one GPU may wrap its model in ``DataParallel`` by itself: ``transformers.Trainer``
does whenever ``torch.cuda.device_count() > 1``, and a run on ``cuda:1`` shows two GPUs. DataParallel's Python
(scatter, replicate, parallel_apply in threads, gather, and their backward) runs unchanged; only the four copies it
asks of ``torch._C`` are missing from a CPU build. Each is given here in terms of the program's own ops, so every
piece lands on its virtual device and is checked like any move (a replica's parameters on ``cuda:1``, the output
gathered on ``cuda:0``), and with ``data="cpu"`` the numbers are those of one device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def _device(index: Any) -> torch.device:
    if isinstance(index, torch.device):
        return index
    return torch.device("cpu") if index is None or int(index) < 0 else torch.device("cuda", int(index))


def _scatter(tensor: torch.Tensor, devices: Sequence[int], chunk_sizes: Sequence[int] | None, dim: int,
             streams: Any = None) -> tuple[torch.Tensor, ...]:
    pieces = tensor.split(list(chunk_sizes), dim) if chunk_sizes else tensor.chunk(len(devices), dim)
    return tuple(p.contiguous().to(_device(d)) for p, d in zip(pieces, devices))


def _gather(tensors: Sequence[torch.Tensor], dim: int, destination: Any = None, out: Any = None) -> torch.Tensor:
    target = out.device if out is not None else _device(destination)
    result = torch.cat([t.to(target) for t in tensors], dim)
    if out is not None:
        out.copy_(result)
        return out
    return result


def _broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Sequence[int],
                         buffer_size: int = 0) -> list[list[torch.Tensor]]:
    # one list per device, the first device's copies included (C++ returns the sources themselves there)
    return [[t if t.device == _device(d) else t.to(_device(d)) for t in tensors] for d in devices]


def _broadcast_out(tensor: torch.Tensor, out: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
    for o in out:
        o.copy_(tensor.to(o.device))
    return out


def install(installs: Any) -> None:
    """The run's answers for ``torch._C``'s multi-GPU copies (seen only by the run's own threads)."""
    for name, fn in (("_scatter", _scatter), ("_gather", _gather), ("_broadcast_coalesced", _broadcast_coalesced),
                     ("_broadcast_out", _broadcast_out)):
        if not hasattr(torch._C, name):
            installs.set(torch._C, name, fn)

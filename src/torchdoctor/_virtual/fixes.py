"""The fix of a virtual run as code (``simulate``'s report and the pytest marker's error): guard's generator over
the tensors found by path and the sources of tensors made in the run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._placement import device_str, parse_device, parse_dtype
from torchdoctor._report.model import Problem

_NAMED = ("parameter", "buffer", "quant_state", "attribute", "container")


def fix_for(problems: Sequence[Problem], device: torch.device, dtype: torch.dtype | None,
            sources: dict[tuple[str, ...], tuple[str, ...]] | None = None) -> str | None:
    """The fix as code, from guard's generator: the named tensors cast or moved (``torchdoctor.move`` for many),
    the model tensors a wrong tensor made in the run came from, tensors the test made passed on the right device;
    then what no cast of a tensor fixes. The lines never contradict each other: weights on meta are loaded before
    anything is moved (moving them raises), and a dtype the device cannot compute in is replaced by one that does
    not outgrow its memory. None when nothing but memory is wrong (that problem's message is its own fix)."""
    from torchdoctor._guard.maps import fix_code

    memory = [p for p in problems if p.kind == "memory"]
    problems = [p for p in problems if p.kind != "memory"]
    if not problems:
        return None
    culprits: list[tuple[str | None, str, str, Any]] = []
    factories: list[str] = []
    named = {p.path for p in problems if p.role in _NAMED}
    meta = [p for p in problems if p.kind == "meta"]
    ran = [p for p in problems if p.role == "run"]  # the run's own weights were in another dtype than asked
    for p in problems:
        if p.kind not in ("device", "dtype") or p.role == "run":
            continue  # meta: no move fixes it (below)
        try:
            target: Any = parse_dtype(p.expected) if p.kind == "dtype" else parse_device(p.expected)
        except (ValueError, TypeError, RuntimeError):
            target = dtype if p.kind == "dtype" else device
        made_from = (sources or {}).get((p.kind, p.path, p.op or "", p.found), ())
        if made_from and made_from[0].startswith("moved "):  # a copy moved inside the forward: fixed at that line
            name, at = made_from[0][6:].split(" at ", 1)
            factories.append(f"# {at} moves {name} to {p.found} inside the forward: move it to the device of the "
                             f"tensors it meets (e.g. .to(x.device)) instead")
            continue
        if p.role in _NAMED:
            _add(culprits, p.path, p.path, p.kind, target)
            continue
        if made_from and made_from[0].startswith("factory "):
            if made_from[0] not in named:
                named.add(made_from[0])
                factories.append(f"# {made_from[0][8:]} made it on {p.found}: pass device= the input's device "
                                 f"({made_from[0][8:].split(' ', 1)[0]}(..., device=x.device))")
            continue
        if made_from:  # fix the source: the tensor made from it follows
            for src in made_from:
                named.add(src)
                _add(culprits, None if src.startswith(("input ", "kwarg ")) else src, src, p.kind, target)
            continue
        if any(q.role in _NAMED and q.kind == p.kind and q.found == p.found for q in problems):
            continue  # a named culprit above holds this value: fixing it fixes what was made from it
        where = "on" if p.kind in ("device", "meta") else "in"
        culprits.append((None, f"the tensors made {where} {p.found}", p.kind, target))
    lines: list[str] = []
    if meta:  # moving a meta tensor raises "Cannot copy out of meta tensor": the weights are loaded first
        lines.append(f"# {len(meta)} tensor{'s are' if len(meta) > 1 else ' is'} on meta (no data, e.g. "
                     f"{meta[0].path}): load the weights onto the device, e.g. "
                     "model.load_state_dict(state_dict, assign=True) or from_pretrained(..., device_map=...)")
    moves = [fix_code(culprits) or "", *factories]
    if meta and any(line for line in moves):
        lines.append("# then, with the weights loaded:")
    lines += moves
    lines += [f"model.to(torch.{p.expected})  # the code ran with {p.found} weights: cast them so the run checks "
              f"{p.expected}" for p in ran[:1]]
    unsupported = sorted({p.found for p in problems if p.kind == "unsupported_dtype"})
    if unsupported:
        lines.append(_instead(unsupported, device, bool(memory)))
    packed = [p for p in problems if p.kind == "quant_incomplete" and p.found == "cpu-packed"]
    if packed:  # Params4bit.to keeps bitsandbytes' CPU layout; only .cuda() / .xpu() unpack it (move refuses it)
        call = {"cuda": "cuda", "xpu": "xpu"}.get(device.type)
        lines.append(f"model.{call}({device.index or 0})  # unpacks bitsandbytes' CPU-packed 4-bit layout "
                     f"({packed[0].path}); .to() keeps it" if call else
                     f"# reload the model: bitsandbytes' CPU-packed 4-bit layout ({packed[0].path}) runs on cpu only")
    ops = {p.found for p in problems if p.kind == "unsupported_op"}
    if "Tensor.backward" in ops:
        lines.append("# backward() is not simulated: simulate the forward and its loss; run the training step on "
                     "the real device")
    if ops - {"Tensor.backward"}:
        lines.append("# an op without a meta/fake kernel ran: it cannot be simulated; skip it under the marker")
    attrs = sorted({p.path for p in problems if p.role == "attribute" and p.kind == "device"})
    if attrs:  # the cast above fixes this model; a buffer is moved by every later .to()
        lines.append(f"# lasting fix: register {', '.join(attrs[:3])}{' …' if len(attrs) > 3 else ''} as a buffer "
                     "in its module's __init__ (self.register_buffer(name, tensor, persistent=False)): Module.to "
                     "moves buffers, never plain attributes")
    if memory and any(line and not line.startswith("#") for line in lines):  # the lines above do not make it fit
        m = memory[0]
        lines.append(f"# still too large: it needs {m.found} on {m.path}, which has {m.expected.lstrip('<= ')}; load "
                     "it quantized (bitsandbytes) or offload (device_map='auto')")
    return "\n".join(line for line in lines if line) or f"torchdoctor.move(model, {device_str(device)!r})"


def _add(culprits: list[tuple[str | None, str, str, Any]], path: str | None, label: str, kind: str,
         target: Any) -> None:
    """One culprit per tensor: a tensor wrong in device and in dtype gets one ``.to(device, dtype)``, not a move
    that leaves the dtype wrong (the fix of its second problem)."""
    for i, (p, lab, k, t) in enumerate(culprits):
        if lab != label:
            continue
        have = t if isinstance(t, tuple) else (t,)
        if kind == k or any(type(x) is type(target) for x in have):
            return
        both = tuple(sorted((*have, target), key=lambda v: isinstance(v, torch.dtype)))  # device first
        culprits[i] = (p, lab, "device" if "device" in (k, kind) else k, both)
        return
    culprits.append((path, label, kind, target))


_SAME_SIZE = {"bfloat16": "float16", "float16": "bfloat16", "float64": "float32"}


def _instead(unsupported: list[str], device: torch.device, over_memory: bool) -> str:
    """The dtype to run in when the device cannot compute in ``unsupported``: one of the same size first (bf16 ->
    fp16 on a T4), so the fix never asks a model that already exceeds the device's memory to double it."""
    for name in unsupported:
        other = _SAME_SIZE.get(name)
        if other is not None and other not in unsupported:
            return f"model.to(torch.{other})  # {device.type} cannot compute in {name}; {other} has the same size"
    if over_memory:
        return (f"# {device.type} cannot compute in {', '.join(unsupported)} and the model already exceeds its "
                "memory: float32 would double it; load it quantized (bitsandbytes) or offload")
    return f"model.to(torch.float32)  # {device.type} cannot compute in {', '.join(unsupported)}"

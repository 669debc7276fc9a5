"""explain: a fix that hands the failing module an argument in another dtype or on another device (``# pass x as
tensor.to(torch.bfloat16)``), proven on the failing module itself: it is called again, under ``no_grad``, on the
inputs it failed on with those tensors cast or moved. strict proves the same fix at the failing op; explain only
learns of the failure after the op raised, so the module's own call is what it can re-run. A fix the re-run does not
clear, or whose tensors the module was not handed directly, is labelled unproven with what was tried."""

from __future__ import annotations

from torchdoctor._guard import trialcopy as copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from torchdoctor._placement import device_str, dtype_str


def prove_args(mod: Any, inputs: Sequence[Any], culprits: Sequence[tuple[str, torch.Tensor]], want: Any) -> str:
    """The failing module called on ``inputs`` with each culprit tensor among them (by identity) sent to ``want``
    (a dtype or a device); the "fix proven" / "fix unproven" line."""
    shown = dtype_str(want) if isinstance(want, torch.dtype) else device_str(want)
    names = ", ".join(name for name, _ in culprits)
    label = type(mod).__name__
    if not isinstance(mod, nn.Module) or not inputs:
        return f"fix unproven: the inputs of the failing {label} are not known, so {names} -> {shown} was not re-run"
    ids = {id(t) for _, t in culprits}
    if not any(id(x) in ids for x in inputs):
        return f"fix unproven: {names} reaches {label} through other values (it is not one of its inputs), so the " \
               f"cast alone was not re-run"
    from torchdoctor._guard.component import copyable

    if not copyable(mod):
        return f"fix unproven: {label} is too large to re-run on a copy with {names} -> {shown}"
    try:  # on a copy: a re-run must not touch the program's module (a norm's running statistics)
        with torch.no_grad():
            copy.deepcopy(mod)(*[x.to(want) if id(x) in ids else x for x in inputs])
    except Exception as exc:  # the trial's own failure is the answer, never a crash of the report
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"fix unproven: {label} re-run with {names} -> {shown}: {type(exc).__name__}: {first}"[:400]
    return f"fix proven: {label} runs on the inputs it failed on with {names} -> {shown}"


def proof_line(session: Any, mod: Any, root: Any, culprits: Sequence[tuple[str, torch.Tensor]], want: Any) -> str:
    """``prove_args`` on the failing module; where the culprits reach it through other values (``self.lin(x * 2)``)
    and are the model call's own positional inputs, and no other of those inputs has their dtype, the whole forward
    re-run on a copy with them cast (``component.prove_whole``: it casts the inputs of that dtype, here exactly the
    fix's) proves the fix instead."""
    line = prove_args(mod, tuple(session.frames.inputs_of(mod)) if mod is not None else (), culprits, want)
    if line.startswith("fix proven") or not isinstance(root, nn.Module) or not isinstance(want, torch.dtype):
        return line
    top = list(session.frames.inputs_of(root))
    ids = {id(t) for _, t in culprits}
    found = {t.dtype for _, t in culprits}
    if len(found) != 1 or not all(any(t is x for x in top) for _, t in culprits) or any(
            isinstance(x, torch.Tensor) and id(x) not in ids and x.dtype in found for x in top):
        return line
    from torchdoctor._guard import component

    tried = f"{', '.join(name for name, _ in culprits)} -> {dtype_str(want)}"
    whole = component.prove_whole(session, root, lambda m: None, tried, (next(iter(found)), want))
    return whole if whole is not None and whole.startswith("fix proven") else line


def at_call(proof: str, tb: Any, mod: Any, kind: str, odd: Any, aim: Any, fix: str | None) -> tuple[Any, str | None]:
    """(aim, fix) with the caller's argument fixed where the program's own line hands it to the model (``model(
    images.to(next(model.parameters()).dtype))``, a diff) when ``proof`` proved the failing module runs with it so;
    else as they were. ``odd``: the argument's tensor."""
    if not proof.startswith("fix proven") or aim is not None or not isinstance(odd, torch.Tensor):
        return aim, fix
    from torchdoctor._guard.remedy import Aim
    from torchdoctor._guard.usecall import use_site
    from torchdoctor._placement import norm_device, tensor_device
    from torchdoctor._report.diff import line_patch

    other: Any = odd.dtype if kind == "dtype" else norm_device(tensor_device(odd))
    site = use_site(tb, mod, kind, other)
    patch = line_patch(site.file, site.line, site.new) if site is not None and not site.cast else None
    if site is None or patch is None:
        return aim, fix
    said = dtype_str(other) if kind == "dtype" else device_str(other)
    verb = "cast to its dtype" if kind == "dtype" else "moved to its device"
    code = f"{site.new}  # {', '.join(site.names)} handed to {site.recv} in {said}: {verb} where the program hands it over"
    return Aim([], code, patch, proof, []), code

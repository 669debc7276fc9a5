"""A GradScaler over parameters that are not float32. ``ValueError: Attempting to unscale FP16 gradients.``: the
parameters being trained are float16 themselves (the model was cast: ``model.half()``, ``.to(torch.float16)``).
``"_amp_foreach_non_finite_check_and_unscale_cuda" not implemented for 'BFloat16'``: they are bfloat16, which CUDA's
unscale has no kernel for, and which needs no loss scaling at all. Explained with those parameters by path, the line
that cast the model when the user's frames show it, and the fix mixed precision means: float32 master weights,
float16 compute under autocast (or bfloat16 with no scaler). strict / fix / warn tell the bfloat16 case before the
unscale runs, on a CPU too (whose kernel takes bfloat16): the same program fails on the GPU.
"""

from __future__ import annotations

import ast
import os
import types
from typing import Any

import torch

_CASTS = {"half", "to", "type"}


def explain_scaler(session: Any, exc: BaseException, tb: types.TracebackType | None) -> Any:
    """The report (a ``PlacementError``) of a GradScaler refusing float16 or bfloat16 gradients, or None for any
    other error."""
    text = str(exc)
    dtype = torch.float16 if "unscale FP16 gradients" in text else torch.bfloat16 if (
        "non_finite_check_and_unscale" in text and "BFloat16" in text) else None
    if dtype is None:
        return None
    from torchdoctor._guard.frames import user_frames

    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return _report(session, dtype, user_frames(exc.__traceback__ or tb), f"{type(exc).__name__}: {first}")


UNSCALE = torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default


def check_unscale(session: Any, args: Any) -> None:
    """strict / fix / warn, before a GradScaler's unscale runs: bfloat16 gradients raise (strict, fix) or warn once
    (warn) — CUDA has no unscale kernel for them, whatever this machine's CPU kernel accepts."""
    grads = args[0] if args and isinstance(args[0], (list, tuple)) else ()
    if session.replaying or not any(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in grads):
        return
    from torchdoctor._guard.frames import user_frames

    err = _report(session, torch.bfloat16, user_frames(), None)
    if err is None:
        return
    session.g._record_problems(list(err.problems))
    if session.mode == "warn":
        if session.g._first_time(("scaler", "bfloat16")):
            import warnings

            from torchdoctor._report.model import PlacementWarning
            from torchdoctor._report.text import user_stacklevel

            warnings.warn(f"torchdoctor.guard: {err}", PlacementWarning, stacklevel=user_stacklevel())
        return
    raise err


def _report(session: Any, dtype: torch.dtype, frames: list[Any], original: str | None) -> Any:
    from torchdoctor._report.model import PlacementError, Problem
    from torchdoctor._report.text import format_error
    from torchdoctor._rules import registry as _rules

    g = session.g
    model = g.model if isinstance(g.model, torch.nn.Module) else (
        session.frames.ran[0] if session.frames.ran else None)
    if not isinstance(model, torch.nn.Module):
        return None
    half = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.dtype == dtype]
    if not half:
        return None
    name = "float16" if dtype == torch.float16 else "bfloat16"
    cast = _cast_line(frames, model, dtype, frozenset(id(p) for _, p in half))
    var = cast[2] if cast else _held_name(frames, model)
    many = len(half) != 1
    if dtype == torch.float16:
        head = (f"dtype problem outside the guarded model: GradScaler met float16 gradients because {len(half)} "
                f"trained parameter{'s are' if many else ' is'} float16 themselves")
        why = "trained in float16: expected float32 master weights"
        proof = _prove([p for _, p in half])
        fix = (f"{var}.float()  # float32 master weights; run the forward under `with torch.autocast(..., "
               "dtype=torch.float16)` (keep it, or add it: float16 inputs then meet float32 weights in float16 ops) "
               "and keep the GradScaler\n# or train in bfloat16 with no GradScaler: "
               f"{var}.to(torch.bfloat16)")
        said = "GradScaler needs float32 master weights (autocast computes in float16)"
    else:
        head = (f"dtype problem outside the guarded model: GradScaler unscales bfloat16 gradients because {len(half)} "
                f"trained parameter{'s are' if many else ' is'} bfloat16: CUDA has no unscale kernel for bfloat16, "
                "and bfloat16 needs no loss scaling")
        why = "trained in bfloat16: no GradScaler needed"
        proof = _prove_plain([p for _, p in half])
        fix = ("loss.backward(); optimizer.step()  # bfloat16 keeps float32's exponent range: no GradScaler (drop "
               "scaler.scale / unscale_ / step / update)\n# or keep the GradScaler with float32 master weights and "
               f"float16 autocast: {var}.float()")
        said = "bfloat16 needs no GradScaler (CUDA cannot unscale bfloat16 gradients)"
    saved = _saved(cast, name)  # the live model cast only to save it: that line copies instead (a diff)
    if saved is None and dtype == torch.float16 and cast is not None and any(  # frozen weights share the cast (LoRA)
            not p.requires_grad and p.dtype == dtype for p in model.parameters()):
        saved = _trained_up(cast, var)
    if saved is not None:
        fix = saved[0]
    lines = [f"culprit {n}: {_rules._compact(p)}  ({why})" for n, p in half[:3]]
    if len(half) > 3:
        lines.append(f"... and {len(half) - 3} more {name} parameter{'s' if len(half) > 4 else ''}")
    if cast is not None:
        lines.append(f"the model was cast to {name} at {os.path.basename(cast[0])}:{cast[1]} (`{cast[3]}`)")
    lines.append(proof)
    if original is not None:
        lines.append(f"original error: {original}")
    problems = [Problem("dtype", n, "parameter", name, "float32" if dtype == torch.float16 else name,
                        f"{n} is trained in {name}: {said}") for n, _ in half]
    err = PlacementError(format_error(head, lines, fix), module_path=None, module_type=None, op=None,
                         problems=problems, fix=fix)
    from torchdoctor._guard.remedy import with_patch

    return with_patch(err, saved[1] if saved is not None else None, lines)


def _trained_up(cast: Any, var: str) -> tuple[str, str] | None:
    """(the fix, its diff): after the program's cast of the whole model to float16 (``unet.to(device,
    dtype=weight_dtype)``), the trained parameters alone back in float32 (the frozen ones stay float16, as diffusers'
    ``cast_training_params`` does); None when the line cannot be read."""
    import linecache

    from torchdoctor._report.diff import line_patch

    raw = linecache.getline(cast[0], cast[1]).rstrip("\r\n")
    if not raw.strip() or raw.rstrip().endswith(("(", ",", "\\")):
        return None
    pad = raw[:len(raw) - len(raw.lstrip())]
    loop = (f"for p in {var}.parameters():  # only the trained parameters in float32 (the frozen ones stay float16)\n"
            f"    if p.requires_grad:\n        p.data = p.data.float()")
    diff = line_patch(cast[0], cast[1], raw + "".join(f"\n{pad}{x}" for x in loop.split("\n")))
    return (f"{loop}\n# after {os.path.basename(cast[0])}:{cast[1]}, which casts the trained parameters with the "
            "frozen ones; keep `with torch.autocast(..., dtype=torch.float16)` and the GradScaler", diff) \
        if diff is not None else None


def _saved(cast: Any, name: str) -> tuple[str, str] | None:
    """(the fix, its diff) where the program's line cast the live model only to save it (``sd =
    model.half().state_dict()``): the state dict copied in ``name`` there, the model left in float32; else None."""
    from torchdoctor._virtual.awayline import saved_copy

    got = saved_copy(cast[0], cast[1]) if cast is not None else None
    if got is None:
        return None
    return (f"{got[4]}  # at {os.path.basename(cast[0])}:{cast[1]}: {got[0]} casts the live model to {name} to save "
            f"it (Module.{got[0].split('.')[-2].split('(')[0]}() casts the module, not a copy): copy the state dict in "
            f"{name} instead, the model stays float32", got[2])


def _prove_plain(params: list[torch.Tensor]) -> str:
    """The fix tried on copies: the optimizer's step of bfloat16 copies of the parameters and their gradients, with
    no GradScaler."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return "fix unproven: not re-run (the bfloat16 parameters hold no gradients yet)"
    try:
        with torch.no_grad():
            copies = []
            for p in with_grad:
                c = p.detach().clone().requires_grad_()
                c.grad = p.grad.detach().clone()  # type: ignore[union-attr]
                copies.append(c)
            torch.optim.SGD(copies, lr=1e-3).step()
    except Exception as err:  # the trial's own failure is the answer
        return f"fix unproven: an optimizer step of bfloat16 copies raised {type(err).__name__}: {err}"[:300]
    n = f"{len(with_grad)} parameter{'s' if len(with_grad) != 1 else ''}"
    return f"fix proven: an optimizer step runs on bfloat16 copies of the {n} and their gradients with no GradScaler"


def _prove(params: list[torch.Tensor]) -> str:
    """The fix tried on copies: a fresh GradScaler unscales float32 copies of the parameters and their gradients
    (the float32 master weights), and still refuses the float16 ones (the failure is the one explained)."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return "fix unproven: not re-run (the float16 parameters hold no gradients to unscale)"
    dev = with_grad[0].device

    def unscale(dtype: torch.dtype) -> BaseException | None:
        copies = []
        for p in with_grad:
            c = p.detach().to(dtype).requires_grad_()
            c.grad = p.grad.detach().to(dtype)  # type: ignore[union-attr]
            copies.append(c)
        scaler = torch.amp.GradScaler(dev.type)
        scaler.scale(torch.ones((), device=dev))  # the scale a training step's scaler.scale(loss) made
        try:
            scaler.unscale_(torch.optim.SGD(copies, lr=0.0))
        except (ValueError, RuntimeError) as err:
            return err
        return None

    try:
        with torch.no_grad():
            again, fixed = unscale(torch.float16), unscale(torch.float32)
    except Exception as err:  # a device this process cannot run (a virtual one): said, never claimed
        first = str(err).strip().splitlines()[0][:120] if str(err).strip() else ""
        return f"fix unproven: not re-run ({type(err).__name__}: {first})"
    n = f"{len(with_grad)} parameter{'s' if len(with_grad) != 1 else ''}"
    if fixed is not None:
        return f"fix unproven: GradScaler.unscale_ of float32 copies of the {n} raised {type(fixed).__name__}: {fixed}"
    return (f"fix proven: a GradScaler unscales float32 copies of the {n} and their gradients (float32 master "
            "weights)" + (", and refuses the float16 ones as the program's did" if again is not None else "") +
            " (the step; the forward's dtypes are autocast's)")


def _cast_line(frames: list[Any], model: torch.nn.Module, dtype: torch.dtype = torch.float16,
               trained: frozenset[int] = frozenset()) -> tuple[str, int, str, str] | None:
    """(file, line, the name, source) of the last ``<name>.half()`` / ``<name>....to(<float16>)`` in a user frame
    whose local ``<name>`` is the model or a module holding its trained parameters (a LoRA network the program casts
    on its own, ``network.to("cuda", dtype=weight_dtype)``), read from the frame's parsed code (nothing is run)."""
    from torchdoctor._guard.maker import _parsed as parsed_code

    for frame in reversed(frames):
        names = [n for n, v in frame.f_locals.items() if v is model or (
            trained and isinstance(v, torch.nn.Module) and any(id(p) in trained for p in v.parameters()))]
        parsed = parsed_code(frame.f_code) if names else None
        if parsed is None:
            continue
        tree, off, path, lines = parsed
        found: tuple[str, int, str, str] | None = None
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CASTS):
                continue
            root: Any = node.func.value
            while isinstance(root, (ast.Call, ast.Attribute)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if not (isinstance(root, ast.Name) and root.id in names):
                continue
            given = [*node.args, *(k.value for k in node.keywords if k.arg == "dtype")]
            if (node.func.attr == "half" and dtype == torch.float16) or any(_float16(a, frame, dtype) for a in given):
                src = lines[node.lineno - 1].strip() if node.lineno - 1 < len(lines) else ""
                if found is None or node.lineno + off > found[1]:  # the last cast made them so
                    found = (path, node.lineno + off, root.id, src)
        if found is not None:
            return found
    return None


def _held_name(frames: list[Any], model: torch.nn.Module) -> str:
    """The program's own name for the model in the nearest user frame that holds it (``unet``), else ``model``."""
    for frame in reversed(frames):
        for n, v in frame.f_locals.items():
            if v is model and n.isidentifier() and not n.startswith("_"):
                return n
    return "model"


def _float16(node: ast.expr, frame: Any, dtype: torch.dtype = torch.float16) -> bool:
    """Does this argument name ``dtype`` (``torch.float16``, ``torch.half``, a local or global holding it)?"""
    text = ast.unparse(node)
    if text.startswith("torch.") and getattr(torch, text[6:], None) is dtype:
        return True
    if isinstance(node, ast.Name):
        v = frame.f_locals.get(node.id, frame.f_globals.get(node.id))
        return v is dtype
    return False

"""Training steps on virtual devices: the placement rules of a step that no single op shows.

Autograd runs on virtual tensors (their C++ side is a cpu or meta wrapper, so the engine never meets a device this
build lacks); backward ops, optimizer updates, ``clip_grad_norm_`` and GradScaler pass through the op path and the
strict rules like any forward op. What is checked here besides: before each optimizer step, every gradient and
every floating state tensor (``exp_avg``, ``momentum_buffer`` ...) against its parameter's device and dtype, named
``optimizer.state[<parameter path>].exp_avg``; and a ``backward()`` started from a loss on the cpu while the
model's parameters sit on a virtual device (the loss was computed from tensors brought back with ``.cpu()``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from torchdoctor._placement import compact, device_str, dtype_str, tensor_device
from torchdoctor._virtual.loadorder import load_after_move, stepped_before_move, own_frame_file


def _param_paths(rec: Any) -> dict[int, str]:
    """Parameter id -> path, under the modules the run has seen start a forward."""
    out: dict[int, str] = {}
    for root in rec.modules.outermost:
        base = rec.modules.paths.get(id(root)) or ""
        with contextlib.suppress(Exception):
            for name, p in root.named_parameters(remove_duplicate=False):
                out.setdefault(id(p), f"{base}.{name}" if base else name)
    return out


def check_step(rec: Any, optimizer: Any) -> None:
    """Gradients and optimizer state against their parameters, before ``optimizer.step()`` runs. A state left on
    another device (loaded before the model's move) is one finding for the optimizer, and the step goes on with it
    on its parameters' device, as after the fix."""
    names = _param_paths(rec)
    state = getattr(optimizer, "state", {})
    off: list[tuple[str, str, torch.Tensor, torch.device, dict[str, Any], torch.Tensor]] = []
    for group in getattr(optimizer, "param_groups", ()):
        for i, p in enumerate(group.get("params", ())):
            if not isinstance(p, torch.Tensor):
                continue
            name = names.get(id(p), f"param_groups[{len(names)}].params[{i}]")
            where, dt = tensor_device(p), p.dtype
            g = p.grad
            if g is not None:
                _against(rec, f"{name}.grad", g, where, dt, "a gradient", "its parameter")
            held = state.get(p) or {}
            for key, v in held.items():
                # the step count is a cpu scalar by design (unless capturable / fused); 8-bit states keep their
                # own dtype and shape: only floating tensors shaped as the parameter are held to it
                if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() and v.shape == p.shape:
                    if tensor_device(v) != where:
                        off.append((name, key, v, where, held, p))
    if off:
        _state_off(rec, optimizer, off)


def _state_off(rec: Any, optimizer: Any,
               off: list[tuple[str, str, torch.Tensor, torch.device, dict[str, Any], torch.Tensor]]) -> None:
    """One finding for an optimizer's state on another device than its parameters; the run then moves it."""
    first, key, v, where, _, param = off[0]
    here = tensor_device(v)
    held = heldby_name(optimizer) or "optimizer"
    mine = {id(p) for g in getattr(optimizer, "param_groups", ()) for p in g.get("params", ())}
    model = next((heldby_name(root) for root in rec.modules.outermost  # the model whose parameters it holds
                  if any(id(p) in mine for p in root.parameters())), None) or "model"
    keys = ", ".join(dict.fromkeys(k for _, k, _, _, _, _ in off))
    params = len(dict.fromkeys(n for n, _, _, _, _, _ in off))
    path = f"optimizer.state[{first}].{key}"
    more = f" and {len(off) - 1} more ({keys} of {params} parameter(s))" if len(off) > 1 else ""
    to = device_str(where)
    order = load_after_move(file, held, model) if (file := own_frame_file()) else None
    stepped = stepped_before_move(file, held, model) if file and order is None else None
    if stepped is not None:  # the state made by a step before the move (a warm-up on the cpu): reloaded after it
        order = (f"{held}.load_state_dict({held}.state_dict())", stepped[2], stepped[4])
        fix = (f"# {stepped[0]} at line {stepped[1]} made the state on {device_str(here)} before {stepped[2]} at "
               f"line {stepped[3]}: Module.to moves only the model\n{stepped[2]}\n{order[0]}  # after the move: torch "
               "puts each state tensor on its parameter's device")
    else:
        fix = (f"# {order[0]} ran before {order[1]}: the state stays where it was loaded ({device_str(here)}); "
               f"Module.to moves only the model\n{order[1]}\n{order[0]}  # after the move: torch puts each state "
               "tensor on its parameter's device") if order else (
               f"# the state stays where it was loaded ({device_str(here)}): Module.to moves only the model\n"
               f"{held}.load_state_dict(...)  # after {model}.to({to!r}): torch puts each state tensor on its "
               f"parameter's device\n# or move the model and the state together, in place of {model}.to({to!r}):\n"
               f"torchdoctor.move({model}, {to!r}, optimizer={held})")
    message = (f"{path} {compact(v.dtype, tuple(v.shape), here)}{more}: optimizer state on {device_str(here)} while "
               f"its parameter is on {to} ({type(optimizer).__name__} {held}); the step raises on real hardware. "
               f"Load it after the model's move ({held}.load_state_dict after {model}.to), or move it with the model: "
               f"torchdoctor.move({model}, {to!r}, optimizer={held})")
    moved = _moved_away(v, param, key, held, to)
    if moved is not None:  # the program's own offload between steps, or a load while a block was swapped out
        message, fix = f"{path} {compact(v.dtype, tuple(v.shape), here)}{more}: {moved[0]}", moved[1]
    STATE_FIXES[message] = fix
    if order is not None and moved is None:  # the swap, as a patch of the program's file
        STATE_DIFFS[message] = order[2]
    while len(STATE_FIXES) > 64:
        STATE_DIFFS.pop(oldest := next(iter(STATE_FIXES)), None)
        STATE_FIXES.pop(oldest)
    rec._note("device", path, device_str(here), to, message, op="Optimizer.step", role="optimizer",
              key=f"step:state:{id(optimizer)}")
    for _, k, t, dev, state, _ in off:  # as after the fix: each state tensor on its parameter's device
        with contextlib.suppress(Exception):
            state[k] = t.to(dev)


def _moved_away(v: torch.Tensor, param: torch.Tensor, key: str, held: str, to: str) -> tuple[str, str] | None:
    """(message, fix) for a state tensor the program's own line moved off its parameter's device (an offload between
    steps, ``st[k] = v.to("cpu")``), the move back before the step left out, or loaded while its parameter's block
    was swapped out to the cpu (``swapload``); None when no line of the program did."""
    from torchdoctor._virtual.origin import where_called
    from torchdoctor._virtual.swapload import loaded_away
    from torchdoctor._virtual.takenback import of

    back = of(v)
    if back is None or back.by_module:
        return None
    here, step = device_str(v.device), where_called()
    at = f" at {step}" if step else ""
    swapped = loaded_away(back, param, key, held, to, at)
    if swapped is not None:
        return swapped
    return (f"optimizer state on {here} (taken to {here} by `{back.verb}` at {back.at}) while its parameter is on "
            f"{to} when {held}.step(){at} runs: the step raises on real hardware",
            f"# {held}'s state was moved to {here} at {back.at} and not moved back before {held}.step(){at}: move it "
            f"to its parameters' device ({to!r}) before the step, as the program's own move at {back.at} does the "
            "other way")


# a finding's message -> its fix as code (the optimizer named as the program holds it), for ``state_fix``
STATE_FIXES: dict[str, str] = {}
STATE_DIFFS: dict[str, str] = {}  # of a fix that swaps the program's load and move lines (``loadorder``)


def state_fix(problem: Any) -> str | None:
    """The fix of an optimizer state left on another device (``check_step``'s finding), or None."""
    return STATE_FIXES.get(problem.message) if problem.role == "optimizer" else None


def state_diff(problem: Any) -> str | None:
    """The patch of that fix where it swaps the program's load and move lines, or None."""
    return STATE_DIFFS.get(problem.message) if problem.role == "optimizer" else None


def heldby_name(obj: Any) -> str | None:
    """The name the program's innermost frame outside torch and torchdoctor binds to ``obj`` (``opt``)."""
    import sys

    f: Any = sys._getframe(1)
    for _ in range(32):
        if f is None:
            return None
        file = f.f_code.co_filename
        if not any(part in file for part in ("/torch/", "/torchdoctor/", "site-packages", "<frozen")):
            for scope in (f.f_locals, f.f_globals):
                hit = next((n for n, x in scope.items() if x is obj and not n.startswith("_")), None)
                if hit is not None:
                    return hit
            return None
        f = f.f_back
    return None


def _against(rec: Any, path: str, t: torch.Tensor, where: torch.device, dt: torch.dtype, what: str, of: str,
             dtype: bool = True) -> None:
    here = tensor_device(t)
    shown = compact(t.dtype, tuple(t.shape), here)
    if here != where:
        rec._note("device", path, device_str(here), device_str(where),
                  f"{path} {shown}: {what} on {device_str(here)} while {of} is on {device_str(where)}; the step "
                  f"raises on real hardware. Move it: .to({device_str(where)!r}) (for optimizer state after "
                  "load_state_dict: create the optimizer after model.to(device), or move its state)",
                  op="Optimizer.step", role="optimizer", key=f"step:{path}")
    elif dtype and t.dtype != dt:
        rec._note("dtype", path, dtype_str(t.dtype), dtype_str(dt),
                  f"{path} {shown}: {what} in {dtype_str(t.dtype)} while {of} is {dtype_str(dt)}; the optimizer "
                  "update fails or loses precision. Keep them in one dtype (master weights in float32 with their "
                  "gradients)", op="Optimizer.step", role="optimizer", key=f"step:{path}")


def check_backward(rec: Any, loss: torch.Tensor) -> None:
    """A ``backward()`` from a loss on the cpu while the model's parameters are on a virtual device."""
    if tensor_device(loss).type != "cpu" or not loss.requires_grad:
        return
    on = next((tensor_device(p) for root in rec.modules.outermost for p in root.parameters()
               if p.requires_grad and tensor_device(p).type == rec.device.type), None)
    # a model the program keeps wholly on the cpu (a warm-up, a second model) trains there: its loss is its own
    if on is None or any(next(iter(ps), None) is not None and all(tensor_device(p).type == "cpu" for p in ps)
                         for ps in (list(root.parameters()) for root in rec.modules.outermost)):
        return
    rec._note("device", "<loss>", "cpu", device_str(on),
              f"the loss {compact(loss.dtype, tuple(loss.shape), tensor_device(loss))} is computed on the cpu while "
              f"the model trains on {device_str(on)}: its graph copies activations to the cpu and gradients back "
              "every step. Compute the loss on the device (keep outputs and targets there; .cpu() only for logging)",
              op="Tensor.backward", role="loss", key="loss:cpu")


def check_scaler(rec: Any, scaler: Any, outputs: Any) -> None:
    """A GradScaler made for another device type than the loss it scales: ``GradScaler("cuda")`` on an xpu or mps
    machine turns itself off (fp16 gradients then underflow unscaled); ``GradScaler("cpu")`` keeps its scale and
    inf checks on the cpu, a copy and a sync every step."""
    t = outputs if isinstance(outputs, torch.Tensor) else None
    kind = str(getattr(scaler, "_device", ""))
    if t is None or not kind or tensor_device(t).type == kind or tensor_device(t).type != rec.device.type:
        return
    on = tensor_device(t)
    off = not getattr(scaler, "_enabled", True)
    rec._note("device", "<scaler>", kind, on.type,
              f"GradScaler({kind!r}) scales a loss on {device_str(on)}: "
              + (f"it turned itself off ({kind} is absent where the run is), so the loss is not scaled and float16 "
                 "gradients underflow" if off else f"its scale and inf checks live on {kind} (a copy and a sync "
                 "every step)")
              + f". Make it for the device: torch.amp.GradScaler({on.type!r})",
              op="GradScaler.scale", role="optimizer", key="scaler")


_SCALE = torch.amp.GradScaler.scale
_SCALERS = [0]


def _scale(self: Any, outputs: Any) -> Any:
    from torchdoctor._virtual.tensor import current_space

    space = current_space()
    if space is not None and hasattr(space.hooks, "modules"):  # a recorder: the run's own checks
        check_scaler(space.hooks, self, outputs)
    return _SCALE(self, outputs)


@contextlib.contextmanager
def train_checks(rec: Any) -> Iterator[None]:
    """The optimizer step checks while the block runs (a global pre-hook of ``torch.optim``, removed on exit)."""
    from torchdoctor._virtual.replaced import retarget
    from torchdoctor._virtual.tensor import current_space

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        space = current_space()
        if space is not None and space.hooks is rec:
            retarget(space, optimizer)  # built before Module.to: the parameters the model holds now, as on the device
            check_step(rec, optimizer)

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handle = register_optimizer_step_pre_hook(pre)
    _SCALERS[0] += 1  # one wrapper for all runs (it asks the thread's run), put back when the last one ends
    torch.amp.GradScaler.scale = _scale  # type: ignore[method-assign]
    try:
        yield
    finally:
        handle.remove()
        _SCALERS[0] -= 1
        if _SCALERS[0] == 0:
            torch.amp.GradScaler.scale = _SCALE  # type: ignore[method-assign]


_GROUP = torch._C._group_tensors_by_device_and_dtype  # the real one, taken before any run installs its own


def install(installs: Any) -> None:
    """Foreach optimizers and ``clip_grad_norm_`` group their tensors by device in C++, which reads a virtual
    tensor's inner (meta) device: the groups are keyed by the device the program sees instead, as on the real
    machine (a clip coefficient moved to the ``meta`` key met the gradients as a tensor with no data)."""

    def grouped(tensorlistlist: Any, with_indices: bool = False) -> Any:
        out = _GROUP(tensorlistlist, with_indices)
        keyed: dict[Any, Any] = {}
        for (dev, dt), (lists, idx) in out.items():
            # one C++ group may hold tensors of several virtual devices (their inner device is one): split by label
            labels = [getattr(t, "_td_device", None) or dev for t in lists[0]] if lists else []
            for label in dict.fromkeys(labels) or (dev,):
                sel = [i for i, lab in enumerate(labels) if lab == label]
                part = ([[x[i] for i in sel] if x else [] for x in lists], [idx[i] for i in sel] if idx else [])
                have = keyed.get((label, dt))
                if have is None:
                    keyed[(label, dt)] = part
                else:  # (the same label from two C++ groups: one group, as on the machine)
                    for into, more in zip(have[0], part[0]):
                        into.extend(more)
                    have[1].extend(part[1])
        return keyed

    installs.set(torch._C, "_group_tensors_by_device_and_dtype", grouped)


def amp_backward(f: Any) -> bool:
    """A dtype finding (``f``; None: a kernel's refusal) in a backward pass of a run that used autocast: the run casts
    below autograd, so a backward meets the forward's uncast saved tensors; on the device autograd casts each grad."""
    from torchdoctor._virtual.tensor import current_space

    space = current_space()
    return space is not None and space.amp and (f is None or f.problem.kind == "dtype")


def default_device(space: Any) -> Any:
    """The device ``torch.set_default_device`` gives a factory told none. A backward pass on an accelerator runs in
    the device's own thread, which never sees that setting (pytorch#124788): a factory there without ``device=``
    makes its tensor on the CPU (a reentrant checkpoint's recompute), unless the non-reentrant checkpoint's
    ``recompute_fn`` runs it, which enters the device context of its forward again."""
    import sys

    import torch.utils._device as device_mod

    if space.vtype not in ("cpu", "meta") and torch._C._current_graph_task_id() != -1:
        f: Any = sys._getframe(1)
        for _ in range(64):
            if f is None or f.f_code.co_name == "recompute_fn" and f.f_code.co_filename.endswith("checkpoint.py"):
                break
            f = f.f_back
        else:
            f = None
        if f is None:
            return torch.device("cpu")
    return device_mod.CURRENT_DEVICE

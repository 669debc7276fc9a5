"""The CPU side of a virtual run: what a program takes back from a virtual device (real CPU tensors, values), and
the CPU work of its own that stays real, with where each tensor came from kept aside for when it meets a virtual
one (docs/virtual.md)."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch

from torchdoctor._virtual import hostmade, lifted as lifted_twins
from torchdoctor._virtual.origin import Made, built_module
from torchdoctor._virtual.tensor import Space, VirtualTensor, host_values


def any_virtual(args: Any, kwargs: dict[str, Any], named: dict[int, Any] | None = None) -> bool:
    """A virtual tensor among the arguments (one level, lists and tuples included), or a model tensor a module-entry
    check named (in ``named``): its ops are the model's, checked and traced as virtual ones."""
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, VirtualTensor) or named and id(a) in named:
            return True
        if isinstance(a, (list, tuple)) and any(isinstance(x, VirtualTensor) or named and id(x) in named for x in a):
            return True
    return False


_IN_PLACE_DUNDERS = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                               "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
                               "__imatmul__", "__setitem__"})


def mutates(name: str) -> bool:
    """An in-place call (``add_``, ``_foreach_add_``, ``x += y``, ``x[i] = v``): on real tensors alone it is the
    program's CPU work, never a private copy's (an optimizer stepping a model left on the CPU must train it)."""
    return name[-1:] == "_" and (name[:2] != "__" or name in _IN_PLACE_DUNDERS)


def written(real: tuple[Any, ...] | None, lifted: tuple[Any, ...], out: Any) -> Any:
    """After an in-place call on twins of the program's real tensors (``p.addcdiv_(exp_avg, denom)`` with a state
    the run made): the values it wrote are copied back into the real ones, and the call returns its real ``self``."""
    if real is None:
        return out
    pairs = [(r, v) for rs, vs in zip(real, lifted) for r, v in
             (zip(rs, vs) if isinstance(rs, (list, tuple)) and isinstance(vs, (list, tuple)) else [(rs, vs)])]
    with torch.no_grad(), torch._C.DisableTorchFunction():
        for r, v in pairs:
            if r is not v and isinstance(v, VirtualTensor) and not isinstance(r, VirtualTensor) \
                    and isinstance(r, torch.Tensor) and v._td_elem.device == r.device and v._td_elem.shape == r.shape:
                r.copy_(v._td_elem)
    return real[0] if real and out is lifted[0] else out


# frames of the run's machinery a torch warning from C++ (which takes the innermost Python frame) is raised in
_MACHINERY = ("/torchdoctor/", "/torch/overrides.py", "/torch/utils/_python_dispatch.py")


def run_warnings() -> None:
    """Inside a run's ``warnings.catch_warnings()``: the run's own warnings ignored, and a torch warning raised while
    the run handles the program's call (``torch.tensor(t)``'s copy-construct advice) shown at the program's line."""
    # torch warns that global module hooks fire twice around a compiled module: they are the run's own
    warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
    # DataParallel's gradient sum asks for NCCL, which a CUDA build has and this one lacks
    warnings.filterwarnings("ignore", message="PyTorch is not compiled with NCCL support")
    show = warnings.showwarning

    def shown(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if any(k in filename for k in _MACHINERY):
            at = _program_frame(sys._getframe(1), filename, lineno)
            if at is not None:
                filename, lineno, line = at.f_code.co_filename, at.f_lineno, None
        show(message, category, filename, lineno, file, line)

    warnings.showwarning = shown


def _program_frame(f: Any, filename: str, lineno: int) -> Any:
    """The frame a warning that landed in the run's machinery (``filename:lineno``) lands in without the run: its
    stack level counted on the stack with the run's frames taken out, and with them the outer half of a call the
    run's function mode re-entered (``F.softmax`` called again by the mode: its ``stacklevel=3`` means the program's
    line); a C++ warning (level 1) lands in the first frame of the program or library that called the op."""
    # the display chain first (another showwarning of the run's may wrap this one): up to warnings' own last frame
    g, n, last = f, 0, None
    while g is not None and n < 8:
        if g.f_code.co_filename.endswith("/warnings.py"):
            last = g
        g, n = g.f_back, n + 1
    f = last.f_back if last is not None else f
    stack = []
    while f is not None:
        stack.append(f)
        f = f.f_back
    level = next((i for i, g in enumerate(stack) if g.f_code.co_filename == filename and g.f_lineno == lineno), None)
    if level is None:
        return None
    kept: list[Any] = []
    inside = False
    for g in stack:
        if any(k in g.f_code.co_filename for k in _MACHINERY):
            inside = True
            continue
        if inside and kept and kept[-1].f_code is g.f_code:
            inside = False  # the call the mode re-entered: its outer frame is the same call
            continue
        inside = False
        kept.append(g)
    return kept[min(level, len(kept) - 1)] if kept else None


def absent(space: Space, device: torch.device) -> None:
    """A move or factory to a device type the virtual machine does not have (``.to("cuda")`` on a virtual Mac or an
    XPU machine) raises as that machine's torch build does."""
    if device.type == space.vtype or device.type in ("cpu", "meta"):
        return
    if device.type in ("cuda", "xpu"):
        raise AssertionError(f"Torch not compiled with {device.type.upper()} enabled")
    raise RuntimeError(f"PyTorch is not linked with support for {device.type} devices")


def labelled(args: tuple[Any, ...], kwargs: dict[str, Any], lift: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Real tensors given a device label by ``.data =`` (diffusers' group offloading onloads a model built before
    the run: ``param.data = param.data.to(onload)``) made virtual where they are used, so what is computed from them
    (``weight.to(x.dtype) * scale``) is on the labelled device, and a CPU tensor meeting them is found there."""

    def one(a: Any) -> bool:
        return isinstance(a, torch.Tensor) and not isinstance(a, VirtualTensor) and "_td_device" in a.__dict__

    if not any(one(a) for a in args) and not (kwargs and any(one(v) for v in kwargs.values())):
        return args, kwargs

    def lifted(a: Any) -> Any:
        twin = lift([a])[0]
        lifted_twins.note(a, twin)  # a backward that saved it reads the parameter where a later ``.data =`` put it
        return twin

    args = tuple(lifted(a) if one(a) else a for a in args)
    if kwargs:
        kwargs = {k: lifted(v) if one(v) else v for k, v in kwargs.items()}
    return args, kwargs


def cpu_work(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], factory: bool) -> Any:
    """``func`` run as it is; a factory's result keeps its line, and a result made from a tensor the run made keeps
    that one's origin (``torch.arange(n).expand(...)``), for the moment it meets a virtual tensor."""
    if factory and kwargs.get("generator") is not None:  # a virtual GPU's generator drawing on the CPU raises there
        space.hooks.creating(getattr(func, "__name__", "") or "tensor", torch.device("cpu"),
                             {"generator": kwargs["generator"]})
    pinned = factory and kwargs.get("pin_memory")
    if pinned:  # pinned host memory (safetensors' load to a device, loaders): the machine's GPU would allocate it
        kwargs = dict(kwargs, pin_memory=False)
    out = func(*args, **kwargs)
    if pinned and isinstance(out, torch.Tensor):
        out._td_pinned = True  # type: ignore[attr-defined]
    if isinstance(out, torch.Tensor):
        if factory:  # a module built in forward is made by its constructor's line (nn.BatchNorm2d(8)), not torch.empty
            by = Made(built_module(2) or f"torch.{getattr(func, '__name__', '') or 'tensor'}", space.hooks.running())
            space.keep_real(out, None, by)
            hostmade.remember(out, by)  # a model's tensor loaded from it is fixed at that line
        elif (named := _params_of_running(space, args)):  # the module's own CPU parameters (an adapter attached
            # after the model's move): named, so the fix moves them, not "the tensors made in forward"
            space.keep_real(out, None, Made(f"Tensor.{(getattr(func, '__name__', '') or 'op').strip('_')}",
                                            space.hooks.running(), named))
        elif space.real:
            # the tensors among the arguments, a list's too (``torch.cat([uncond, cond])`` of cpu conditioning)
            ts = [a for x in args for a in (x if isinstance(x, (list, tuple)) else (x,)) if isinstance(a, torch.Tensor)]
            kept = next((k for a in ts for k in (space.real_record(a),) if k is not None and k[1] is not None), None)
            made = {id(k[1]) if k is not None else None for a in ts if a.dim() > 0 for k in (space.real_record(a),)}
            if kept is not None and len(made) > 1:  # (one factory's tensors among themselves: still its own)
                # computed from several tensors (``latent + noise * s``): no one factory made it, so none is its fix
                name = (getattr(func, "__name__", "") or "op").strip("_")
                space.keep_real(out, None, Made(f"Tensor.{name}", space.hooks.running()))
            elif kept is not None:
                space.keep_real(out, None, kept[1])
    return out


def _params_of_running(space: Space, args: tuple[Any, ...]) -> tuple[str, ...]:
    """The paths of the real parameters among ``args`` that the running module holds (its submodules' included)."""
    params = [a for a in args if isinstance(a, torch.nn.Parameter) and not isinstance(a, VirtualTensor)]
    mod = space.hooks.running() if params else None
    if mod is None:
        return ()
    path = space.hooks.path_of(mod)
    names = []
    for p in params:
        hit = space.named.get(id(p))
        name = hit[1] if hit is not None and hit[0] is p else next(
            (f"{path}.{n}" if path else n for n, q in mod.named_parameters(remove_duplicate=False) if q is p), None)
        if name is not None and name not in names:
            names.append(name)
    return tuple(names)


def real(space: Space, out: Any, op: str, src: Any, to_cpu: bool = False) -> Any:
    """A real tensor's move or cast that stays on the CPU stays real: it keeps where ``src`` came from (a factory
    call), else, made outside any module, the user's line that made it, for the moment it meets virtual tensors
    (``made by Tensor.to at app.py:7``). ``to_cpu``: the program's line asked for the cpu by name
    (``torch.linspace(...).to("cpu")``): that line, not the factory, decides where it is, even with nothing moved
    (a ``device=`` given to the factory would not change it)."""
    if isinstance(out, torch.Tensor) and not isinstance(out, VirtualTensor):
        kept = space.real_record(src) if space.real and isinstance(src, torch.Tensor) else None
        if kept is not None and kept[1] is not None:
            if to_cpu:
                from torchdoctor._virtual.moveby import carried

                space.keep_real(out, None, carried(kept[1], space.hooks.running()))
                return out
            space.keep_real(out, None, kept[1])
        elif space.hooks.running() is None:
            space.keep_real(out, None, Made(op, None))
    return out


def values(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    self, name = args[0], getattr(func, "__name__", "")
    if not isinstance(self, VirtualTensor):
        return func(*args, **kwargs)
    if name in ("numpy", "__array__") and self._td_device.type != "cpu":
        space.hooks.reading(self, f"Tensor.{name}")  # real PyTorch raises: "can't convert cuda:1 ... to numpy"
    # the values as a real CPU tensor holds them (zeros where the run keeps none: the documented fill)
    return func(host_values(self) if self._td_elem.device.type == "meta" else self._td_elem, *args[1:], **kwargs)


def host(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    self, name = args[0], getattr(func, "__name__", "")
    if not isinstance(self, VirtualTensor):
        if name in ("pin_memory", "is_pinned") and isinstance(self, torch.Tensor) and self.device.type == "cpu":
            # pinning asks the accelerator this build lacks: answered as the GPU machine does (a pinned copy, then
            # is_pinned() True), the copy a plain CPU tensor marked pinned for this run
            if name == "is_pinned" or getattr(self, "_td_pinned", False):
                return getattr(self, "_td_pinned", False) if name == "is_pinned" else self
            return _pinned_copy(space, self)
        return func(*args, **kwargs)
    if name == "pin_memory" and self._td_device.type != "cpu":  # as ATen's ``_pin_memory`` refuses it
        scalar = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
                  torch.int64: "Long", torch.int32: "Int", torch.uint8: "Byte", torch.int8: "Char",
                  torch.int16: "Short", torch.bool: "Bool"}.get(self.dtype, str(self.dtype)[6:])
        raise RuntimeError(f"cannot pin '{self._td_device.type.upper()}{scalar}Type' only dense CPU tensors can be "
                           "pinned")
    if name == "data_ptr":  # distinct tensors, distinct pointers (meta says 0 for all)
        return id(self._td_elem) if self._td_elem.device.type == "meta" else self._td_elem.data_ptr()
    return {"is_pinned": False, "record_stream": None}.get(name, self)


def _pinned_copy(space: Space, src: torch.Tensor) -> torch.Tensor:
    """``t.pin_memory()``: a new tensor with ``t``'s values (pinning copies), keeping where ``t`` was made."""
    out = src.clone()
    out._td_pinned = True  # type: ignore[attr-defined]
    kept = space.real_record(src) if space.real else None
    if kept is not None and kept[1] is not None:
        space.keep_real(out, None, kept[1])
    return out


class _Moved(torch.autograd.Function):
    """A move or cast made by the virtual runtime (``.to``, ``.cpu()``, ``.half()``) as a step of the graph: the
    gradient goes back to the source's device and dtype, as real autograd's ``ToCopyBackward`` sends it."""

    @staticmethod
    def forward(ctx: Any, src: torch.Tensor, made: list[torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        ctx.back = (src.device if not isinstance(src, VirtualTensor) else src._td_device, src.dtype,
                    isinstance(src, VirtualTensor))
        return made[0]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None]:  # type: ignore[override]
        from torchdoctor._virtual.tensor import current_space

        device, dtype, virtual = ctx.back
        space = current_space()
        if not virtual:  # a real source: a real gradient
            return (host_values(grad, dtype) if isinstance(grad, VirtualTensor) else grad.to(dtype)), None
        if space is None or MOVE is None:
            raise RuntimeError("a virtual tensor's gradient after its run ended")
        return MOVE(space, grad, device, dtype), None


MOVE: Any = None  # the runtime's move (set by ``runtime``, which imports this module)


def through_autograd(src: torch.Tensor, made: Any) -> Any:
    """``made`` (the moved or cast ``src``) linked into ``src``'s graph when autograd records: a training step's
    ``x.to(dtype)`` inside a forward and ``out.cpu()`` before a loss pass their gradients back."""
    if made is src or not isinstance(made, torch.Tensor) or made.requires_grad or made._base is not None:
        return made
    if torch._C._get_tracing_state() is not None:  # torch.jit.trace records the program's ops, never ours
        return made
    return _Moved.apply(src, [made])


def graphed(before: Any, lifted: list[Any]) -> list[Any]:
    """``lifted`` (``lift_all`` of ``before``: the program's real tensors made virtual where they meet virtual ones)
    with each tensor that was in a graph linked into it (``through_autograd``): a LoRA's CPU parameters meeting the
    GPU weights still receive their gradients, so the run goes past the device problem as a training step would."""
    if not torch.is_grad_enabled():
        return lifted

    def one(src: Any, new: Any) -> Any:
        if new is src or not isinstance(src, torch.Tensor) or not src.requires_grad:
            return new
        return through_autograd(src, new)

    return [type(b)(one(x, y) for x, y in zip(b, a)) if isinstance(b, (list, tuple)) and isinstance(a, (list, tuple))
            else one(b, a) for b, a in zip(before, lifted)]


def drawn(space: Space, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A sampling call given ``generator=`` (``torch.multinomial``, ``Tensor.normal_``): told to the hooks with its
    tensors' virtual device, which only this level sees (dispatch gets the generator without its label)."""
    if args and isinstance(args[0], VirtualTensor):
        space.hooks.drawing(func, args[0]._td_device, kwargs["generator"])


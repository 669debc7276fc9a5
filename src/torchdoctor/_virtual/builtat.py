"""Modules of the program's own class built after the model was moved (a trainer's ``lin.adapter = LoraAdapter(8,
8)`` after ``model.to(device)``: ComfyUI's TrainLoraNode) are on the cpu: the fix is the line that builds them,
moved there (``LoraAdapter(8, 8).to(device, dtype)``, a diff), never ``.data`` lines under an optimizer that already
holds the parameters. Proven by a re-run where the modules built at that line are moved as the diff says."""

from __future__ import annotations

import ast
import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from torchdoctor._virtual.prove import Fix

__all__ = ["build_line_fix", "covered_notes", "rebuilt"]


def build_line_fix(f: Fix, root: Any) -> Fix | None:
    """``f`` (``.data`` moves of the tensors of modules of one class of the program's own file) replaced by the one
    line of that file that builds them, moved there; None otherwise."""
    from torchdoctor._guard.maps import value_code
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._report.diff import line_patch

    if f.kind != "path" or not f.sets or not isinstance(root, torch.nn.Module):
        return None
    targets = {t for _, t in f.sets}
    if len(targets) != 1:
        return None
    target = next(iter(targets))
    parts = target if isinstance(target, tuple) else (target,)
    if not isinstance(parts[0], torch.device):
        return None
    owners = []
    for path, _ in f.sets:
        try:
            owners.append(_held_at(root, path.rsplit(".", 1)[0]) if "." in path else None)
        except (AttributeError, IndexError, ValueError):
            return None
    # the module's own move fixes only what .to() moves, and only a module left behind whole: every parameter and
    # buffer of it among the tensors fixed (a plain attribute, `blocks.1.shift`, is not moved by moving its block)
    # (a layer it wraps, built before the move and moved with the model, is there already: LoRA injected after it)
    fixed = {path for path, _ in f.sets}
    for path, o in zip((p for p, _ in f.sets), owners):
        if o is None or path.rsplit(".", 1)[-1] not in {*o._parameters, *o._buffers}:
            return None
        base = path.rsplit(".", 1)[0]
        if any(f"{base}.{n}" not in fixed and not (_there(t, parts[0]) and "." in n)
               for n, t in (*o.named_parameters(), *o.named_buffers())):
            return None
    lifted = _program_parents(root, [p for p, _ in f.sets], owners, fixed, parts[0])
    owners = lifted or owners  # torch layers (``nn.Linear`` lora_down / lora_up) built by a wrapper of the program's
    kinds = {type(o) for o in owners}
    if len(kinds) != 1 or None in owners or (cls := next(iter(kinds))).__module__.startswith("torch."):
        return None
    try:
        file = next((v.__code__.co_filename for v in vars(cls).values() if hasattr(v, "__code__")), "") or \
            inspect.getsourcefile(cls) or ""  # a function of the class: its module may be in no sys.modules
        with open(file, encoding="utf-8") as fh:
            text = fh.read()
        tree = ast.parse(text)
    except (OSError, TypeError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    if not own_file(file):
        return None
    lines = text.split("\n")
    sites = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and (
        isinstance(c.func, ast.Name) and c.func.id == cls.__name__ or
        isinstance(c.func, ast.Attribute) and c.func.attr == cls.__name__)]
    if len(sites) != 1 or sites[0].lineno != sites[0].end_lineno or not lines[sites[0].lineno - 1].isascii():
        return None
    call = sites[0]
    fn = min((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and
              n.lineno <= call.lineno <= (n.end_lineno or 0)), key=lambda n: (n.end_lineno or 0) - n.lineno,
             default=None)
    if fn is not None and fn.name == "__init__":  # built with the module that holds it, before any move of that
        return None  # module: what left it behind came later (a buffer moved back, a loader's offload)
    cast = ""
    if len(parts) == 1 and (dt := _wrapped_dtype(owners) if not lifted else _there_dtype(owners, parts[0])) is not None:
        # the layer it wraps is in another dtype
        parts = (parts[0], dt)  # (LoRA injected after a .to(device, dtype)): built there in the layer's dtype too
        target, cast = parts, f" and cast to {str(dt).rsplit('.', 1)[-1]}"
    known = {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)} if fn is not None else set()
    from torchdoctor._virtual.devexpr import device_name

    picked = device_name(file, call.lineno)  # the program's own device pick (never 'cuda:0' written out)
    exprs = [("device" if "device" in known else picked or value_code(parts[0])) if isinstance(x, torch.device) else
             ("dtype" if "dtype" in known else value_code(x)) for x in parts]
    if (wrapped := _wrapped(call, owners, parts[0]) or _read_layer(call, root, [p for p, _ in f.sets], parts[0])) \
            is not None:  # the layer it wraps (or whose sizes it reads: ``Diff(m.out_features)``) is where it belongs
        exprs = [x if x in ("device", "dtype") else f"{wrapped}.weight.{'device' if i == 0 else 'dtype'}"
                 for i, x in enumerate(exprs)]
    raw, end = lines[call.lineno - 1], int(call.end_col_offset or 0)
    moved = f".to({', '.join(exprs)})"
    diff = line_patch(file, call.lineno, (raw[:end] + moved + raw[end:]).strip())
    if diff is None:
        return None
    short = f"{file.rsplit('/', 1)[-1]}:{call.lineno}"
    count = len({id(o) for o in owners})
    many = (f"{count} {cls.__name__} modules are", "them", "they are") if count > 1 else \
        (f"1 {cls.__name__} module is", "it", "it is")
    return Fix(f"# {many[0]} built at {short} after the model was moved{cast}, on the cpu: move {many[1]} where "
               f"{many[2]} built ({ast.unparse(call)}{moved})", "note", target,
               sets=tuple((p, target) for p, _ in f.sets), diff=diff, rebuild=(cls, file, call.lineno, parts))


def _held_at(root: torch.nn.Module, path: str) -> Any:
    """The module at ``path`` of ``root``, through submodules and the plain lists a module holds modules in
    (ComfyUI's ``weight_function = [lora_diff]``, which ``Module.to`` never reaches)."""
    obj: Any = root
    for part in path.split("."):
        if isinstance(obj, torch.nn.Module) and part in obj._modules:
            obj = obj._modules[part]
        elif isinstance(obj, (list, tuple)) and part.isdigit():
            obj = obj[int(part)]
        else:
            obj = getattr(obj, part)
    if not isinstance(obj, torch.nn.Module):
        raise AttributeError(path)
    return obj


def covered_notes(fixes: Sequence[Fix]) -> list[Fix]:
    """``fixes`` without the generic "made in <dtype> ... no line that made them was recorded" notes where a fix
    builds the modules at their line in the dtype those tensors lacked, or moves model tensors and casts them to it
    (the same tensors: one cause, one fix)."""
    built = {str(f.rebuild[3][1]).rsplit(".", 1)[-1] for f in fixes if f.rebuild is not None and len(f.rebuild[3]) > 1}
    # (and where a fix moves model tensors and casts them to that dtype: ``torchdoctor.move(model.proj, device,
    # torch.float16)`` for a layer attached after the model's move; its tensors' dtype problems are that cause)
    built |= {str(t).rsplit(".", 1)[-1] for f in fixes if f.kind in ("path", "apart") and f.sets
              for t in (f.target if isinstance(f.target, tuple) else (f.target,)) if isinstance(t, torch.dtype)}
    return [f for f in fixes if not (f.kind == "input" and "no line that made them was recorded" in f.code and any(
        f"cast them where they are made (tensor.to(torch.{d}))" in f.code for d in built))] if built else list(fixes)


def _program_parents(root: Any, paths: Sequence[str], owners: Sequence[Any], fixed: set[str],
                     device: torch.device) -> list[Any] | None:
    """The modules of the program's own class that hold the torch layers ``owners`` (``Adapter.lora_down``, an
    ``nn.Linear``), one per path, when each holds nothing else but what is fixed and what is on ``device`` already
    (the layer it wraps); None otherwise (the layers are the program's own class, or anything else is left behind)."""
    if not owners or any(o is None or not type(o).__module__.startswith("torch.") for o in owners):
        return None
    out = []
    for path in paths:
        parts = path.split(".")
        if len(parts) < 3:
            return None
        base = ".".join(parts[:-2])
        try:
            parent = root.get_submodule(base)
        except AttributeError:
            return None
        if type(parent).__module__.startswith("torch.") or any(
                f"{base}.{n}" not in fixed and not _there(t, device)
                for n, t in (*parent.named_parameters(), *parent.named_buffers())):
            return None
        out.append(parent)
    return out


def _there_dtype(owners: Sequence[Any], device: torch.device) -> torch.dtype | None:
    """The one floating dtype of what each module holds on ``device`` already (the layer it wraps) when what it
    holds elsewhere (the layers it built) is in another one; None otherwise."""
    there: set[torch.dtype] = set()
    for o in owners:
        ps = [p for p in o.parameters() if p.is_floating_point()]
        here = {p.dtype for p in ps if _there(p, device)}
        left = {p.dtype for p in ps if not _there(p, device)}
        if len(here) != 1 or not left or here <= left:
            return None
        there |= here
    return next(iter(there)) if len(there) == 1 else None


def _wrapped_dtype(owners: Sequence[Any]) -> torch.dtype | None:
    """The floating dtype of the one layer each module wraps (``LoRALinear(child)``'s ``child``) when the module's
    own floating parameters are in another one; None otherwise."""
    kinds: set[torch.dtype] = set()
    for o in owners:
        kids = [m for m in o.children() if isinstance(getattr(m, "weight", None), torch.Tensor)]
        own = {p.dtype for p in o._parameters.values() if p is not None and p.is_floating_point()}
        if len(kids) != 1 or not kids[0].weight.is_floating_point() or not own or kids[0].weight.dtype in own:
            return None
        kinds.add(kids[0].weight.dtype)
    return next(iter(kinds)) if len(kinds) == 1 else None


def _there(t: torch.Tensor, device: torch.device) -> bool:
    """``t`` is on ``device`` now (a virtual tensor's device, where it is one)."""
    return getattr(t, "_td_device", t.device) == device


def _wrapped(call: ast.Call, owners: Sequence[Any], device: torch.device) -> str | None:
    """The name of the call's one argument when each module built holds one child layer with a ``weight`` on
    ``device`` (the base layer a LoRA wraps: ``LoRALinear(mod)``), else None."""
    arg = call.args[0] if len(call.args) == 1 and not call.keywords else None
    if not isinstance(arg, (ast.Name, ast.Attribute, ast.Subscript)) and not (  # ``getattr(mod, n)`` reads it too
            isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id == "getattr"):
        return None
    for o in owners:
        kids = [m for m in o.children() if isinstance(getattr(m, "weight", None), torch.Tensor)]
        kids = kids if len(kids) == 1 else [m for m in kids if _there(m.weight, device)]  # beside layers it built
        if len(kids) != 1 or not _there(kids[0].weight, device):
            return None
    return ast.unparse(call.args[0])


def _read_layer(call: ast.Call, root: torch.nn.Module, paths: Sequence[str], device: torch.device) -> str | None:
    """The one name whose attributes the call's arguments read (``m`` of ``LoraDiff(m.out_features,
    m.in_features)``) when each module built hangs below a layer of the model whose ``weight`` is on ``device``
    already (the layer ``m`` is, in the program's loop); None otherwise."""
    names = {n.value.id for a in (*call.args, *(k.value for k in call.keywords)) for n in ast.walk(a)
             if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    if len(names) != 1:
        return None
    for path in paths:
        parts = path.split(".")[:-1]
        holder = None
        while parts and holder is None:
            parts.pop()
            try:
                holder = root.get_submodule(".".join(parts)) if parts else None
            except AttributeError:
                continue
        if holder is None or not isinstance(w := getattr(holder, "weight", None), torch.Tensor) or not _there(w, device):
            return None
    return next(iter(names))


class _Moved:
    """``cls.__init__`` wrapped: a module built at the fixed line is moved right after it is built."""

    def __init__(self, cls: Any, file: str, line: int, parts: tuple[Any, ...]) -> None:
        self.cls, self.file, self.line, self.parts = cls, file, line, parts
        self.orig = cls.__dict__.get("__init__")

    def __enter__(self) -> None:
        from torchdoctor._virtual.origin import user_frame

        orig: Any = vars(self.cls).get("__init__") or getattr(self.cls, "__init__")
        want, parts = (self.file, self.line), self.parts

        def init(mod: Any, *args: Any, **kwargs: Any) -> None:
            orig(mod, *args, **kwargs)
            f = user_frame(2)
            if f is not None and (f.f_code.co_filename, f.f_lineno) == want and type(mod) is self.cls:
                mod.to(*parts)

        self.cls.__init__ = init  # type: ignore[misc]

    def __exit__(self, *exc: Any) -> None:
        if self.orig is None:
            del self.cls.__init__  # type: ignore[misc]
        else:
            self.cls.__init__ = self.orig  # type: ignore[misc]


@contextlib.contextmanager
def rebuilt(fixes: Sequence[Fix]) -> Iterator[None]:
    """While a re-run runs: the modules each fix builds at its line are moved as the fix says; put back after."""
    with contextlib.ExitStack() as stack:
        for f in fixes:
            if f.rebuild is not None:
                stack.enter_context(_Moved(*f.rebuild))
        yield

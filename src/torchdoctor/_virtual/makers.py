"""The maker of a tensor a forward cast to another dtype: the cast as the user wrote it (``h.float()``,
``w.to(self.compute_dtype)``), its line, and where the dtype it was cast to was read from (an attribute of the
module, a class attribute, a config), so a dtype problem is fixed where its dtype entered, not on the tensors the
cast was made from (which already have the right dtype).

``CastMakers`` (a function mode of ``simulate``'s run) also names real tensors made from host data
(``torch.as_tensor``) and Parameters a forward builds lazily; ``place_inputs`` / ``placed_on`` make the run's own
inputs, named as ``simulate`` names them.

The cast sites themselves (``SITES``, ``cast_site``, ``patched_line``) are in ``castsites``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchdoctor._virtual import hostmade, loaded, loading
from torchdoctor._virtual.castsites import cast_site
from torchdoctor._virtual.origin import LOOSE
from torchdoctor._virtual.tensor import VirtualTensor, current_space, make, unsupported_form

# factories whose tensor stays real in a virtual run (made from host data): named by the line that called them
_REAL_MAKERS = frozenset({"from_numpy", "as_tensor", "asarray", "frombuffer", "from_dlpack"})
_CAST_METHODS = frozenset({"to", "float", "half", "double", "bfloat16", "type", "type_as"})


class CastMakers(torch.overrides.TorchFunctionMode):
    """Names the maker of every tensor a forward casts to another dtype on its device (``h.float()``,
    ``w.to(self.compute_dtype)``): its record starts at the cast's line, so the dtype problem it causes downstream is
    fixed there. A model tensor cast this way (``self.weight.to(bf16)``) is a new activation, no longer the model's
    own: its dtype is what the cast made it, and casting the weight would change nothing.

    ``recast`` (the proof of a fix at a line): the casts at those (file, line) write the given dtype instead."""

    def __init__(self, recast: dict[tuple[Any, ...], torch.dtype] | None = None) -> None:
        super().__init__()
        self.recast = {k: v for k, v in (recast or {}).items() if len(k) == 2}
        # a line whose value the fix casts back to the data's dtype (``widened``): in a proof's re-run, each op there
        # that promotes a tensor of that dtype gives its result back in it, as the line's ``.to(x.dtype)`` would
        self.widen = {k[:2]: v for k, v in (recast or {}).items() if len(k) == 3}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None)
        if name in _REAL_MAKERS:
            return _real_made(name, (), func(*args, **kwargs))
        if _lazy_params(args):  # named before the op runs: the op is where it meets the virtual tensors
            _real_made(None, args, None)
        out = func(*args, **kwargs)
        if name not in _CAST_METHODS or not args:
            if self.widen and isinstance(out, VirtualTensor):
                out = self._widened(args, kwargs, out)
            return loose_call(name, args, out) if LOOSE[0] else out
        return self._made(args[0], out)

    def _widened(self, args: Any, kwargs: Any, out: Any) -> Any:
        from torchdoctor._virtual.origin import user_frame

        if not out.is_floating_point():
            return out
        f = user_frame(3)
        want = self.widen.get((f.f_code.co_filename, f.f_lineno)) if f is not None else None
        if want is None or out.dtype == want or torch.promote_types(want, out.dtype) != out.dtype:
            return out
        if any(isinstance(a, torch.Tensor) and a.dtype == want for a in (*args, *kwargs.values())):
            return out.to(want)
        return out

    def _made(self, t: Any, out: Any) -> Any:
        from torchdoctor._virtual.origin import Made, short_at, user_frame
        if not isinstance(out, VirtualTensor) or not isinstance(t, VirtualTensor) or out is t or \
                out.dtype == t.dtype or out._td_device != t._td_device:
            return out
        f = user_frame(3)
        if f is None:
            return out
        want = self.recast.get((f.f_code.co_filename, f.f_lineno))
        if want is not None and out.dtype != want:  # the fix at this line, applied in a proof's re-run
            out = out.to(want)
        space = current_space()
        module = space.hooks.running() if space is not None else None  # outside any module too (an optimizer's
        if (given := carried_from(f, out)) is not None:  # ``.to(t.dtype)``: ``t``'s maker chose the dtype
            out._td_path, out._td_origin = None, given
            return out
        site = cast_site(f, short_at(f), out.dtype)  # ``update.float()``): the cast set its dtype
        if site is None:
            return out
        made = Made(f"Tensor.{site.cast.split('(')[0]}", module, (f"cast at {site.at}",), 1, via=t._td_origin,
                    depth=(t._td_origin.depth + 1) if t._td_origin is not None else 1)
        made.site, made.made_of = site, ((t._td_path,) if t._td_path is not None else ())
        out._td_path, out._td_origin = None, made
        return out


def carried_from(frame: Any, out: Any) -> Any:
    """The record of a cast at ``frame``'s line that reads its dtype from another tensor (``.to(t.dtype)``,
    ``.type_as(t)``): a link through to that tensor's own record, whose maker chose the dtype (``carried``); None for
    a cast that writes its dtype, or a donor the run has no record of."""
    from torchdoctor._virtual.carried import donor
    from torchdoctor._virtual.origin import Made

    t = donor(frame, out.dtype)
    if t is None:
        return None
    if isinstance(t, VirtualTensor):
        via = t._td_origin
        if via is None and t._td_path is not None:
            return Made("Tensor.to", None, (t._td_path,), 1)
    else:
        space = current_space()
        kept = space.real_record(t) if space is not None and space.real else None
        via = kept[1] if kept is not None else None
    if via is None:
        return None
    return Made("Tensor.to", via.module, via=via, depth=via.depth + 1)


def loose_call(name: str | None, args: Any, out: Any) -> Any:
    """``out`` of a torch function (``torch.kron(self.w1, self.w2)``) that made it from parameters no module of the
    run holds: its record names that call, its line and every such parameter among its arguments, not the first
    aten op it decomposed into. Asked only once such a parameter met an op (``origin.LOOSE``)."""
    from torchdoctor._virtual.origin import Made

    if type(out) is not VirtualTensor or out._td_origin is None or not out._td_origin.source.loose:
        return out
    loose = tuple(a for a in args if isinstance(a, VirtualTensor) and a._td_path is None and a._td_origin is None
                  and a.requires_grad)
    if loose and name and not name.startswith("_"):
        made = Made(f"torch.{name}", out._td_origin.module)
        made.loose, out._td_origin = loose, made
    return out


# makers torch's function modes never see (they take no tensor): wrapped while a run is active (``install``)
_UNSEEN = ("from_numpy", "frombuffer")


def install(installs: Any) -> None:
    """Wrap ``torch.from_numpy`` / ``torch.frombuffer`` for the run, so the real tensor they make is named by its
    maker and line when it meets the virtual tensors (a mode never sees these calls)."""
    for name in _UNSEEN:
        original = getattr(torch, name, None)
        if original is not None:
            installs.set(torch, name, _unseen(name, original))
    from torchdoctor._virtual.legacy import default_type_setter, host_types

    for name, cls in host_types().items():  # torch.LongTensor([0]): named by its maker and line, as torch.zeros is
        installs.set(torch, name, cls, shared=True)
    setter = torch.__dict__.get("set_default_tensor_type")
    if setter is not None and getattr(setter, "__name__", "") == "set_default_tensor_type" and \
            not hasattr(setter, "__wrapped__"):
        wrapped = default_type_setter(setter)
        wrapped.__wrapped__ = setter  # type: ignore[attr-defined]
        installs.set(torch, "set_default_tensor_type", wrapped, shared=True)
    loading.install(installs)  # torch.load of a GPU checkpoint: its tensors on the virtual device
    from torchdoctor._virtual import assigned

    assigned.install(installs)  # load_state_dict(assign=True): the tensors it put in place, by the program's line
    hostmade.clear()  # the makers of the model's CPU tensors are this run's


def _unseen(name: str, original: Any) -> Any:
    def made(*args: Any, **kwargs: Any) -> Any:
        return _real_made(name, (), original(*args, **kwargs))

    made.__name__ = made.__qualname__ = name
    return made


PARAM = torch.nn.Parameter  # a real Parameter among an op's arguments: one a forward may have built lazily


def _lazy_params(args: Any) -> bool:
    """Cheap test: a real Parameter among the arguments (one a forward may have built lazily)."""
    return PARAM in map(type, args) if type(args) is tuple else False  # (at C speed: every op asks)


def _real_made(name: str | None, args: Any, out: Any) -> Any:
    """A real tensor made in the run from host data (``torch.from_numpy``), or a Parameter the running module built
    in its forward (after the model's ``.to``, so on the CPU): its maker is kept aside for the moment it meets the
    virtual tensors, so the problem names it and its line instead of "a tensor made in forward"."""
    from torchdoctor._virtual.origin import Made

    space = current_space()
    if space is None:
        return out
    module = space.hooks.running()
    if name in _REAL_MAKERS and isinstance(out, torch.Tensor) and not isinstance(out, VirtualTensor):
        space.keep_real(out, None, made := Made(f"torch.{name}", module))
        if module is None and made.at is not None:  # made inside a library's loader (safetensors' load_file): that
            loaded.through_call(made)  # call at the program's line is its maker
        hostmade.remember(out, made)  # a model's buffer registered from it is fixed at that line
        return out
    held = getattr(module, "_parameters", {}) if module is not None else {}
    for a in args:
        if type(a) is torch.nn.Parameter and space.real_record(a) is None:
            attr = next((k for k, v in held.items() if v is a), None)
            hit = hostmade.maker(a) if attr is not None else None
            if hit is not None and hit[3]:  # built in its module's __init__ (no lazy layer): a placement of the
                # model's layers that left it behind; no factory of a forward to fix
                made = Made(f"torch.nn.Parameter `{attr}` built in __init__ at {hit[1]}, not moved with its "
                            "module", module)
                made.at = None
                space.keep_real(a, None, made)
            elif attr is not None:  # the module holds it, yet it is real: built in forward, after the move
                made = Made(f"torch.nn.Parameter `{attr}` built in forward after the model's .to", module)
                made.at = None  # the line at hand uses it; the line that built it ran earlier
                space.keep_real(a, None, made)
    return out


# -- the run's inputs: made where the user would make them, named as simulate names them (input 0, kwarg mask) --


def place_inputs(space: Any, value: Any, device: torch.device, dtype: torch.dtype | None, path: str,
                  assume: torch.device | None = None) -> Any:
    """Inputs go where the user would put them: on ``device``, floating ones in ``dtype``. An input on meta is
    taken as loaded, as the weights are, only when meta tensors are assumed on a device; else its move is checked
    (and fails as the real one would)."""
    if isinstance(value, torch.Tensor):
        elem = space.inner_of(value)
        if value.device.type == "meta" and assume is None:
            return make(VirtualTensor, elem, value.device, path).to(device, dtype if elem.is_floating_point() else None)
        return make(VirtualTensor, elem.to(dtype) if dtype is not None and elem.is_floating_point() else elem,
                    device, path)
    if isinstance(value, dict):
        return type(value)({k: place_inputs(space, v, device, dtype, f"{path}.{k}", assume) for k, v in value.items()})
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(place_inputs(space, v, device, dtype, f"{path}.{i}", assume) for i, v in enumerate(value))
    return value


def built_on(found: Any, device: torch.device) -> bool:
    """The TARGET's own code put its tensors on the virtual device (``model.to("mps")`` in ``build_target``): its
    placement is checked as built, not redone (a redone move hides the inputs or quant state it left behind)."""
    return any(getattr(e.tensor, "_td_device", e.tensor.device).type == device.type for e in found.entries)


def placed_on(value: Any, device: torch.device | None, dtype: torch.dtype | None, assume: torch.device | None,
               path: str) -> Any:
    """Inputs a TARGET returned, where the user would put them: on ``device``, floating ones in ``dtype``; named
    ``input 0`` / ``kwarg mask`` as ``simulate`` names them (``device`` None: where the TARGET put them), and taken as loaded on ``assume`` when on meta, as the
    model's weights are."""
    if isinstance(value, torch.Tensor):
        space = current_space()
        if not isinstance(value, VirtualTensor) and space is not None and unsupported_form(value) is None:
            # the TARGET's CPU or meta tensors stayed real: a twin where it is, to be named and placed
            value = make(VirtualTensor, space.inner_of(value), value.device, path)
        if isinstance(value, VirtualTensor):
            if value._td_path is None:
                value._td_path = path
            if assume is not None and value._td_device.type == "meta":
                value._td_device = assume
        if device is None:  # placed by the TARGET's code: passed as built
            return value
        return value.to(device, dtype) if dtype is not None and value.is_floating_point() else value.to(device)
    if isinstance(value, dict):
        return type(value)({k: placed_on(v, device, dtype, assume, f"{path}.{k}") for k, v in value.items()})
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(placed_on(v, device, dtype, assume, f"{path}.{i}") for i, v in enumerate(value))
    return value


def operand_fix(source: str, target: torch.dtype | torch.device, module: str | None = None) -> tuple[str, str | None] | None:
    """The fix of an operand an op refuses in its dtype (a loss's ``target`` where its input is float32), or on its
    device (between the parts of a model the program split: ``image_features.to(inputs_embeds.device)``), at the
    user's call: ``source`` is ``operand target at app.py:16`` (``origin.operand_at``); the line as it should read,
    the operand cast or moved there, and its unified diff. None when the line cannot be read back. ``module``: the
    module the failing op ran in; a line that hands the operand to it by name (``self.post(t)``) moves it to that
    module's device (``t.to(next(self.post.parameters()).device)``), never to a device written out."""
    import linecache
    import re

    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.origin import LIKE, LINES

    name, _, at = source.removeprefix("operand ").partition(" at ")
    file, line = LINES.get(at, ("", 0))
    old = linecache.getline(file, line) if file else ""
    to = target if isinstance(target, torch.dtype) else f"{LIKE[source]}.device" if source in LIKE else \
        _module_device(old, name, module) or repr(str(target))
    new = re.sub(rf"(?<![\w.]){re.escape(name)}\b(?!\s*=[^=]){_NOT_READ}", f"{name}.to({to})", old.rstrip("\r\n"),
                 count=1)  # the operand itself, never a read of its size or placement (``enc.size(0)``)
    if not old or new == old.rstrip("\r\n"):
        return None
    return new.strip(), line_patch(file, line, new)


def _module_device(line: str, name: str, module: str | None) -> str | None:
    """``next(self.post.parameters()).device`` where ``line`` calls the module the op ran in (``post``, by its last
    name) with ``name`` as its first argument; None otherwise."""
    import re

    last = (module or "").rsplit(".", 1)[-1]
    if not last.isidentifier():
        return None
    m = re.search(rf"(?<![\w.])((?:\w+\.)*{re.escape(last)})\(\s*{re.escape(name)}\b", line)
    return f"next({m.group(1)}.parameters()).device" if m else None


# what reads a tensor's metadata, not its data: a ``.to()`` there changes nothing the op meets
_NOT_READ = r"(?!\s*\.\s*(?:size|shape|dim|ndim|ndimension|numel|nelement|device|dtype|stride|get_device|is_\w+)\b)"


def reversed_by(p: Any, problems: Sequence[Any], sources: Mapping[tuple[str, ...], tuple[str, ...]],
                model: Mapping[str, Any], mapped: frozenset[str] = frozenset()) -> bool:
    """A device problem of an operand whose op ran where a tensor of the model (``model``: its paths) was met the
    other way round (a split model's top-level parameter left on cuda:0 made the op run there, and that tensor is
    fixed to the operand's device): the operand moved to the op's device would undo that fix, so it keeps its
    place. An operand met the other way round, not a model's tensor (a second crossing of a split), is no reason."""
    return p.kind == "device" and any(
        q is not p and q.kind == "device" and q.found == p.expected and q.expected == p.found and
        any(s in model and not any(s.startswith(m + ".") or not m for m in mapped)
            for s in sources.get((q.kind, q.path, q.op or "", q.found), ())) for q in problems)

"""Module-entry checks of a virtual run: when a module's forward starts, every tensor it owns must sit where it
computes, whatever kernel path runs later.

A single-row bitsandbytes 4-bit input takes ``gemv_4bit``, which reads ``quant_state.code``; a two-row input
dequantizes without it — so a ``quant_state.code`` left on another device is invisible to op-level checks on one
path and a crash on the other. Owned tensors are the module's parameters and buffers, what hangs off them
(``weight.quant_state`` and its nested state, 8-bit ``CB``/``SCB``), its plain tensor attributes and containers
(a list still holding buffers ``.to()`` replaced), ``ParameterDict``/``ParameterList`` children (never called, so
never entered) and modules kept in plain lists. They are found by the one walker, each module checked once per
placement change; a module holding only atoms and plain tensors (most of a model) is read directly, with the
same answer the walk gives (``_plain_owned``, pinned equal to the walk by the tests).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchdoctor._placement import compact, device_str, dtype_str, norm_device, tensor_device
from torchdoctor._scan import apps, intent, percall
from torchdoctor._scan.intent import STORAGE_DTYPES
from torchdoctor._scan.judge import cpu_packed_message, storage_message
from torchdoctor._virtual import takenback
from torchdoctor._virtual.apart import Apart, seen
from torchdoctor._virtual.callargs import DEPTH as _DEPTH, named as _named, signature_of as _signature_of
from torchdoctor._virtual.tensor import VirtualTensor, current_space, virtual_class
from torchdoctor._walk import walk
from torchdoctor._walk.kinds import FAST_ATOMS, PLAIN

_SKIP = frozenset(nn.Module().__dict__) | {"_hf_hook", "_old_forward", "forward", "config", "generation_config",
                                           "_diffusers_hook"}
_HOLDERS = (nn.ParameterDict, nn.ParameterList)
_CODE = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)


def owned(mod: nn.Module) -> list[tuple[str, torch.Tensor, str]]:
    """(path relative to ``mod``, tensor, role) of what ``mod`` itself owns (not its called submodules)."""
    holder, buffers, d = holding(mod)
    plain = _plain_owned(holder, buffers, d)
    if plain is not None:
        return plain
    best: dict[int, tuple[str, torch.Tensor, str]] = {}
    via_tensor = {k for k, v in holder.items() if isinstance(v, torch.Tensor)}
    for e in walk(holder).entries:  # canonical paths first; never through a module a tensor points back to
        parts = e.path.split(".", 2)
        if e.role == "offloaded" or id(e.tensor) in best or e.module is mod or intent.unused_quant_field(e) or (
                len(parts) > 2 and parts[0] in via_tensor and isinstance(getattr(holder[parts[0]], "__dict__", {})
                                                                         .get(parts[1]), nn.Module)):
            continue  # e.g. bitsandbytes' ``weight.module``: the layer itself again
        role = "parameter" if isinstance(e.tensor, nn.Parameter) else "buffer" if e.path in buffers else \
            "attribute" if e.path in d else e.role  # the walk saw a dict: name what the module holds directly
        best[id(e.tensor)] = (e.path, e.tensor, role)
    return list(best.values())


def holding(mod: nn.Module) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """What ``owned`` looks through: the parameters, buffers, ``ParameterDict``/``ParameterList`` children and
    data attributes of ``mod`` by name; its buffers; its ``__dict__``."""
    d = mod.__dict__
    holder: dict[str, Any] = {}
    holder.update(d.get("_parameters") or {})
    buffers = d.get("_buffers") or {}
    holder.update(buffers)
    for k, v in (d.get("_modules") or {}).items():
        if isinstance(v, _HOLDERS):
            holder[k] = v
    for k, v in d.items():
        if k not in _SKIP and not k.startswith("__") and not isinstance(v, (nn.Module, *_CODE)):
            holder[k] = v  # code (a wrapped ``to`` left by accelerate) is not data the forward reads
    return holder, buffers, d


# tensors the walker reads as themselves alone when their own __dict__ holds only atoms (the simulation's twins
# keep their parts in slots)
_PLAIN_TENSORS = frozenset({*PLAIN, VirtualTensor, virtual_class(nn.Parameter)})
_ATOM_SEQS = (tuple, list)


def _plain_owned(holder: dict[str, Any], buffers: dict[str, Any], d: dict[str, Any]) -> list[tuple[str, Any, str]] | None:
    """``owned``'s answer without a walk, for the common module: only atoms, lists or tuples of atoms, and plain
    tensors with nothing of their own hanging off them (a Linear, a norm, an attention block). None for anything
    else (a quant_state, a container of tensors, a ParameterDict, a tensor subclass): the walk decides. A walk per
    module entry was ~8 % of a 70B simulation."""
    out: list[tuple[str, Any, str]] = []
    seen: set[int] = set()
    atoms = FAST_ATOMS
    for k, v in holder.items():
        tv = type(v)
        if tv in atoms:
            continue
        if tv in _PLAIN_TENSORS:
            td = v.__dict__
            if (td and not atoms.issuperset(map(type, td.values()))) or type(k) is not str or "." in k:
                return None
            if id(v) in seen:
                continue  # a tensor held twice: its first path, as the walk gives it
            role = "parameter" if isinstance(v, nn.Parameter) else "buffer" if k in buffers else \
                "attribute" if k in d else None
            if role is None:
                return None
            seen.add(id(v))
            out.append((k, v, role))
        elif tv in _ATOM_SEQS and atoms.issuperset(map(type, v)):
            continue
        else:
            return None
    return out


class EntryCheck:
    """Called by the module stack when a module starts; reports owned tensors off the module's compute device
    through ``note(kind, path, found, expected, message, op)``."""

    def __init__(self, device: torch.device, note: Callable[..., None], dispatched: Callable[[], bool]) -> None:
        self.device = device
        self.note = note
        self.dispatched = dispatched
        self.seen: dict[int, tuple[Any, ...]] = {}
        # path -> the note of a plain attribute / container tensor, written when an op reads it: a tensor the
        # forward never reads (Lightning's example_input_array, a loss history, an alias of a moved buffer) is quiet
        self.pending: dict[str, tuple[Any, ...]] = {}
        self.outer: dict[int, Apart] = {}  # id -> each module that started a forward as the outermost one
        # an argument's fix label -> the factory, line and dtype it was made by (its dtype is fixed at that line)
        self.made_args: dict[str, tuple[str, str, str]] = {}
        # layer path -> (id of the layer, twins of the floating tensors it was first given): a fix that casts or
        # moves a component is proven at its layers' entries too (``atop.entry_check``): what they are given must
        # follow (a torch layer computes with its input as given)
        self.inputs: dict[str, tuple[int, list[Any]]] = {}
        # path -> (its last change, when): a copy the program took to the cpu at its own line (``takenback``)
        self.changes: dict[str, tuple[str, float]] = {}
        self.copies: dict[str, str] = {}  # path -> "moved <path> at <line>": a copy handed in there, by its line
        self.given: dict[int, dict[str, str]] = {}  # id of an outermost module -> its last call's tensors' devices
        self.ints: set[str] = set()  # the caller's integer arguments by label: no fix casts one to a float dtype

    def __call__(self, mod: nn.Module, path: str, args: Any) -> None:
        if path not in self.inputs and len(self.inputs) < _INPUTS and \
                type(mod).__module__.startswith("torch.nn.modules"):  # a layer computing with what it is given
            self.inputs[path] = (id(mod), _given(args))  # kept for the proof of a fix at its entry
        if "_orig_mod" in mod.__dict__.get("_modules", ()):
            return  # a torch.compile wrapper: the module it wraps starts next and is checked then
        if "forward" in mod.__dict__:  # a hook wrapper (accelerate, diffusers group offloading / layerwise casting)
            self._hooked(mod, path)  # runs after this and may onload or cast the module's tensors; its ops are
            return  # still checked, and its plain attributes (no hook moves them) here
        key = _signature(mod)
        if self.seen.get(id(mod)) == key:
            return
        self.seen[id(mod)] = key
        tensors = owned(mod)
        if not tensors:
            return
        space = current_space()
        if space is not None:  # real tensors (a model built before the run) are lifted per op: name them
            for rel, t, _ in tensors:
                if not isinstance(t, VirtualTensor):
                    space.named[id(t)] = (t, f"{path}.{rel}" if path else rel)
        if intent.computes_in_storage(mod):
            self._storage(mod, path, tensors, args)
        ref = self._reference(mod, tensors, args)
        if ref is None:
            return
        # the module's own forward pre-hooks run after this check (an app's sequential offload moving each layer
        # to the device just before its forward): what they leave on another device is told when an op reads it
        later = bool(mod.__dict__.get("_forward_pre_hooks"))
        for rel, t, role in tensors:
            dev = norm_device(tensor_device(t))
            if role == "parameter" and dev.type not in ("cpu", "meta") and intent.cpu_packed(t):
                full = f"{path}.{rel}" if path else rel
                self.note("quant_incomplete", full, "cpu-packed", device_str(dev),
                          cpu_packed_message(full, device_str(dev)), f"{type(mod).__name__}.forward", role,
                          compact(t.dtype, tuple(t.shape), dev))
                continue
            self._place(mod, path, rel, t, role, dev, ref, later)

    def _place(self, mod: nn.Module, path: str, rel: str, t: torch.Tensor, role: str, dev: torch.device,
               ref: torch.device, later: bool = False) -> None:
        """One owned tensor on ``dev`` when ``mod`` computes on ``ref``: noted unless a mechanism puts it there on
        purpose (scan's answer); a plain attribute or container tensor only once an op reads it."""
        if dev == ref or dev.type == "meta" or (dev.type == "cpu" and t.dim() == 0):
            return
        name = rel.split(".", 1)[0]
        if role in ("attribute", "container") and not isinstance(mod.__dict__.get(name), _HOLDERS) \
                and intent.self_managed(mod, name):
            return  # the module's own code moves or rebuilds it before use
        app = apps.intended_at(mod, name, t, role)  # scan's one answer: per-call moves, schedules, backups
        if app is not None and app[1] & percall.DEVICE:
            return
        full = f"{path}.{rel}" if path else rel
        from torchdoctor._virtual.hostmade import maker_note  # the program's factory that made it, if one did

        back, source, said = takenback.of(t), None, ""  # a copy the program took to the cpu at its own line
        if back is not None:
            from torchdoctor._virtual.stackview import held_as

            held = held_as(t)  # as the program holds it (``master['lin.weight']``)
            said = back.said(device_str(dev), held)
            self.changes[full] = (back.note(device_str(dev)), back.time)
            if role in _COPIES and not back.by_module:  # a copy held apart and handed in: fixed at that line
                source = self.copies[full] = f"moved {full} at {back.at}"
        note = ("device", full, device_str(dev), device_str(ref),
                f"{full} {compact(t.dtype, tuple(t.shape), dev)}{said} is on "
                f"{device_str(dev)} when {path or '<root>'} ({type(mod).__name__}) starts on {device_str(ref)}: "
                f"{_WHY.get(role, f'a {role} the forward reads')}{maker_note(t)}", f"{type(mod).__name__}.forward", role,
                compact(t.dtype, tuple(t.shape), dev), source)
        if role in ("attribute", "container") or later:
            self.pending[full] = note
        else:
            self.note(*note)
        if "_td_path" in dir(type(t)):  # a virtual twin: later ops name it where it was found, not where it
            t._td_path = full  # type: ignore[attr-defined]  # was lifted (a list holding a buffer .to() replaced)

    def _hooked(self, mod: nn.Module, path: str) -> None:
        """A module behind an accelerate hook: the hook brings its parameters and buffers to its execution device
        (an offload or a dispatch, an app's hook included), never a plain tensor attribute, which its forward
        then reads where it was left: judged against that device as scan judges it (``offloaded``)."""
        hook = mod.__dict__.get("_hf_hook")
        ref = (intent.offload_device(hook) or intent.dispatch_device(hook)) if hook is not None else None
        if ref is None:
            return
        key = _signature(mod)
        if self.seen.get(id(mod)) == key:
            return
        self.seen[id(mod)] = key
        ref, space = norm_device(ref), current_space()
        for rel, t, role in owned(mod):
            if role in ("attribute", "container"):
                if space is not None and not isinstance(t, VirtualTensor):  # lifted per op: named as at a start
                    space.named[id(t)] = (t, f"{path}.{rel}" if path else rel)
                self._place(mod, path, rel, t, role, norm_device(tensor_device(t)), ref)

    def _storage(self, mod: nn.Module, path: str, tensors: list[tuple[str, torch.Tensor, str]], args: Any) -> None:
        """Integer codes (GGUF-style uint8 blocks, int8) in a layer whose forward is torch's own: it computes with
        them as they are, a problem here as in scan (rule ``storage-computed``, one text). The op then fails on a
        dtype check no float rule reads (float8 there is named by the op's own check already)."""
        want = next((a.dtype for a in (args if isinstance(args, tuple) else ())
                     if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
        if want is None:  # an index input (an Embedding): the layer's other float weights say what it computes in
            want = next((t.dtype for _, t, role in tensors if role == "parameter" and t.is_floating_point()
                         and t.dtype not in STORAGE_DTYPES), None)
        if want is None:
            return
        for rel, t, role in tensors:
            if role != "parameter" or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
                continue
            full = f"{path}.{rel}" if path else rel
            c = compact(t.dtype, tuple(t.shape), norm_device(tensor_device(t)))
            msg = storage_message(type(mod).__name__, t, f"{full} {c}", dtype_str(t.dtype), dtype_str(want),
                                  "its input", switch=intent.cast_switch(mod))
            self.note("dtype", full, dtype_str(t.dtype), dtype_str(want), msg, f"{type(mod).__name__}.forward",
                      role, c)

    def call(self, mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        """The outermost module starts: each tensor the caller passed (one container level deep) becomes the source
        of what is made from it, named as the forward sees it (``input_ids``, ``extra[0]``,
        ``kwargs['rotary_pos_emb_list'][0]``) and as the caller wrote it for the fix (``kwarg extra[0]``), with where
        it was made (a factory's file:line, or before the run). Tensors made before the run are replaced by twins
        (new positional arguments are returned; keyword ones are replaced in ``kwargs``, the call's own dict)."""
        if id(mod) not in self.outer:  # named by the program's frames, alive now (a module held apart: ``apart``)
            self.outer[id(mod)] = seen(mod)
        space = current_space()
        if space is None or not (args or kwargs):
            return None
        try:
            pos, varkw = _signature_of(mod)
        except (TypeError, ValueError):  # no signature (a builtin forward): the caller's positions and keywords
            pos, varkw = (), None
        who = type(mod).__name__
        out = list(args)
        if len(self.given) < 64:  # by the caller's label (``input 1 (attention_mask)``): ``keptplace`` moves them
            self.given[id(mod)] = {(f"input {i} ({pos[i]})" if i < len(pos) else f"input {i}") if isinstance(i, int)
                                   else f"kwarg {i}": device_str(tensor_device(a)) for i, a in
                                   [*enumerate(args), *kwargs.items()] if isinstance(a, torch.Tensor)}
            self.ints.update(label for label, a in zip(self.given[id(mod)], [a for a in (*args, *kwargs.values()) if
                             isinstance(a, torch.Tensor)]) if not (a.is_floating_point() or a.is_complex()))
        for i, a in enumerate(args):
            if i < len(pos):
                out[i] = _named(space, a, pos[i], f"input {i} ({{}})", who, _DEPTH, makers=self.made_args)
            else:  # forward(*args): the caller's position
                out[i] = _named(space, a, f"input {i}", f"input {i}{{}}", who, _DEPTH, suffix=True,
                                makers=self.made_args)
        for k in list(kwargs):
            name = k if varkw is None or k in pos else f"{varkw}[{k!r}]"
            new = _named(space, kwargs[k], name, f"kwarg {k}{{}}", who, _DEPTH, suffix=True, makers=self.made_args)
            if new is not kwargs[k]:
                kwargs[k] = new
        return tuple(out) if any(a is not b for a, b in zip(out, args)) else None

    def reached(self, tensors: list[Any]) -> None:
        """These tensors reached an op: a pending attribute / container among them is reported now."""
        for t in tensors:  # a copy the forward moved first (``w.scale.to(x.device)``) keeps the name, not the fault
            path = getattr(t, "_td_path", None) or ""
            note = self.pending.get(path)
            if note is not None and device_str(getattr(t, "_td_device", t.device)) == note[2]:
                self.note(*self.pending.pop(path))

    def _reference(self, mod: nn.Module, tensors: list[tuple[str, torch.Tensor, str]], args: Any) -> Any:
        """Where the module computes: the run's device when its input is there (and no accelerate hook spreads the
        model), else where most of its own floating weights are."""
        if not self.dispatched():
            x = next((a for a in (args if isinstance(args, tuple) else ()) if isinstance(a, torch.Tensor)), None)
            if x is not None and norm_device(tensor_device(x)) == self.device:
                return self.device
        counts: dict[torch.device, int] = {}
        for _, t, role in tensors:
            if role in ("parameter", "buffer") and t.is_floating_point():
                d = norm_device(tensor_device(t))
                counts[d] = counts.get(d, 0) + 1
        return max(counts, key=counts.__getitem__) if counts else None


_COPIES = ("parameter", "buffer", "container")  # what a copy handed to a module stands in for (functional_call)
_INPUTS = 4096  # modules whose inputs are kept (the first ones; a bound on a huge model's memory)


def _given(args: Any) -> list[Any]:
    """Metadata twins of the floating tensors among a torch layer's positional arguments (at most 4)."""
    from torchdoctor._virtual.twins import Operand, tags_of

    out: list[Any] = []
    for a in (args if isinstance(args, tuple) else ())[:4]:
        if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
            try:
                out.append(Operand(a, *tags_of(a, {})))
            except Exception:  # an odd tensor: not kept, never a break of the run
                continue
    return out


_WHY = {  # why a tensor the module owns can sit elsewhere than the rest
    "parameter": "a parameter the forward reads (not moved with its input, or moved or replaced after the model's .to)",
    "buffer": "a buffer the forward reads (not moved with its input, or moved or replaced after the model's .to)",
    "attribute": "a plain tensor attribute the forward reads (Module.to moves parameters and buffers only)",
    "container": "a tensor in a list or dict the forward reads (Module.to moves parameters and buffers only)",
    "quant_state": "quantization state the kernel reads (Module.to moved the weight, not the state hanging off it)",
}


def _signature(mod: nn.Module) -> tuple[Any, ...]:
    """Cheap: changes when a parameter, buffer or attribute of ``mod`` is replaced or moved."""
    d = mod.__dict__
    sig: list[Any] = []
    for store in (d.get("_parameters") or {}, d.get("_buffers") or {}):
        for t in store.values():
            if t is not None:
                sig.append((id(t), getattr(t, "_td_device", None) or t.device))
    for k, v in d.items():
        if k not in _SKIP and not isinstance(v, nn.Module):
            sig.append((k, id(v), getattr(v, "_td_device", None) or getattr(v, "device", None)))
    return tuple(sig)

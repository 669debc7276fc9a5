"""The module-entry hook of a virtual run, and TorchScript in it: ``torch.jit.trace`` inside the run records the program's own ops (module-entry checks
stand aside, so the trace keeps its inputs), and a TorchScript module's tensor constants (a plain attribute the
tracer baked into its code) are judged when it starts: ``.to`` never moves a constant, and the ops inside run in C++
where a virtual run cannot tell a constant from a tensor made like the inputs, so one on another device than the
module's inputs is said there, named as the program holds it (``m.pos_table``) (docs/architecture.md, _virtual)."""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

import torch
from torch import nn

from torchdoctor._placement import compact, norm_device, tensor_device
from torchdoctor._virtual.tensor import VirtualTensor, current_space

_FLOATING = frozenset({"Float", "Double", "Half", "BFloat16"})
_SKIP = ("site-packages", "dist-packages", "/torch/", "/torchdoctor/", "<frozen")


def tracing() -> bool:
    return torch._C._get_tracing_state() is not None


def constants(mod: nn.Module) -> list[torch.Tensor]:
    """The tensor constants of a TorchScript module's code (its submodules' inlined) with more than one element."""
    try:
        graph: Any = getattr(mod, "inlined_graph")
    except Exception:  # a module whose code cannot be inlined: nothing read, nothing claimed
        return []
    found = []
    for node in graph.nodes():
        if node.kind() != "prim::Constant" or node.output().type().kind() != "TensorType":
            continue
        try:
            t = node.t("value")
        except RuntimeError:
            continue
        if isinstance(t, torch.Tensor) and t.dim() > 0 and t.device.type != "meta":  # a CPU scalar meets any device
            found.append(t)
    return found


def cpu_made(mod: nn.Module) -> list[tuple[str, str]]:
    """Factories of a TorchScript module's code given the constant device ``cpu`` (``torch.arange(n)`` traced: the
    tracer records the device it ran on), whose tensor (not a scalar) is used other than moved: (op, file:line)."""
    try:
        graph: Any = getattr(mod, "inlined_graph")
    except Exception:
        return []
    found = []
    for node in graph.nodes():
        cpu = any(i.node().kind() == "prim::Constant" and i.type().kind() == "DeviceObjType"
                  and i.node().kindOf("value") == "s" and i.node().s("value") == "cpu" for i in node.inputs())
        if not cpu or node.outputsSize() != 1 or node.output().type().kind() != "TensorType":
            continue
        ty = node.output().type()
        if getattr(ty, "scalarType", lambda: None)() not in _FLOATING:  # integer positions index: the rules' case
            continue
        sizes = getattr(ty, "sizes", lambda: None)()
        uses = {u.user.kind() for u in node.output().uses()}
        if sizes == [] or not uses - {"aten::to", "aten::cuda", "aten::type_as"}:
            continue
        frames = [ln.rpartition(":")[0] for ln in node.sourceRange().splitlines() if "(" in ln]
        own = next((f for f in frames if not any(k in f for k in _SKIP)), frames[0] if frames else "?(?)")
        file, _, line = own.partition("(")  # ``app.py(6)``: the program's line, not the run's own frame
        found.append((node.kind().partition("::")[2], f"{file}:{line.rstrip(')')}"))
    return found


def plain_attributes(mod: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A scripted module's tensor attributes that are neither parameters nor buffers (``self.scale = torch.ones(4)``),
    its submodules' included, that its code reads: ``.to()`` moves none of them. A CPU scalar meets any device."""
    try:
        found = torch._C._jit_debug_module_iterators(mod._c)["named_attributes_r"]  # type: ignore[attr-defined]
        owned = {id(t) for t in (*mod.parameters(), *mod.buffers())}
    except Exception:  # not a scripted module's C++ object: nothing read, nothing claimed
        return []
    out = []
    for item in found:
        name = item[0] if isinstance(item, tuple) else item
        holder, _, leaf = name.rpartition(".")
        try:
            sub = mod
            for part in holder.split(".") if holder else ():  # ``get_submodule`` is refused on ScriptModules
                sub = getattr(sub, part)
            t = getattr(sub, leaf)
            uses = _uses(sub.graph, leaf) if isinstance(t, torch.Tensor) and id(t) not in owned else None
        except Exception:  # an attribute the C++ side holds and Python cannot read back
            continue
        # read by the forward, and not moved first by its own code (``self.scale.to(x.device)``)
        if uses and t.dim() > 0 and not uses & {"aten::to", "aten::cuda", "aten::type_as"}:
            out.append((name, t))
    return out


def _uses(graph: Any, leaf: str) -> set[str]:
    """The kinds of the nodes that take ``self.<leaf>`` as the forward's graph reads it."""
    return {u.user.kind() for node in graph.nodes() if node.kind() == "prim::GetAttr" and node.s("name") == leaf
            for u in node.output().uses()}


def held_as(t: torch.Tensor) -> str | None:
    """``m.pos_table``: the program's own module that holds ``t`` (the tracer keeps the very tensor) as a plain
    attribute, a parameter or a buffer, read from the program's live frames (innermost first)."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        if not any(s in frame.f_code.co_filename for s in _SKIP):
            for name, obj in list(frame.f_locals.items()):
                if isinstance(obj, nn.Module) and not isinstance(obj, torch.jit.ScriptModule):
                    for path, sub in list(obj.named_modules())[:2000]:
                        for attr, value in list(vars(sub).items()):
                            if value is t:
                                return ".".join(p for p in (name, path, attr) if p)
                        for attr, value in (*sub._parameters.items(), *sub._buffers.items()):
                            if value is t:
                                return ".".join(p for p in (name, path, attr) if p)
        frame = frame.f_back
    return None


def local_name(obj: Any) -> str | None:
    """The name the program's own code (innermost frame first) holds ``obj`` by in its locals, or None."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        if not any(s in frame.f_code.co_filename for s in _SKIP):
            name = next((k for k, v in list(frame.f_locals.items()) if v is obj and k != "self"), None)
            if name is not None:
                return name
        frame = frame.f_back
    return None


class Entered:
    """The module-entry check (``entry.EntryCheck``) as the module stack calls it, with TorchScript's two cases,
    and a second copy of the model run on its own (an EMA copy: ``ema(x)``) named under the program's name for it
    (``ema.backbone.weight``), never as the model's own ``backbone.weight``."""

    def __init__(self, entry: Any, note: Callable[..., None], device: torch.device, stack: Any) -> None:
        self.entry, self.note, self.device, self.stack = entry, note, device, stack
        self.names: dict[int, str] = {}

    def _rooted(self, path: str) -> str:
        st = self.stack
        root = st.stack[0] if st.stack else None
        first = st.outermost[0] if st.outermost else None
        if root is None or first is None or root is first or type(root) is not type(first):
            return path
        name = self.names.get(id(root))
        if name is None:
            name = self.names[id(root)] = local_name(root) or ""
        return f"{name}.{path}" if name and path else name or path

    def call(self, mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        if tracing():  # a twin of a traced input would be baked into the graph as a constant
            return None
        from torchdoctor._virtual.modcast import counts
        from torchdoctor._virtual.usesite import note

        note(mod, counts())  # the program's line that uses it: a model offloaded between two uses is fixed there
        return self.entry.call(mod, args, kwargs)  # type: ignore[no-any-return]

    def __call__(self, mod: nn.Module, path: str, args: Any) -> None:
        if tracing():  # the program's own trace (CPU work, judged when the traced module runs)
            return
        path = self._rooted(path)
        if isinstance(mod, torch.jit.ScriptModule):
            self.scripted(mod, path, args)
        self.entry(mod, path, args)

    def scripted(self, mod: nn.Module, path: str, args: Any) -> None:
        given = next((a for a in (args if isinstance(args, tuple) else (args,)) if isinstance(a, VirtualTensor)), None)
        if given is None:
            return
        where, kind = given._td_device, type(mod).__name__
        for t in constants(mod):
            if t.device == where or isinstance(t, VirtualTensor) and t._td_device == where:
                continue
            space = current_space()
            kept = space.real_record(t) if space is not None and space.real else None  # traced in this run
            name = held_as(t) or (kept[0] if kept is not None and kept[0] else None) or \
                f"{path or '<root>'}.<constant>"
            shown = compact(t.dtype, tuple(t.shape), norm_device(t.device))
            self.note("device", name, str(t.device), str(where),
                      f"{name} {shown} is a constant of the TorchScript module `{path or '<root>'}` ({kind}): "
                      f"torch.jit.trace baked it into the code on {t.device}, and `.to()` never moves a constant, "
                      f"so it meets the inputs on {where}; register it as a buffer "
                      f"(self.register_buffer(...)) before tracing, or trace on {where}",
                      f"{kind}.forward", "attribute", shown)
            if space is not None:  # said once: the ops that meet it go on as if it were fixed (kept alive, named)
                t.__dict__["_td_device"] = where
                space.relabelled.append(weakref.ref(t))
                space.named[id(t)] = (t, name)
        space = current_space()
        for op, at in cpu_made(mod) if space is not None and space.data == "cpu" else ():  # a meta run's ops see it
            name = f"{path or '<root>'}.<{op} at {at.rpartition('/')[2]}>"
            self.note("device", name, "cpu", str(where),
                      f"{name}: torch.{op} at {at} in the TorchScript module `{path or '<root>'}` ({kind}) makes its "
                      f"tensor on cpu: torch.jit.trace recorded the device it ran on, so it meets the inputs on "
                      f"{where} (device=x.device and .to(x) are recorded as the constants they were too); make it "
                      f"once in __init__ as a buffer (self.register_buffer(...)), which .to() moves, or trace on "
                      f"{where}", f"{kind}.forward", "attribute", name)
        for rel, t in plain_attributes(mod) if isinstance(mod, torch.jit.RecursiveScriptModule) else ():
            dev = norm_device(tensor_device(t))
            if dev == where:
                continue
            root = local_name(mod) if not path else None  # as the program holds it: ``scripted.scale``
            name = ".".join(p for p in (root or path, rel) if p)
            shown = compact(t.dtype, tuple(t.shape), dev)
            self.note("device", name, str(dev), str(where),
                      f"{name} {shown} is a plain tensor attribute of the TorchScript module `{path or '<root>'}` "
                      f"({kind}): `.to()` moves only parameters and buffers, so it stays on {dev} and meets the "
                      f"inputs on {where}; register it as a buffer (self.register_buffer({rel.rpartition('.')[2]!r}, "
                      f"...)) before torch.jit.script, or move it yourself", f"{kind}.forward", "attribute", shown)

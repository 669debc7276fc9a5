"""A model placed by accelerate or diffusers hooks (group offloading, CPU offload): ``torchdoctor.move`` refuses to
move it, so it is never the fix. A plain tensor attribute of a hooked module (a quantized layer's ``scale`` kept
outside its parameters) is never onloaded: the hooks move parameters and buffers only. Its fix is to register it as
a buffer where the module builds it (``self.register_buffer('scale', ..., persistent=False)`` at that line of its
``__init__``, a diff), proven by a re-run in which those attributes are buffers of the copy
(``Fix.rebuffer``, applied by ``prove.rebuffered``).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import torch

from torchdoctor._placement import device_str
from torchdoctor._virtual.prove import Fix


def _hooked(root: Any, device: torch.device) -> tuple[list[tuple[str, Any]], str]:
    """(the hooked modules with a hook that refuses a move, by path; the first refusal), or ([], "")."""
    from torchdoctor._move.owners import hook_refusal
    from torchdoctor._walk import walk

    hooked, why = [], ""
    for mpath, mod, hook in walk(root).hooks:
        said = hook_refusal(hook, device)
        if said:
            hooked.append((mpath, mod))
            why = why or said
    return hooked, why


def _built_at(mod: torch.nn.Module, name: str) -> tuple[str, int, str] | None:
    """(file, line, the line rewritten) where ``mod``'s class assigns ``self.<name> = ...`` in ``__init__`` on one
    line; None otherwise."""
    init = type(mod).__init__
    try:
        lines, start = inspect.getsourcelines(init)
        file = inspect.getsourcefile(init) or ""
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1 and
            ast.unparse(n.targets[0]) == f"self.{name}" and n.lineno == n.end_lineno]
    if len(hits) != 1 or not file:
        return None
    line = start + hits[0].lineno - 1
    raw = lines[hits[0].lineno - 1].rstrip("\n").rstrip("\r")
    body = raw.lstrip(" \t")
    if not body.startswith(f"self.{name}") or not raw.isascii():
        return None
    stmt = ast.parse(body).body[0]
    assert isinstance(stmt, ast.Assign)
    expr = ast.get_source_segment(body, stmt.value)
    end = stmt.end_col_offset or len(body)
    if expr is None:
        return None
    new = raw[:len(raw) - len(body)] + f"self.register_buffer({name!r}, {expr}, persistent=False)" + body[end:]
    return file, line, new


def _plain(root: torch.nn.Module, paths: Any, device: torch.device) -> list[tuple[str, Any]]:
    """The modules (by path) whose plain tensor attribute named by a failing op's operand (``2.scale``) sits on
    another device type than ``device``: a layer the program moves with ``Module.to`` (a per-layer offloader's
    ``m.to(device)``) leaves it where ``__init__`` made it."""
    out = []
    for path in dict.fromkeys(paths or ()):
        mpath, _, name = (path or "").rpartition(".")
        try:
            mod = root.get_submodule(mpath)
        except (AttributeError, TypeError):
            continue
        value = vars(mod).get(name)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and \
                getattr(value, "_td_device", value.device).type != device.type and (mpath, mod) not in out:
            out.append((mpath, mod))
    return out


def _unhooked(f: Fix, covered: set[str]) -> bool:
    """Every tensor ``f`` moves is held by a module no hook places (``covered``: the hooked modules' paths)."""
    return bool(f.sets) and all(isinstance(n, str) and n != "*" and "." in n and n.rpartition(".")[0] not in covered
                                for n, _ in f.sets)


def _exec_index(mod: Any) -> int | None:
    """The device index a module's accelerate hook runs it on (``execution_device``: an int, ``"cuda:1"`` or a
    device), read without parsing a device (a virtual run's answers need none); None without one."""
    from torchdoctor._walk.kinds import hook_chain

    for h in hook_chain(vars(mod).get("_hf_hook")):
        dev = (getattr(h, "__dict__", None) or {}).get("execution_device")
        text = str(dev) if dev is not None else ""
        tail = text.rpartition(":")[2] if ":" in text else text
        if tail.isdigit():
            return int(tail)
    return None


def mapped_paths(root: Any) -> frozenset[str]:
    """The module paths of ``root`` a device map's hooks run on more than one device index (``dispatch_model``):
    their tensors are never moved by hand (``_placed_by_hand``), so no fix of another tensor counts on such a
    move; empty for anything else."""
    from torchdoctor._walk import walk

    try:
        mapped = {m: _exec_index(mod) for m, mod, _ in walk(root).hooks if _exec_index(mod) is not None}
    except Exception:  # a strange model: nothing is known to be placed by hooks
        return frozenset()
    return frozenset(mapped) if len(set(mapped.values())) > 1 else frozenset()


def _elsewhere(name: str, target: torch.device, placed: dict[str, int | None]) -> bool:
    """The tensor ``name`` is under a module a hook runs on another device index than ``target``'s."""
    hits = [(m, i) for m, i in placed.items() if i is not None and (not m or name.startswith(m + "."))]
    if not hits:
        return False
    _, index = max(hits, key=lambda x: len(x[0]))  # the innermost hook decides where the layer runs
    return index != (target.index or 0)


def _placed_by_hand(fixes: list[Fix], hooked: list[tuple[str, Any]], why: str) -> tuple[list[Fix], Fix] | None:
    """The fixes that move a tensor of a module the hooks place (``model.lm_head.weight.data = ….to('cuda:0')`` under
    a device map whose hook runs ``lm_head`` on cuda:1), and the note said in their place; None when there are none.
    The hook moves the module's inputs to its own device on every call: a hand move splits the layer from them."""
    if why == "Module.to" or not hooked:
        return None
    placed = {m: _exec_index(mod) for m, mod in hooked}
    hits = [f for f in fixes if f.kind == "path" and ".data = " in f.code and f.sets and all(
        n != "*" and isinstance(t, torch.device) and _elsewhere(n, t, placed) for n, t in f.sets)]
    if not hits:
        return None
    names = list(dict.fromkeys(n for f in hits for n, _ in f.sets))
    shown = ", ".join(names[:3]) + (" …" if len(names) > 3 else "")
    return hits, Fix(f"# {shown}: placed by accelerate's hooks ({why.split(':', 1)[0]}), which move each layer's "
                     "inputs to its own device on every call; never moved by hand (the layer would meet its inputs "
                     "elsewhere): move what the program hands it to its device where the program does", "note")


def under_hooks(items: list[Fix], root: Any, device: torch.device, paths: Any = (), cases: Any = ()) -> list[Fix]:
    """The fixes with ``torchdoctor.move(model, …)`` and the moves of plain attributes of hooked modules replaced by
    their registration as buffers where they are built, when hooks place the model; the others as they were.
    ``paths``: the failing ops' operands by name: a plain attribute among them is registered so too when the
    program's own ``Module.to`` moves its layer (no hook). ``cases``: the failing ops; a hand move of a device
    map's layer gives way to the operand moved where the program's line adds it to the stream (``streamfix``)."""
    from torchdoctor._virtual.bareuse import bare_use_fixes
    from torchdoctor._virtual.metaread import hook_copy_fixes

    try:  # a layer-by-layer placement of the program's own: what it never moves is fixed where it is used
        items = hook_copy_fixes(bare_use_fixes(items, root, device, cases), cases, device)
    except Exception:  # a diagnostic never breaks the report: the fixes as they were
        pass
    if not isinstance(root, torch.nn.Module) or not any(
            f.code.startswith("torchdoctor.move(") or "the tensors made on" in f.code or f.sets for f in items):
        return items
    try:
        hooked, why = _hooked(root, device)
        if not hooked:  # a device map's hooks run each layer where the map put it: no refusal for the run's device
            from torchdoctor._walk import walk

            mapped = [(m, mod) for m, mod, _ in walk(root).hooks if _exec_index(mod) is not None]
            placed = _placed_by_hand(items, mapped, "AlignDevicesHook: a device map") \
                if len({_exec_index(m) for _, m in mapped}) > 1 else None
            if placed is not None:  # only the hand moves of its layers' tensors change
                from torchdoctor._virtual.streamfix import stream_fix

                return [f for f in items if not any(f is g for g in placed[0])] + [stream_fix(cases) or placed[1]]
        if not hooked and any("the tensors made on" in f.code for f in items):  # no maker line was recorded
            hooked, why = _plain(root, paths, device), "Module.to"
    except Exception:  # a strange model: the fixes as written
        return items
    if not hooked:
        return items
    attrs: dict[tuple[type, str], list[tuple[str, Any]]] = {}
    for mpath, mod in hooked:
        for name, value in list(vars(mod).items()):
            dev = getattr(value, "_td_device", getattr(value, "device", None))
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and dev is not None \
                    and dev.type != device.type and (why != "Module.to" or f"{mpath}.{name}" in paths):
                attrs.setdefault((type(mod), name), []).append((f"{mpath}.{name}" if mpath else name, mod))
    covered = {m for m, _ in hooked}
    # a module attached after the hooks (``model.adapter = nn.Linear(...)`` after ``cpu_offload``) has none: its
    # tensors are moved as any module's, the hooks never onload them
    out = [f for f in items if not (f.code.startswith("torchdoctor.move(") and not _unhooked(f, covered) or
                                    f.code.startswith("# lasting fix:"))]
    placed = _placed_by_hand(out, hooked, why)
    if placed is not None:  # a part of a model the hooks place (a device map's layer): never moved by hand
        out = [f for f in out if not any(f is g for g in placed[0])]
    for (cls, name), held in attrs.items():
        paths = [p for p, _ in held]
        out = [f for f in out if not ("the tensors made on" in f.code or (f.sets and all(
            n in paths for n, _ in f.sets)))]
        built = _built_at(held[0][1], name)
        from torchdoctor._report.diff import line_patch

        diff = line_patch(built[0], built[1], built[2]) if built is not None else None
        where = f" at {built[0].rsplit('/', 1)[-1]}:{built[1]}" if built is not None else " in its __init__"
        shown = ", ".join(paths[:3]) + (" …" if len(paths) > 3 else "")
        are = "is a plain attribute" if len(paths) == 1 else "are plain attributes"
        moves = f" set{where}: Module.to moves" if why == "Module.to" else \
            f": the hooks that place the model ({why.split(':', 1)[0]}) onload"
        out.insert(0, Fix(f"# {shown} {are} of {cls.__name__}{moves} parameters and buffers only; register it as a "
                          "buffer"
                          f"{where}: self.register_buffer({name!r}, ..., persistent=False)", "note", device,
                          sets=tuple((p, device) for p in paths), diff=diff, rebuffer=tuple(paths)))
    if placed is not None:
        out.append(placed[1])
    elif not attrs and len(out) < len(items) and why != "Module.to":
        out.append(Fix(f"# the model is placed by accelerate or diffusers hooks ({why.split(':', 1)[0]}), which "
                       f"torchdoctor.move refuses: keep the hooks and give them {device_str(device)} as their "
                       "execution/onload device", "note"))
    return out


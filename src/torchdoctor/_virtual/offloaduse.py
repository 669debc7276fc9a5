"""A model that an offloading mechanism moved away between two uses, fixed where the program uses it.

A ComfyUI-like model manager offloads every loaded model to the CPU after a prompt (``free_memory`` →
``unpatch_model``: ``self.model.to(self.offload_device)``); a node that loaded its model once and keeps it meets its
weights on the CPU at the next prompt. The line that moved them is the manager's: moving the model back after it
would undo every offload (and names a ``model`` the manager's code does not have). The fix goes where the program
uses the model: the program's own load call put before the use (``mm.load_models_gpu([self.clip])``: the manager
knows the model is loaded again), else the model moved to its input's device at the use (``.to(ids.device)``).

accelerate's ``cpu_offload_with_hook`` (and ``enable_model_cpu_offload``) moves a sub-model to the execution device
only while its own forward runs. A layer of it called directly (``self.semantic.input_embeds_layer(ids)``) meets
its weights on the CPU; poking its ``.data`` fights the hook (the next offload moves it back, and the hook's
bookkeeping never learns). The fix gives the layer its own hook where the program puts the hooks (what transformers'
Bark does), or calls through the hooked module.

Both are proven as the move is, at the failing ops: with the used module's tensors on the device the fix brings
them to, each failing op runs again on copies of its operands (``atop``).
"""

from __future__ import annotations

import ast
import re
from typing import Any

import torch

from torchdoctor._virtual.ownline import statements_at
from torchdoctor._virtual.prove import Fix
from torchdoctor._virtual.usesite import Use, use_of

_OFFLOADING = ("CpuOffload", "UserCpuOffloadHook", "AlignDevicesHook")  # accelerate's hooks that offload weights
_IS_ON = re.compile(r"#\s*self\.([\w.]+) is on ")


def offloading_hook(hook: Any) -> str | None:
    """The offloading hook's class name in ``hook`` (a ``SequentialHook`` holds several), or None."""
    for h in [hook, *(getattr(hook, "hooks", ()) or ())]:
        name = type(h).__name__
        if name in _OFFLOADING and (name != "AlignDevicesHook" or getattr(h, "offload", False)):
            return name
    return None


def _holder(f: Fix, root: torch.nn.Module) -> str | None:
    """The path of the deepest module holding every tensor ``f`` moves ("" for the model), or None."""
    from torchdoctor._guard.maps import holding_module

    names = [n for n, _ in f.sets]
    if "*" in names:
        return ""
    path = holding_module(names)
    try:
        root.get_submodule(path)
    except AttributeError:
        return None
    return path


def _above(path: str) -> list[str]:
    """``a.b.c`` → ``["a.b.c", "a.b", "a", ""]``."""
    parts = path.split(".") if path else []
    return [".".join(parts[:i]) for i in range(len(parts), -1, -1)]


def use_fix(f: Fix, casts: Any, root: Any) -> Fix | None:
    """``f`` (a move of model tensors to one device) written where the program uses their module, when an
    offloading mechanism moved it away before that use; None otherwise (the fix stays as it was)."""
    if f.kind != "path" or not f.sets or not isinstance(root, torch.nn.Module) or \
            len({t for _, t in f.sets}) != 1 or not isinstance(f.sets[0][1], torch.device):
        return None
    target: torch.device = f.sets[0][1]
    held = _holder(f, root)
    if held is None:
        return None
    paths = {id(m): p for p, m in root.named_modules()}
    # the module the program called: the holder or a module above it, else the one module under it (a fix of the
    # whole model, ``*``) that the program called after an offload moved it away
    found = next(((p, u, a) for p in _above(held) if (u := use_of(root.get_submodule(p))) is not None
                  and (a := _away(u, casts, root.get_submodule(p), held, paths, target)) is not None), None)
    if found is None and next((p for p in _above(held) if use_of(root.get_submodule(p)) is not None), None) is None:
        below = [(p, u, a) for p, m in root.named_modules() if (p.startswith(held + ".") if held else p) and
                 (u := use_of(m)) is not None and (a := _away(u, casts, m, p, paths, target)) is not None]
        found = below[0] if len(below) == 1 else None
    if found is None:
        return None
    upath, use, away = found
    hook = next(((p, c) for p in _above(upath)[1:] if (c := offloading_hook(vars(root.get_submodule(p)).get("_hf_hook")))),
                None)
    outer = use.outer
    owner = outer.owner() if outer is not None and outer.owner is not None else None
    if hook is None and outer is not None and owner is not None and id(owner) in paths and \
            (a := _away(outer, casts, owner, held, paths, target)) is not None:  # ``vae.decode(z)`` of the
        upath, use, away = paths[id(owner)], outer, a  # program, whose ``decode`` calls ``self.dec``: fixed there
    n = use.moved_in(casts) or 0
    deep = held if held.startswith(upath + ".") or not upath else upath  # what the program moved: at or above it
    # its tensors, the module as a whole, and what the offloading line moved (views of a weight a layer reads
    # without calling its owner: ``out_proj.weight`` in ``nn.MultiheadAttention``)
    moved = (f"moved a tensor at {casts.moves[away][4]}", target)
    sets = (*f.sets, ("*" if not upath else upath + ".", target), moved)
    trail = casts.trails[away] if away < len(casts.trails) else None
    if hook is not None:
        out: Fix | None = _own_hook(use, upath, root.get_submodule(upath), hook, casts, away, target, sets)
    elif trail is None or not trail.frames or trail.frames[0][2] is use.code and not _offloads(use, casts, away):
        return None  # moved away in the function that uses it, on purpose: that line is named (``awayline``)
    elif trail.thread != use.thread:
        out = _raced(use, deep, casts, away, n, target, sets, paths)
    else:
        out = _at_use(use, deep, casts, away, n, target, sets, paths)
    if out is not None and out.diff is None:  # advice: a move at that line is not what it changes (``moveline``)
        out.sets = tuple(s for s in out.sets if s is not moved)
    return out


def _offloads(use: Use, casts: Any, away: int) -> bool:
    """The program's line that moved the model away, in the function that uses it, is an offload written out
    (``vae.to("cpu")``, ``vae.cpu()``), and the use hands it nothing moved there (``m.seg(image.to(node_device))``
    is a placement the program chose: kept)."""
    from torchdoctor._virtual.ownline import own_line

    here, used = own_line(casts.moves[away][2], casts.moves[away][3]), own_line(use.file, use.line)
    if here is None or used is None:
        return False
    calls = [n for n in ast.walk(here[2]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    offload = any(c.func.attr == "cpu" and not c.args or c.func.attr == "to" and len(c.args) == 1 and  # type: ignore
                  ast.unparse(c.args[0]) in ("'cpu'", '"cpu"', "torch.device('cpu')") for c in calls)
    handed = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("to", "cpu")
                 for n in ast.walk(used[2]))
    return offload and not handed


def _away(use: Use, casts: Any, mod: torch.nn.Module, upath: str, paths: dict[int, str],
          target: torch.device) -> int | None:
    """The index of the last module move before ``use`` of the module at ``upath`` (the deeper of the used module and
    the one holding the tensors) or a module above it, when it moved them away from ``target``'s device type (None
    when none did, or the last one brought them there)."""
    n = use.moved_in(casts)
    if n is None or offloading_hook(vars(mod).get("_hf_hook")):  # its own hook onloads it
        return None
    around = set(_above(upath))
    for i in range(min(n, len(casts.moves)) - 1, -1, -1):
        m = casts.moves[i][0]()
        if m is not None and paths.get(id(m)) in around:
            return i if casts.moves[i][1].type != target.type else None
    return None


def _raced(use: Use, upath: str, casts: Any, away: int, n: int, target: torch.device, sets: Any,
           paths: dict[int, str]) -> Fix:
    """A move made by another thread (an offloader's pending transfer) after the program's own line put the module
    on ``target``: both moves named with their threads; the fix waits for the transfer before the use."""
    import os

    from torchdoctor._placement import device_str

    def line(i: int) -> str:
        fr = casts.trails[i].frames
        return f"`{fr[0][2].co_name}` at {os.path.basename(fr[0][0])}:{fr[0][1]}" if fr else casts.moves[away][4]

    around = set(_above(upath))
    put = next((i for i in range(min(n, len(casts.moves)) - 1, -1, -1) if i < away and i < len(casts.trails) and
                (m := casts.moves[i][0]()) is not None and paths.get(id(m)) in around and
                casts.moves[i][1].type == target.type), None)
    before = f", after {line(put)} had put it on {device_str(target)} in the program's thread" if put is not None \
        else ""
    went = device_str(casts.moves[away][1])
    return Fix(f"# `{use.func}`: {upath or 'the model'} was moved to {went} by {line(away)} "
               f"in another thread (a transfer still pending){before}, and {use.at} uses it: wait for the pending "
               "transfers before this use (a future's .result(), a thread's .join()); moving it back inside the "
               "transfer would undo every offload", "note", target, sets=tuple(sets))


def _at_use(use: Use, upath: str, casts: Any, away: int, n: int, target: torch.device, sets: Any,
            paths: dict[int, str]) -> Fix | None:
    """The program's load call of the model (a frame of the move that brought it to ``target``, in the function
    that uses it) put before the use; else the model moved to its input's device at the use."""
    import os

    from torchdoctor._placement import device_str
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.ownline import own_line

    here = own_line(use.file, use.line)
    if here is None:
        return None
    body = here[1]
    frames = casts.trails[away].frames
    went = device_str(casts.moves[away][1])
    by = f"`{frames[0][2].co_name}` at {os.path.basename(frames[0][0])}:{frames[0][1]}"
    # the program's line that set the mechanism off: the first of its frames the use's callers share (an app's loop)
    common = next(((file, line) for file, line, code in frames[1:] if any(code is c for c in use.callers)), None)
    if common is not None:
        by += f" (called from {os.path.basename(common[0])}:{common[1]})"
    around = set(_above(upath))
    load = None
    for i in range(min(n, len(casts.moves)) - 1, -1, -1):
        m = casts.moves[i][0]()
        if m is None or paths.get(id(m)) not in around or casts.moves[i][1].type != target.type or \
                i >= len(casts.trails):
            continue
        load = next(((file, line) for file, line, code in casts.trails[i].frames if code is use.code and
                     line < use.line), None) or next(((file, line) for file, line, code in casts.trails[i].frames
                                                     if code.co_name == "<module>" and file == use.file), None)
        # (a load at the program's top level names globals, which the function that uses the model reads too)
        if load is not None:
            break
    if load is not None and any((file, line) == load for file, line, _ in frames):
        load = None  # the call that loads it also moved it away (a helper that places, then offloads): calling it
        # again before the use would offload it again
    said = (f"`{use.func}` was offloaded to {went} by {by}, and {use.at} uses it again on {device_str(target)} "
            "without loading it") if frames[0][2] is not use.code else (  # the program's own move, in that function
        f"`{use.func}` was moved to {went} at {casts.moves[away][4]}, and {use.at} uses it again on "
        f"{device_str(target)} without moving it back")
    if load is not None and (stmt := _call_stmt(*load)) is not None:
        new = f"{stmt}\n{body}"
        code = (f"{stmt}  # before {use.at}: {said}; load it before each use, as "
                f"{os.path.basename(load[0])}:{load[1]} did once" + (
                    " (moving it back inside the offload would undo it)" if frames[0][2] is not use.code else ""))
    else:
        from torchdoctor._virtual.devexpr import device_name

        to = f"{use.arg}.device" if use.arg else device_name(use.file, use.line) or repr(device_str(target))
        a, b = use.span
        new = body[:a] + f"{use.func}.to({to})" + body[b:]
        code = f"{new}  # at {use.at}: {said}; " + ("move it to the device of what it is given where it is used"
                                                     if use.arg else f"move it to {to} where it is used")
    diff = line_patch(use.file, use.line, new)
    return Fix(code, "note", target, sets=tuple(sets), diff=diff)


def _call_stmt(file: str, line: int) -> str | None:
    """The statement at the line when it is one call alone (``mm.load_models_gpu([self.clip])``), as written."""
    from torchdoctor._virtual.ownline import own_line

    here = own_line(file, line)
    if here is None or len(here[2].body) != 1 or not isinstance(here[2].body[0], ast.Expr) or \
            not isinstance(here[2].body[0].value, ast.Call):
        return None
    return ast.get_source_segment(here[1], here[2].body[0])


def _own_hook(use: Use, upath: str, layer: torch.nn.Module, hook: tuple[str, str], casts: Any, away: int,
              target: torch.device, sets: Any) -> Fix:
    """The layer given its own offload hook where the program puts the hooks (a diff when that line calls
    ``cpu_offload_with_hook`` and the layer is named there), or advice."""
    import os

    from torchdoctor._placement import device_str
    from torchdoctor._report.diff import line_patch

    parent, cls = hook
    file, line, at = casts.moves[away][2], casts.moves[away][3], casts.moves[away][4]
    trail = casts.trails[away] if away < len(casts.trails) else None
    placed = _placement(file, line)
    name = _named(trail.held if trail is not None else {}, layer, placed[3] if placed else ())
    if not parent and use.func.endswith("()"):  # a getter on the hooked model (``te.get_input_embeddings()``):
        parent = use.func[:-2].rpartition(".")[0]  # the model as the use names it, its hook put at the program's
        put = _put_line(use.file, parent)  # line that offloads it (not the line whose call moved it away)
        if put is not None:
            file, line, at = use.file, put, f"{os.path.basename(use.file)}:{put}"
            placed, name = _placement(file, line), use.func
    why = (f"`{parent}` is offloaded by accelerate's hook ({cls}, put at {at}): its weights reach "
           f"{device_str(target)} only while `{parent}(...)` runs, and {use.at} calls `{use.func}` outside it; give "
           f"that layer its own hook (or call through `{parent}`): moving its weights by hand fights the hook")
    if placed is not None and name is not None:
        fn, dev, ins, _ = placed
        stmt = f"{fn}({name}, {dev})"
        body = _line_body(file, ins)
        diff = line_patch(file, ins, f"{stmt}\n{body}") if body is not None else None
        return Fix(f"{stmt}  # before {os.path.basename(file)}:{ins}: {why}", "note", target, sets=tuple(sets),
                   diff=diff)
    # the layer as the program names it where it calls it; the hooks were put by a library call at ``at``
    # (``pipe.enable_model_cpu_offload()``): the program adds the layer's own hook after it
    return Fix(f"accelerate.cpu_offload_with_hook({use.func}, {str(target)!r})  # after {at}: {why}", "note", target,
               sets=tuple(sets))


def _put_line(file: str, model: str) -> int | None:
    """The line of ``file`` that calls ``cpu_offload_with_hook(model, ...)``, when one does."""
    from torchdoctor._virtual.devexpr import tree_of

    tree = tree_of(file)
    hits = {c.lineno for c in ast.walk(tree) if isinstance(c, ast.Call) and c.args and
            ast.unparse(c.func).rsplit(".", 1)[-1] == "cpu_offload_with_hook" and ast.unparse(c.args[0]) == model} \
        if tree is not None else set()
    return hits.pop() if len(hits) == 1 else None


def _line_body(file: str, line: int) -> str | None:
    import linecache

    raw = linecache.getline(file, line).rstrip("\r\n")
    return raw.lstrip(" \t") or None


def _named(held: dict[str, Any], layer: torch.nn.Module, loops: tuple[str, ...]) -> str | None:
    """``layer`` as the code that put the hooks names it (``self.semantic.input_embeds_layer``), from the modules
    its frame held (``self`` first, then the shortest name); a loop's own variable is not there before the loop."""
    best: tuple[bool, int, str] | None = None
    for name, ref in held.items():
        obj = ref()
        if obj is None or name in loops:
            continue
        text = name if obj is layer else next((f"{name}.{sub}" for sub, m in obj.named_modules() if m is layer and sub),
                                             None)
        if text is not None and (key := (name != "self", len(text), text)) and (best is None or key < best):
            best = key
    return best[2] if best else None


def _placement(file: str, line: int) -> tuple[str, str, int, tuple[str, ...]] | None:
    """(the hook function as the line calls it, its execution device's text, the line to insert before — the
    outermost loop around that line in its function, else the line — and that loop's variables) where the line
    calls ``cpu_offload_with_hook``; None otherwise."""
    try:
        with open(file, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    chain: list[Any] = statements_at(tree, line)
    if not chain:
        return None
    calls = [c for c in ast.walk(chain[-1]) if isinstance(c, ast.Call) and c.lineno == line and
             ast.unparse(c.func).rsplit(".", 1)[-1] == "cpu_offload_with_hook"]
    if len(calls) != 1:
        return None
    call = calls[0]
    dev = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords
                                                        if k.arg == "execution_device"), None)
    if dev is None:
        return None
    funcs = [i for i, s in enumerate(chain) if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
    body = chain[funcs[-1] + 1:] if funcs else chain
    loop = next((s for s in body if isinstance(s, (ast.For, ast.AsyncFor, ast.While))), None)
    names = tuple(n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)) if isinstance(
        loop, (ast.For, ast.AsyncFor)) else ()
    return ast.unparse(call.func), ast.unparse(dev), (loop or body[-1]).lineno, names


def drop_covered(fixes: list[Fix], mine: list[Fix], root: Any) -> list[Fix]:
    """The fixes without those a use-site fix covers (another move of the same module's tensors, a note about
    ``self.<a tensor of it>``), their names joined to the use-site fix's, so it is proven at their ops too."""
    if not mine or not isinstance(root, torch.nn.Module):
        return fixes
    out: list[Fix] = []
    for f in fixes:
        if any(f is m for m in mine):
            out.append(f)
            continue
        owner = next((m for m in mine if _covers(m, f, root)), None)
        if owner is None:
            out.append(f)
        else:
            owner.sets = (*owner.sets, *(s for s in f.sets if s not in owner.sets))
    return out


def _covers(m: Fix, f: Fix, root: torch.nn.Module) -> bool:
    prefix = next((n for n, _ in m.sets if n == "*" or n.endswith(".")), None)
    if prefix is None or not f.sets or {t for _, t in f.sets} != {m.target}:
        return False
    under = (lambda n: True) if prefix == "*" else (lambda n: n.startswith(prefix))  # noqa: E731
    if f.kind == "path" and all(n != "*" and under(n) for n, _ in f.sets):
        return True
    hit = _IS_ON.search(f.code)  # ``self.enc.out_proj.bias is on cpu``: a tensor the running module reads
    if f.kind == "note" and hit is not None and all(n == "self." for n, _ in f.sets):
        sub = root if prefix == "*" else root.get_submodule(prefix[:-1])
        return any(k == hit.group(1) or k.endswith("." + hit.group(1)) for k in sub.state_dict(keep_vars=True))
    return False


__all__ = ["drop_covered", "use_fix"]

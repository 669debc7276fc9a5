"""A weight that accelerate's offload keeps on meta, read outside its module's own forward.

Under sequential offload (``accelerate.cpu_offload``, diffusers' ``enable_sequential_cpu_offload``, a
``device_map`` with ``"cpu"`` or ``"disk"`` entries) a module's parameters stay on ``meta``: the real values live in
the hook's ``weights_map`` (``module._hf_hook``) and are loaded onto the execution device only while that module's
own forward runs. A parent's forward that reads a child's parameter itself (``self.gate.alpha.item()``,
``x @ self.embed.weight.t()``) meets the meta tensor: "Tensor.item() cannot be called on meta tensors", "Cannot copy
out of meta tensor", "... found at least two devices, cuda:0 and meta". The message alone reads like a model built
on meta and never loaded (explain's ``to_empty`` + ``load_state_dict``), which would undo the offload. The failing
line's frame knows better: its names are resolved through the frame's variables and the modules' own tables (as
``evidence.stored_operand`` does, never ``eval``), and a meta tensor under a module whose hook offloads is named with
that module; the fix reads it inside that module's forward, or reads the hook's own copy on that line. The copy is
checked on the live objects (it holds the tensor's shape and dtype, with data); the line is not re-run.
"""

from __future__ import annotations

import linecache
import re
from typing import Any

from torchdoctor._run.evidence import _NAME, _PREFIXES, _member

# a read that takes the value off the tensor (no device meets another): the hook's CPU copy serves as it is
_VALUE_READS = (".item(", ".tolist(", ".numpy(", ".shape", ".size(", ".dtype", ".numel(")


def _offload_hook(module: Any) -> tuple[str, Any] | None:
    """(the expression under ``module`` that reaches its offloading hook, the hook): ``_hf_hook`` itself, or the
    offloading one among a ``SequentialHook``'s (``cpu_offload`` appends one to the hook it adds first)."""
    hook = vars(module).get("_hf_hook")
    if hook is None:
        return None
    if getattr(hook, "offload", False) and getattr(hook, "weights_map", None) is not None:
        return "_hf_hook", hook
    for i, inner in enumerate(getattr(hook, "hooks", ()) or ()):
        if getattr(inner, "offload", False) and getattr(inner, "weights_map", None) is not None:
            return f"_hf_hook.hooks[{i}]", inner
    return None


def _copy(hook: Any, key: str) -> Any:
    """The hook's own copy of ``key`` (a CPU tensor, or one read from the offload folder), None when it has none."""
    try:
        return hook.weights_map[key]
    except Exception:  # noqa: BLE001 - a map without that key, or one that cannot be read here
        return None


def offloaded_read(exc: BaseException) -> tuple[str, str, str | None] | None:
    """(culprit lines, fix, the fix's line as a diff of the program's file) when the program's line that raised
    ``exc`` reads a meta tensor that an accelerate offload hook of a module on that name keeps off the module; None
    otherwise."""
    tb, found = exc.__traceback__, None
    while tb is not None:  # the innermost frame of the program's own code (not torch's, a library's, ours)
        name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if not (name.startswith("<") or "/site-packages/" in name or "/dist-packages/" in name
                or "/torch/" in name or name.startswith(_PREFIXES)):
            found = tb
        tb = tb.tb_next
    # the traceback's line: a frame that caught the error and goes on is at another line by now
    return None if found is None else offloaded_at(found.tb_frame, found.tb_lineno)


def offloaded_at(frame: Any, lineno: int | None = None) -> tuple[str, str, str | None] | None:
    """``offloaded_read`` for the program's frame running the line (a recorder that meets the meta tensor there
    while the frame is alive: ``lineno`` is then the frame's own)."""
    import torch

    from torchdoctor._placement import compact

    lineno = frame.f_lineno if lineno is None else lineno
    source = linecache.getline(frame.f_code.co_filename, lineno).rstrip("\r\n")
    if not source.strip():
        return None
    scope = {**frame.f_globals, **frame.f_locals}
    for match in _NAME.finditer(source):
        parts = [p.strip() for p in match.group(1).split(".")]
        if parts[0] not in scope:
            continue
        chain = [(parts[0], scope[parts[0]])]
        for part in parts[1:]:
            try:
                chain.append((f"{chain[-1][0]}.{part}", _member(chain[-1][1], part)))
            except AttributeError:
                break
        path, tensor = chain[-1]
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "meta" or len(chain) < 2:
            continue
        # the nearest module on the name whose hook offloads (it holds the tensor itself, or places its submodules)
        for at in range(len(chain) - 2, -1, -1):
            name, module = chain[at]
            found = _offload_hook(module) if isinstance(module, torch.nn.Module) else None
            if found is None:
                continue
            key = path[len(name) + 1:]
            copy = _copy(found[1], key)
            if not isinstance(copy, torch.Tensor) or copy.device.type == "meta" \
                    or copy.shape != tensor.shape or copy.dtype != tensor.dtype:
                continue
            return _said(source, lineno, frame.f_code.co_filename, match, path, tensor, name, module, key,
                         found, copy, compact)
    return None


def _said(source: str, lineno: int, filename: str, match: Any, path: str, tensor: Any, name: str, module: Any,
          key: str, found: tuple[str, Any], copy: Any, compact: Any) -> tuple[str, str, str | None]:
    from torchdoctor._placement import tensor_device
    from torchdoctor._report.diff import line_patch

    file = filename.replace("\\", "/").rsplit("/", 1)[-1]
    cls = type(module).__name__
    hook_expr, hook = found
    held = f"{name}.{hook_expr}.weights_map[{key!r}]"
    # the name ends where the path does (``s.gate.alpha`` of ``s.gate.alpha.item()``)
    end = match.start(1) + list(re.finditer(r"[A-Za-z_]\w*", match.group(1)))[path.count(".")].end()
    moved = tensor.dim() == 0 or source[end:].lstrip().startswith(_VALUE_READS)
    device = getattr(hook, "execution_device", None)
    new = held if moved or device is None else f"{held}.to({name}.{hook_expr}.execution_device)"
    line = source[:match.start(1)] + new + source[end:]
    culprit = (f"culprit `{path}` {compact(tensor.dtype, tuple(tensor.shape), 'meta')}: offloaded by accelerate's "
               f"hook on `{name}` ({cls}), which keeps its weights in the hook's map and loads them only while "
               f"`{name}(...)` runs; {file}:{lineno} reads it outside that call\n"
               f"line: {source.strip()}")
    form = compact(copy.dtype, tuple(copy.shape), str(tensor_device(copy)))
    inside = "" if type(module).__module__.startswith("torch.") else f" (in {cls}.forward)"
    fix = [f"# `{path}` has its values only while `{name}(...)` runs: read it there{inside}, or, on this line, the "
           f"hook's own copy ({form}){'' if moved or device is None else ', moved to the execution device'}:",
           line.strip(),
           f"# ^ unproven (the line was not re-run); checked on the live objects: `{held}` holds the values "
           f"`{path}` stands for ({form})",
           "# not to_empty()/load_state_dict(): the module is on meta by design (the offload), not unloaded"]
    return culprit, "\n".join(fix), line_patch(filename, lineno, line)

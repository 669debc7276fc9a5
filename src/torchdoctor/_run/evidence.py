"""What the failing line itself held, when guard named no culprit with a fix: a quantized layer's storage read directly.

A program that reads ``lm_head.weight`` of a bitsandbytes ``Linear8bitLt`` (int8), a float8 or a packed (uint8) weight
and multiplies it with its activations (``torch.matmul(hidden, lm_head.weight.t())``) fails with a dtype error whose
message alone reads like any other dtype mismatch; explain's catalogue then answers with a loading recipe. The run
has better evidence: the frame of the user's line that raised holds the objects. Their names on that line are
resolved through the frame's variables and the modules' own tables (``_parameters``, ``_buffers``, ``_modules``,
``__dict__``) -- never ``eval``, never a property or ``__getattr__`` of the program's own -- and an integer, float8 or
packed tensor a module holds is named with its layer, and the fix is aimed there: call the layer, which dequantizes
its storage per call, or dequantize before the line. Nothing is run: the fix is said unproven, with why.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import types
from typing import Any

_NAME = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*)")
# the interpreter's own library, and torchdoctor's own package folder
_PREFIXES = tuple({*(os.path.join(p, "lib").replace("\\", "/") + "/" for p in {sys.prefix, sys.base_prefix}),
                   os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace("\\", "/") + "/"})
_STORED = ("int8", "uint8", "int4", "float8")  # dtype names of storage no compute op takes with float activations


def _line_frame(exc: BaseException) -> types.FrameType | None:
    """The innermost frame of the program's own code in the traceback (not torch's, a library's or torchdoctor's)."""
    tb, found = exc.__traceback__, None
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if not (name.startswith("<") or "/site-packages/" in name or "/dist-packages/" in name
                or "/torch/" in name or name.startswith(_PREFIXES)):
            found = tb
        tb = tb.tb_next
    return None if found is None else found.tb_frame


def _member(obj: Any, name: str) -> Any:
    """``obj.name`` read from tables only (a Module's parameters, buffers, submodules, then its ``__dict__``)."""
    import torch

    if isinstance(obj, torch.nn.Module):
        for table in ("_parameters", "_buffers", "_modules"):
            got = vars(obj).get(table, {})
            if name in got:
                return got[name]
    try:
        return vars(obj)[name]
    except (TypeError, KeyError):
        raise AttributeError(name) from None


def _stored(t: Any) -> str | None:
    """``int8`` / ``float8_e4m3fn`` / ``uint8`` when ``t`` is storage a float compute op refuses, else None."""
    import torch

    if not isinstance(t, torch.Tensor) or t.is_floating_point() and "float8" not in str(t.dtype) \
            or t.dtype == torch.bool or t.is_complex():
        return None
    name = str(t.dtype).removeprefix("torch.")
    return name if name.startswith(_STORED) else None


def stored_operand(exc: BaseException) -> tuple[str, str] | None:
    """(culprit lines, fix) when the user's line that raised ``exc`` reads a layer's integer, float8 or packed storage
    directly; None otherwise (nothing of the kind on that line, or no frame of the program's own)."""
    import torch

    from torchdoctor._placement import compact, tensor_device

    frame = _line_frame(exc)
    if frame is None:
        return None
    lineno = frame.f_lineno
    source = linecache.getline(frame.f_code.co_filename, lineno).strip()
    if not source:
        return None
    scope = {**frame.f_globals, **frame.f_locals}
    for match in _NAME.finditer(source):
        parts = [p.strip() for p in match.group(1).split(".")]
        if parts[0] not in scope:
            continue
        holder, obj, path = None, scope[parts[0]], parts[0]
        for part in parts[1:]:
            try:
                nxt = _member(obj, part)
            except AttributeError:
                break
            holder, obj, path = obj, nxt, f"{path}.{part}"
        kind = _stored(obj)
        if kind is None or not isinstance(holder, torch.nn.Module):
            continue
        layer = path.rsplit(".", 1)[0]
        cls = type(holder)
        what = _class_name(cls)
        form = compact(obj.dtype, tuple(obj.shape), tensor_device(obj))
        file = frame.f_code.co_filename.replace("\\", "/").rsplit("/", 1)[-1]
        culprit = (f"culprit `{path}` {form}: the {kind} storage of `{layer}` ({what}), read directly at "
                   f"{file}:{lineno}; the layer's own forward dequantizes it on each call\n"
                   f"line: {source}")
        call = _layer_call(source, layer, path, holder)
        fix = [f"# `{path}` is {kind} storage: compute through the layer (its forward dequantizes), not with the "
               "storage itself; never cast the activations to " + kind]
        if call is not None:
            fix.append(call)
        else:
            fix.append(f"# call `{layer}(...)` where this line multiplies by `{path}`, or dequantize it to the "
                       "activations' dtype before this line")
        fix.append("# ^ fix unproven: named from the objects the failing line held, not re-run")
        return culprit, "\n".join(fix)
    return None


def _class_name(cls: type) -> str:
    """``bitsandbytes Linear8bitLt`` for an installed library's class; the program's own and torch's by name."""
    top = cls.__module__.split(".")[0]
    file = str(getattr(sys.modules.get(top), "__file__", "") or "").replace("\\", "/")
    library = top != "torch" and ("/site-packages/" in file or "/dist-packages/" in file)
    return f"{top} {cls.__name__}" if library else cls.__name__


def _layer_call(source: str, layer: str, path: str, holder: Any) -> str | None:
    """The line with ``torch.matmul(x, L.weight.t())`` / ``x @ L.weight.t()`` / ``F.linear(x, L.weight)`` written as
    ``L(x)``, when the layer has no bias (its call would add one the line does not)."""
    if getattr(holder, "bias", None) is not None:
        return None
    w = re.escape(path)
    for pattern in (rf"(?:torch\.)?matmul\(\s*([^,()]+?)\s*,\s*{w}\.t\(\)\s*\)",
                    rf"([A-Za-z_][\w.]*)\s*@\s*{w}\.t\(\)", rf"(?:F|torch\.nn\.functional)\.linear\(\s*([^,()]+?)\s*,\s*{w}\s*\)"):
        m = re.search(pattern, source)
        if m:
            return source[:m.start()] + f"{layer}({m.group(1)})" + source[m.end():]
    return None


def aimed_fix(culprit: str | None, exc: BaseException | None, catalogue: str | None
              ) -> tuple[str | None, str | None, str]:
    """(culprit, fix, where the fix came from) for one error the program met: guard's fix aimed at the culprit it
    named (``guard``), else the storage the failing line read (``run``), else explain's catalogue fix, which speaks
    of a tensor ``t``, by the user's name where known (``explain``)."""
    fix = culprit_fix(culprit)
    if fix is not None:
        return culprit, fix, "guard"
    own = stored_operand(exc) if exc is not None else None
    if own is not None:
        lines = own[0] if not culprit else own[0].split("\nline: ", 1)[0]  # guard's text quotes the line already
        return (lines if not culprit else f"{lines}\n{culprit}"), own[1], "run"
    return culprit, (named_fix(catalogue, culprit) if catalogue else None), "explain"


def culprit_fix(culprit: str | None) -> str | None:
    """The code lines under guard's ``Fix:`` (the fix aimed at the culprit it named), None without one."""
    if not culprit or "\nFix:" not in culprit:
        return None
    lines = []
    for line in culprit.split("\nFix:", 1)[1].splitlines()[1:]:
        if line and not line.startswith(" "):
            break
        if line.strip():
            lines.append(line[4:] if line.startswith("    ") else line.strip())  # a loop's body keeps its indent
    return "\n".join(lines) or None


def culprit_patch(culprit: str | None) -> str | None:
    """The unified diff under guard's ``Patch (git apply):`` (its fix as a change of the user's file), None without."""
    if not culprit or "\nPatch (git apply):" not in culprit:
        return None
    lines = []
    for line in culprit.split("\nPatch (git apply):", 1)[1].splitlines()[1:]:
        if not line.startswith("    "):
            break
        lines.append(line[4:])
    return "\n".join(lines) + "\n" if lines else None


def named_fix(fix: str, culprit: str | None) -> str:
    """Explain's fix, which speaks of a tensor ``t``, by the name the failing line gives it: guard's culprit lists
    the one tensor that line holds (``images: bf16[1,2,2,3]@cuda:0``) under ``line: ...`` (the user's code)."""
    if not culprit or not re.search(r"\bt\b", fix):
        return fix
    line = next((x.strip()[6:] for x in culprit.splitlines() if x.strip().startswith("line: ")), "")
    names = {m.group(1) for m in re.finditer(r"(?m)^\s*([A-Za-z_]\w*): [a-z]+\d*[a-z0-9]*\[", culprit)}
    names = {n for n in names if n != "t" and re.search(rf"\b{n}\b", line)}
    return re.sub(r"\bt\b", names.pop(), fix) if len(names) == 1 else fix


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # torchdoctor's own frames


def frame_names(exc: BaseException, root: str) -> dict[str, Any]:
    """The modules the program's own frames of ``exc``'s traceback held by name, innermost first (a node's
    ``net = Head()...; net(x)`` inside ``run_node``): what guard's ``model.<path>`` fix is written against when the
    error is met, while those frames are alive (nothing of them is kept)."""
    import torch

    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    top = os.path.abspath(root) + os.sep
    out: dict[str, Any] = {}
    for frame in reversed(frames):
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(top) or name.startswith(_PACKAGE) or os.sep + "site-packages" + os.sep in name:
            continue
        for key, value in frame.f_locals.items():  # a method's `self` is no name the program's line can use
            if isinstance(value, torch.nn.Module) and key not in ("self", "cls") and not key.startswith("_"):
                out.setdefault(key, value)
    return out


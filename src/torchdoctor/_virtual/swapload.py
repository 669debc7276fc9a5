"""An optimizer state loaded while its parameter's block sat on the cpu (a block swap, an offload between steps),
met at a step that runs with the block back on the device.

``Optimizer.load_state_dict`` puts each state tensor on its parameter's device *at the time of the load*; a trainer
that swaps blocks out to the cpu between steps and resumes with the swapped blocks out (SimpleTuner's resume with
block swap on) gets a cpu ``exp_avg`` beside a parameter the next step brings back to the GPU: the step raises
there. The finding names the state as the program holds it (``opt.state[blocks[2].weight]['exp_avg']``), the load's
line, the program's move that had put the block on the cpu by then and the one that brought it back; the fix is the
load with the blocks on the device, or the state moved after they come back — never a move of the blocks, which the
swapping moves again at every step. Read from the runtime's record of the load (``takenback.TakenBack.by_load``) and
the program's module moves (``modcast``), when the step's check finds the state on another device.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from typing import Any

import torch

_SKIP = ("site-packages", "dist-packages", "/torch/", "/torchdoctor/", "<frozen")


def loaded_away(back: Any, param: torch.Tensor, key: str, held: str, to: str, step: str) -> tuple[str, str] | None:
    """(message, fix) for the state ``key`` of ``param`` that ``back`` (its ``TakenBack``, made by the optimizer's
    ``load_state_dict``) put on the cpu while ``param``'s module sat there; None when no module move of the program
    put it there before the load."""
    if not getattr(back, "by_load", False) or not back.before:
        return None
    ref, n = back.before[0]
    casts = ref()
    if casts is None:
        return None
    here = "cpu"
    away = _last_move(casts, param, range(min(n, len(casts.moves)) - 1, -1, -1), here)
    if away is None:
        return None
    came = _last_move(casts, param, range(len(casts.moves) - 1, n - 1, -1), to.split(":")[0])
    owner = _module_name(casts.moves[away][0](), param)
    name = _program_name(param) or (f"{owner}.weight" if owner else "its parameter")
    state = f"{held}.state[{_py(name)}][{key!r}]"
    from torchdoctor._virtual.origin import LINES

    load = LINES.get(back.at)  # each move said at the line of the function that loads, or that steps
    stepping = _own_frame()
    by = _said(casts, away, lambda code: load is not None and _holds(code, *load))
    came_by = _said(casts, came, lambda code: stepping is not None and code is stepping.f_code) \
        if came is not None else ""
    back_by = f", and {came_by} brought it back" if came is not None else ""
    message = (f"optimizer state on {here} ({state}) while its parameter is on {to} when {held}.step(){step} runs: the "
               f"step raises on real hardware. {held}.load_state_dict at {back.at} put it on the {here}, where its "
               f"parameter was then: {by} had moved `{owner}` there{back_by} (torch's load_state_dict puts each "
               "state tensor on its parameter's device at the time of the load)")
    fix = (f"# load {held}'s state while its parameters are on {to}: bring the swapped blocks back before "
           f"{held}.load_state_dict at {back.at} and swap them out after it"
           + (f", or move each state tensor to its parameter's device after {came_by} brings them back"
              if came is not None else ", or move each state tensor to its parameter's device after they come back")
           + f", before {held}.step(); moving the blocks themselves would undo the swap")
    return message, fix


def _last_move(casts: Any, param: torch.Tensor, indices: range, kind: str) -> int | None:
    """Of ``indices`` (newest first), the first move to a device of ``kind`` of a module holding ``param``."""
    for i in indices:
        m = casts.moves[i][0]()
        if m is not None and casts.moves[i][1].type == kind and any(p is param for p in m.parameters()):
            return i
    return None


def _said(casts: Any, i: int, level: Any) -> str:
    """```swap.prepare()` at app.py:44 (in `BlockSwap.prepare` at app.py:12)``: the program's call that moved the
    module, at the level of the function ``level`` accepts (the one that loads, or steps), else where it moved."""
    frames = casts.trails[i].frames if i < len(casts.trails) else []
    if not frames:
        return f"the move at {casts.moves[i][4]}"
    at = next((k for k, (_, _, code) in enumerate(frames) if level(code)), 0)
    file, line, code = frames[at]
    text = _code(linecache.getline(file, line))
    said = f"`{text}` at {_short(file, line)}" if text and len(text) <= 80 else f"the line {_short(file, line)}"
    if at > 0:
        inner = frames[0]
        said += f" (in `{getattr(inner[2], 'co_qualname', inner[2].co_name)}` at {_short(inner[0], inner[1])})"
    return said


def _holds(code: Any, file: str, line: int) -> bool:
    """``code`` is the function (or module body) whose lines hold ``file:line``."""
    return code.co_filename == file and any(n == line for _, _, n in code.co_lines())


def _own_frame() -> Any:
    """The first frame of the program's own code on the stack (the one that called the optimizer's step)."""
    f: Any = sys._getframe(2)
    while f is not None and any(s in f.f_code.co_filename for s in _SKIP):
        f = f.f_back
    return f


def _code(raw: str) -> str:
    """A source line without its comment (``blocks[1].to("cpu")  # swapped out`` -> ``blocks[1].to("cpu")``)."""
    import io
    import tokenize

    try:
        for tok in tokenize.generate_tokens(io.StringIO(raw.strip() + "\n").readline):
            if tok.type == tokenize.COMMENT:
                return raw.strip()[:tok.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):  # a line that does not tokenize alone: as it is
        pass
    return raw.strip()


def _short(file: str, line: int) -> str:
    """``file:line`` as the run's reports write it (relative to the working directory, else the last two parts)."""
    cwd = os.getcwd() + os.sep
    return f"{file[len(cwd):] if file.startswith(cwd) else os.sep.join(file.split(os.sep)[-2:])}:{line}"


def _module_name(mod: Any, param: torch.Tensor) -> str:
    """The module holding ``param`` as the program holds it (``blocks.2``), else its class."""
    name = _program_name(param)
    if name is not None and "." in name:
        return name.rpartition(".")[0]
    return type(mod).__name__ if mod is not None else "its module"


def _program_name(param: torch.Tensor) -> str | None:
    """``blocks.2.weight``: ``param`` in the biggest module the program's own frames hold by name."""
    best: tuple[int, str] | None = None
    f: Any = sys._getframe(1)
    while f is not None:
        if not any(s in f.f_code.co_filename for s in _SKIP):
            for var, obj in list(f.f_locals.items()):
                if isinstance(obj, torch.nn.Module) and not var.startswith("_"):
                    named = dict((id(p), n) for n, p in obj.named_parameters(remove_duplicate=False))
                    if id(param) in named and (best is None or len(named) > best[0]):
                        best = (len(named), f"{var}.{named[id(param)]}")
        f = f.f_back
    return best[1] if best is not None else None


def _py(path: str) -> str:
    """``blocks.2.weight`` -> ``blocks[2].weight``, as Python reads a ``ModuleList`` index."""
    return re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", path)

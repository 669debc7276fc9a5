"""A checkpoint saved on a GPU the machine lacks, loaded without ``map_location``: the fix at the program's own
``torch.load`` line, with a patch.

torch raises "Attempting to deserialize object on CUDA device 3 but torch.cuda.device_count() is 1" inside
``torch.load`` when the file's storages name a device index the machine does not have (a checkpoint saved on a
training box's ``cuda:3``). The program asks for no such device: the file does. The fix maps the storages at the
load: ``torch.load(path, map_location="cpu")`` (the caller's ``.to`` / ``load_state_dict`` then places them), on the
line of the program that called it; a ``map_location=`` already there has its value replaced.
"""

from __future__ import annotations

import ast
import linecache
from typing import Any

WHERE = "cpu"  # the storages land on the cpu: load_state_dict copies them onto each parameter's own device


def load_fix(exc: BaseException) -> tuple[str, str | None] | None:
    """(the fix's text, its diff) for ``exc`` raised inside ``torch.load`` called from a line of the program."""
    import os

    from torchdoctor._guard.ownfile import own_file

    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # torchdoctor's own frames: never
    tb = exc.__traceback__
    at = None
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if own_file(name) and not os.path.abspath(name).startswith(ours):
            at = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    if at is None:
        return None
    raw = linecache.getline(*at).rstrip("\r\n")
    new = _mapped(raw)
    if new is None:
        return None
    from torchdoctor._report.diff import line_patch

    if isinstance(getattr(exc, "td_mapped", None), tuple):  # a virtual run's torch.load tried the fix already
        from torchdoctor._virtual.loading import mapped_note

        said = mapped_note(exc)
    else:
        said = f"({_proof(exc)})"
    note = f"  # the file's storages name a device this machine lacks: map them to {WHERE} at the load {said}"
    return new.strip() + note, line_patch(at[0], at[1], new)


_PROVE_BELOW = 1 << 28  # bytes: a bigger file is not read a second time to prove the fix


def _proof(exc: BaseException) -> str:
    """The patched load run again on the same file (a load reads it and changes nothing), where no virtual run's
    load tried it (a program run on this machine's own devices): "proven" when it loads, else "unproven" with why.
    Only a file named by its path and smaller than ``_PROVE_BELOW`` is read again (an open file object has been read
    already)."""
    import os

    tb, frame = exc.__traceback__, None
    while tb is not None:  # torch.load's own frame: the file it was given and how it was asked to load
        code = tb.tb_frame.f_code
        if code.co_name == "load" and code.co_filename.replace("\\", "/").endswith("torch/serialization.py"):
            frame = tb.tb_frame
        tb = tb.tb_next
    f = frame.f_locals.get("f") if frame is not None else None
    if frame is None or not isinstance(f, (str, os.PathLike)) or not os.path.isfile(f):
        return "unproven: the patched load was not re-run (torch.load was given no file path)"
    size = os.path.getsize(f)
    if size >= _PROVE_BELOW:
        return f"unproven: the file is {size / 2**30:.1f} GiB, not read a second time to re-run the patched load"
    import torch

    try:
        torch.load(f, map_location=WHERE, weights_only=frame.f_locals.get("weights_only"))
    except Exception as e:  # the patched load fails too: said, never offered as proven
        return f"unproven: the patched load raised {type(e).__name__}: {str(e).strip()[:120]}"
    return f"proven: the patched load read the same file onto the {WHERE}"


def _mapped(raw: str) -> str | None:
    """``raw`` (one line of source) with its ``torch.load(...)`` call given ``map_location="cpu"``; None when the
    line holds no such call on one line."""
    body = raw.lstrip(" \t")
    indent = raw[:len(raw) - len(body)]
    if not body.isascii():  # ast's offsets count bytes
        return None
    try:
        tree = ast.parse(body)
    except SyntaxError:
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_load(n.func)]
    if len(calls) != 1 or calls[0].end_lineno != 1:
        return None
    call = calls[0]
    close = call.end_col_offset
    if close is None:
        return None
    kw = next((k for k in call.keywords if k.arg == "map_location"), None)
    if kw is not None:
        v = kw.value
        if v.end_col_offset is None or v.lineno != 1:
            return None
        return indent + body[:v.col_offset] + repr(WHERE).replace("'", '"') + body[v.end_col_offset:]
    if any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args) or \
            not call.args or len(call.args) > 1:
        return None
    end = close - 1  # the call's closing parenthesis
    head = body[:end].rstrip()
    sep = " " if head.endswith(",") else ", "
    return indent + head + sep + f'map_location="{WHERE}"' + body[end:]


def _is_load(func: Any) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "load" and isinstance(func.value, ast.Name)
            and func.value.id == "torch")


def aim_load(finding: Any, category: str, exc: BaseException | None) -> None:
    """``finding``'s fix and patch aimed at the program's ``torch.load`` line, where ``exc`` was raised from one."""
    if category != "deserialize_device" or exc is None or finding.diff:
        return
    aimed = load_fix(exc)
    if aimed is not None:
        finding.fix, finding.diff, finding.fix_from = aimed[0], aimed[1], "run"

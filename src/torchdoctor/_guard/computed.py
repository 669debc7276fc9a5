"""An operand a forward computed in the wrong dtype from several tensors (``emb = torch.cat([cos(args), sin(args)])``,
with ``args`` from a float32 timestep times float32 ``freqs``): no single cast or factory made it, and casting one
source (the timestep) leaves the others promoting it again. The fix is where the forward assigns it: that line's
result cast to the dtype the forward's own input has (``.to(hidden_states.dtype)``), proven by running the forward
again with that line's results so cast (``remedy.prove_line``), and offered as a diff of the user's file.
"""

from __future__ import annotations

import ast
import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch


def computed_aim(loose: list[torch.Tensor], target: torch.dtype, frames: Any, tb: Any, session: Any = None) -> Any:
    """An ``Aim`` at the line a running forward assigned one of ``loose`` from a torch call, proven; None when there
    is none or its proof fails."""
    from torchdoctor._guard.frames import user_frames
    from torchdoctor._guard.maker import Maker, _parsed as parsed_code
    from torchdoctor._guard.remedy import Aim, own_file, prove_line
    from torchdoctor._report.diff import line_patch

    for frame in reversed(user_frames(tb)):
        me = frame.f_locals.get("self")
        names = [n for n, v in frame.f_locals.items() if any(v is t for t in loose) and n != "self"]
        parsed = parsed_code(frame.f_code) if names and isinstance(me, torch.nn.Module) else None
        if parsed is None:
            continue
        tree, off, path, lines = parsed
        shift = len(lines[0]) - len(lines[0].lstrip()) if lines else 0
        spots = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
                 and isinstance(n.targets[0], ast.Name) and n.targets[0].id in names and isinstance(n.value, ast.Call)
                 and n.value.lineno == n.value.end_lineno and n.value.end_col_offset is not None]
        if not spots or not own_file(path):
            continue
        node = max(spots, key=lambda n: n.lineno)
        call: Any = node.value
        lineno, name = node.lineno + off, node.targets[0].id  # type: ignore[attr-defined]
        raw = lines[node.lineno - 1].rstrip("\r\n")
        end = call.end_col_offset + shift
        from torchdoctor._guard.wrapfix import dtype_expr

        expr = dtype_expr(frame, target)
        new = raw[:end] + f".to({expr})" + raw[end:]
        op = ast.unparse(call.func)
        m = Maker(op, path, lineno, raw.strip(), span=(call.col_offset + shift, end))
        with replaying(session):  # fix / warn align nothing in the re-run: it meets what torch does
            proof = prove_line(m, target, me, tuple(frames.inputs_of(me)) or _inputs(frame, tree), frames)
        if not proof.startswith("fix proven"):
            return None
        at = f"{os.path.basename(path)}:{lineno}"
        said = [f"{name} computed by `{op}` at {path}:{lineno} (`{raw.strip()}`) in {type(me).__name__}.forward, "
                f"from tensors that hold {_dtypes(frame, call, target)}: casting one source leaves the others "
                "promoting it again"]
        return Aim(said, f"{new.strip()}  # {at}", line_patch(path, lineno, new), proof, [m])
    return None


@contextlib.contextmanager
def replaying(session: Any) -> Iterator[None]:
    """The session's alignments and checks off for a proof's re-run (``Session.replaying``)."""
    was = getattr(session, "replaying", None)
    if session is not None:
        session.replaying = True
    try:
        yield
    finally:
        if session is not None:
            session.replaying = was


def _inputs(frame: Any, tree: ast.AST) -> tuple[Any, ...]:
    """The forward's arguments as its frame still holds them (passed by keyword, guard's hooks saw none), when its
    body never rebinds one; else none."""
    code = frame.f_code
    names = code.co_varnames[1:code.co_argcount]
    bound = {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
             for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    if bound & set(names) or code.co_kwonlyargcount:
        return ()
    return tuple(frame.f_locals.get(n) for n in names)


def _dtypes(frame: Any, call: ast.Call, target: torch.dtype) -> str:
    """The dtypes of the frame's tensors the call's line reads, other than ``target`` (``float32``)."""
    from torchdoctor._placement import dtype_str

    used = {n.id for n in ast.walk(call) if isinstance(n, ast.Name)}
    seen = {dtype_str(v.dtype) for n, v in frame.f_locals.items() if n in used and isinstance(v, torch.Tensor)
            and v.is_floating_point() and v.dtype != target}
    return ", ".join(sorted(seen)) or "another dtype"

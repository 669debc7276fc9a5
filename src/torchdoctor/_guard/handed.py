"""An operand one submodule hands straight to the next in another dtype by design (diffusers' ``Timesteps`` returns
float32 whatever the model's dtype, fed to a bf16 ``TimestepEmbedding``: ``s.time_embedding(s.time_proj(t))``). The
library's line is not the user's to edit; the fix is the user's forward line that hands it on, the inner call cast
there (``s.time_proj(t).to(x.dtype)``), proven by the whole forward run again on a copy with that output so cast,
and offered as a diff of the user's file."""

from __future__ import annotations

import ast
import os
from typing import Any

import torch
from torch import nn


def handed_aim(mod: Any, odd: torch.dtype, target: torch.dtype, tb: Any, session: Any, root: Any,
               paths: dict[int, str]) -> Any:
    """An ``Aim`` at the line of a running forward that calls (a module holding) ``mod`` on another submodule's
    output, that output cast to ``target``; None when there is none or the re-run does not prove it."""
    from torchdoctor._guard.component import prove_whole
    from torchdoctor._guard.frames import lineno, user_frames
    from torchdoctor._guard.maker import Maker, _parsed as parsed_code
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._guard.remedy import Aim
    from torchdoctor._guard.wrapfix import dtype_expr
    from torchdoctor._report.diff import line_patch

    if not isinstance(mod, nn.Module) or not isinstance(root, nn.Module):
        return None
    for frame in reversed(user_frames(tb)):
        code = frame.f_code
        me = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
        if not isinstance(me, nn.Module):
            continue
        parsed = parsed_code(code)
        if parsed is None or not own_file(parsed[2]):
            continue
        tree, off, path, lines = parsed
        at = lineno(frame) - off
        shift = len(lines[0]) - len(lines[0].lstrip()) if lines else 0
        for call in [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno == at == n.end_lineno]:
            outer = _sub(call.func, me, code)
            if outer is None or not call.args or not any(m is mod for m in outer.modules()):
                continue
            arg, row = _handed(call.args[0], tree, at, frame, me, code)
            inner = _sub(arg.func, me, code) if arg is not None else None
            if arg is None or inner is None or id(inner) not in paths:
                continue
            raw = lines[row - 1].rstrip("\r\n")
            col, end = arg.col_offset + shift, (arg.end_col_offset or 0) + shift
            new = raw[:end] + f".to({dtype_expr(frame, target)})" + raw[end:]
            where, line_no = paths[id(inner)], row + off

            def apply(m: nn.Module, p: str = where) -> None:
                m.get_submodule(p).register_forward_hook(lambda _m, _i, out: out.to(target))
            proof = prove_whole(session, root, apply, f"the output of `{where}` -> {str(target)[6:]}")
            if proof is None or not proof.startswith("fix proven"):
                return None
            seg = raw[col:end]
            said = [f"input 0 of `{paths.get(id(mod), type(mod).__name__)}` is what `{seg}` returns at "
                    f"{path}:{line_no} ({type(inner).__name__} gives {str(odd)[6:]}): cast "
                    "where the forward hands it on"]
            m = Maker(seg, path, line_no, raw.strip(), span=(col, end))
            return Aim(said, f"{new.strip()}  # {os.path.basename(path)}:{line_no}",
                       line_patch(path, line_no, new), proof, [m])
    return None


def _handed(arg: ast.expr, tree: ast.AST, at: int, frame: Any, me: nn.Module, code: Any
            ) -> tuple[ast.Call | None, int]:
    """The submodule call whose output ``arg`` is and the line (in the parsed source) it is on: ``arg`` itself
    (``s.lin(s.temb(t))``), or the last one-line ``e = s.temb(t)`` before line ``at`` that bound the name ``arg``
    (``e = s.temb(t)`` then ``s.lin(e)``) when nothing else rebinds it in between."""
    if isinstance(arg, ast.Call):
        return arg, at
    if not isinstance(arg, ast.Name):
        return None, at
    binds = [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For))
             and n.lineno < at and any(isinstance(t, ast.Name) and t.id == arg.id for t in _targets(n))]
    last = max(binds, key=lambda n: n.lineno, default=None)
    if not isinstance(last, ast.Assign) or len(last.targets) != 1 or not isinstance(last.value, ast.Call) \
            or last.value.lineno != last.value.end_lineno or _sub(last.value.func, me, code) is None:
        return None, at
    return last.value, last.value.lineno


def _targets(node: ast.AST) -> list[ast.expr]:
    """The names a statement binds (tuple targets opened)."""
    tops = node.targets if isinstance(node, ast.Assign) else [node.target]  # type: ignore[attr-defined]
    return [e for t in tops for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]


def _sub(node: ast.expr, me: nn.Module, code: Any) -> nn.Module | None:
    """The submodule ``self.name`` (the forward's first argument's attribute) a call's function names, or None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == code.co_varnames[0]:
        sub = getattr(me, node.attr, None)
        return sub if isinstance(sub, nn.Module) and sub is not me else None
    return None


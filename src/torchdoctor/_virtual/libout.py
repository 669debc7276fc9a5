"""The output of a library module that casts it by design (diffusers' ``Timesteps`` returns float32 whatever the
model's dtype) fixed where the program's own line takes it back and hands it on: ``emb =
self.time_embedding(self.time_proj(t))`` becomes ``self.time_embedding(self.time_proj(t).to(x.dtype))``, a diff of
the program's file; the library's line is never edited. Proven at the failing op (the module's output is what the op
met, so casting it there is casting the operand), and in ``simulate`` by a re-run in which that call at that line
gives its output so (a global forward hook, removed on exit).
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch

OUTPUT = "output of "  # an operand's tag: ``output of `time_proj` cast at models/embeddings.py:63``


def own_frame(depth: int = 2) -> tuple[str, int, str, tuple[tuple[str, Any], ...]] | None:
    """(file, line, ``file:line``, the tensor arguments of its function and their dtypes) of the innermost frame in
    the program's own files, from ``depth`` frames up; None when there is none. Asked only at a failing op."""
    from torchdoctor._virtual.moveby import is_own
    from torchdoctor._virtual.origin import MACHINERY, short_at

    f: Any = sys._getframe(depth)
    while f is not None and (f.f_code.co_filename.startswith(MACHINERY) or not is_own(f.f_code.co_filename)):
        f = f.f_back
    if f is None:
        return None
    code = f.f_code
    args = tuple((n, v.dtype) for n in code.co_varnames[:code.co_argcount]
                 if isinstance(v := f.f_locals.get(n), torch.Tensor))
    return code.co_filename, f.f_lineno, short_at(f), args


def output_fix(own: tuple[str, int, str, tuple[tuple[str, Any], ...]], leaf: str, cls: str, site_at: str,
               target: torch.dtype) -> tuple[str, str, tuple[str, int, str, torch.dtype]] | None:
    """(code, diff, what a re-run casts) of the call of the module held as ``leaf`` (``time_proj``) on the program's
    line ``own``, its output cast to ``target`` there: to the dtype of a tensor argument of that function in
    ``target`` (``x.dtype``), else to ``target`` written out. None when the line holds no single such call."""
    from torchdoctor._guard.ownfile import own_file
    from torchdoctor._placement import dtype_str
    from torchdoctor._report.diff import line_patch

    file, line, at, args = own
    raw = linecache.getline(file, line).rstrip("\r\n")
    if not raw or not raw.isascii() or not own_file(file):
        return None
    body = raw.lstrip(" \t")
    try:
        tree = ast.parse(body)
    except (SyntaxError, ValueError):
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        isinstance(n.func, ast.Attribute) and n.func.attr == leaf or isinstance(n.func, ast.Name) and n.func.id == leaf)]
    if len(calls) != 1 or calls[0].end_col_offset is None or calls[0].end_lineno != 1:
        return None
    said = ast.get_source_segment(body, calls[0]) or leaf
    like = next((n for n, d in args if d == target), None)
    to = f"{like}.dtype" if like else f"torch.{dtype_str(target)}"
    pad, end = len(raw) - len(body), calls[0].end_col_offset
    new = raw[:pad + end] + f".to({to})" + raw[pad + end:]
    diff = line_patch(file, line, new)
    if diff is None:
        return None
    return (f"# {at}: {said} returns {cls}'s output as its library made it ({site_at} casts it by design): cast it "
            f"where your line hands it on: {new.strip()}", diff, (file, line, cls, target))


@contextlib.contextmanager
def outputs_cast(fixes: Sequence[Any]) -> Iterator[None]:
    """While a re-run runs: a module of the fixed class called at a fixed line of the program gives its output cast
    as the fix writes it (``.to(x.dtype)``)."""
    from torchdoctor._virtual.origin import user_frame

    sites = {(r[0], r[1], r[2]): r[3] for f in fixes if (r := getattr(f, "reout", None)) is not None}
    if not sites:
        yield
        return

    def cast(module: Any, _args: Any, out: Any) -> Any:
        f = user_frame(2)
        want = sites.get((f.f_code.co_filename, f.f_lineno, type(module).__name__)) if f is not None else None
        return out.to(want) if want is not None and isinstance(out, torch.Tensor) else None

    handle = torch.nn.modules.module.register_module_forward_hook(cast)
    try:
        yield
    finally:
        handle.remove()


def library_line(at: str) -> bool:
    """``at`` (``file:line`` as a maker records it, a library's path from its package) is an installed library's."""
    import os
    import sys

    file = at.rsplit(":", 1)[0]
    if os.path.isfile(file):
        from torchdoctor._guard.ownfile import own_file

        return not own_file(file)
    top = file.replace("\\", "/").split("/", 1)[0]
    return "/" in file.replace("\\", "/") and top in sys.modules

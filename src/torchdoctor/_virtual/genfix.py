"""A random factory asked for a tensor on the accelerator with a CPU ``torch.Generator`` (``torch.randn(...,
generator=g, device="cuda")``): real PyTorch refuses to draw. The tensor belongs where the program asked for it, so
the fix never moves it off that device (a ``device='cpu'`` edit alone makes the next op meet a cpu tensor, whose fix
puts the device back: the two fixes undo each other). It draws on the generator's device and moves the draw after
it, as diffusers' ``randn_tensor`` does (the same numbers on every device for one seed):
``torch.randn(..., generator=g, device='cpu').to("cuda")``, a diff of the program's line.
"""

from __future__ import annotations

import ast
from typing import Any

from torchdoctor._report.model import Problem
from torchdoctor._virtual.prove import Fix


def generator_fix(p: Problem, made_from: tuple[str, ...]) -> Fix | None:
    """The draw made on the generator's device (``p.expected``) and moved to the device the program asked for
    (``p.found``) at the factory's line; None when the line cannot be rewritten (the fix below it then speaks)."""
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.origin import LINES
    from torchdoctor._virtual.ownline import own_line

    key = next((m for m in made_from if m.startswith("factory ")), None)
    if key is None:
        return None
    said, _, at = key[8:].partition(" at ")
    maker = said.split(" ", 1)[0]
    file, line = LINES.get(at, ("", 0))
    read = own_line(file, line)
    if read is None:
        return None
    raw, body, tree = read
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) in (maker, maker[6:]) and
             any(k.arg == "generator" for k in n.keywords)]
    if len(calls) != 1 or not body.isascii() or calls[0].end_col_offset is None:
        return None
    call, pad = calls[0], len(raw) - len(body)
    given = next((k.value for k in call.keywords if k.arg == "device"), None)
    to = ast.unparse(given) if given is not None else repr(p.found)
    end = pad + int(call.end_col_offset or 0)
    gen = next(k.value for k in call.keywords if k.arg == "generator")  # its device as the program names it: the
    home = f"{ast.unparse(gen)}.device" if isinstance(gen, (ast.Name, ast.Attribute)) else repr(p.expected)  # same
    if given is not None and given.end_col_offset is not None:  # line on a machine whose generator is on the cpu
        new = raw[:pad + given.col_offset] + home + raw[pad + given.end_col_offset:end] + f".to({to})" + raw[end:]
    else:
        sep = "" if raw[:end - 1].rstrip().endswith("(") else ", "
        new = raw[:end - 1] + f"{sep}device={home})" + f".to({to})" + raw[end:]
    diff = line_patch(file, line, new.strip())
    if diff is None:
        return None
    fixed = ast.unparse(ast.parse(new.strip()).body[0]) if _parses(new.strip()) else new.strip()
    return Fix(f"# {at}: {maker} draws from a generator on {p.expected}: draw on the generator's device and move "
               f"the draw to {p.found} (the same numbers for one seed on every device, as diffusers' randn_tensor "
               f"does): {fixed}", "note", tried="not re-run: a generator draws only on its own device; the draw is "
               f"made there and moved to {p.found}, where the program uses it", diff=diff)


def _parses(text: str) -> Any:
    try:
        return ast.parse(text)
    except SyntaxError:
        return None

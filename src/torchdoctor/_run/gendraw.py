"""A random generator on one device handed to a library call whose objects are on another: the fix names the
generator's line and the object the program called, by the program's own names.

diffusers' ``randn_tensor`` refuses to draw a cpu tensor from a cuda generator ("Cannot generate a cpu tensor from a
generator of type cuda."): a pipeline draws its noise on its own device (its modules'), and a program that made its
generator with ``torch.Generator("cuda")`` but never moved the pipeline meets it at the pipeline's call. The message
alone reads like any device mismatch, and explain's catalogue answers with names of its own (``latents``). The run
has the frames: the program's line that called the library (``pipe(..., generator=generator)``), the object it
called (its ``self``), the generator in the library's frames and the name the program's frame holds it by. When
every module of that object is on the device the draw asked for and the generator is on another, the fix moves the
object where the generator is, before the program's call (``pipe.to("cuda")``), naming the generator's line.

Proven on copies: the draw asked for the device the object's modules are on (so it follows them once they move), and
a fresh generator on the generator's device draws on that device (a virtual one in a virtual run); the program's
generator is never drawn from, and nothing the program holds is moved.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
from typing import Any

_REFUSED = re.compile(r"Cannot generate a (\w+) tensor from a generator of type (\w+)|"
                      r"Expected a '(\w+)' device type for generator but found '(\w+)'")

__all__ = ["aim_draw", "draw_fix"]


def aim_draw(finding: Any, exc: BaseException | None) -> None:
    """``finding``'s culprit, fix and patch aimed at the generator and the object the program called, where ``exc``
    is a generator refusing to draw for another device inside a library call of the program's line."""
    if exc is None or finding.diff or finding.fix_from == "guard":
        return
    aimed = draw_fix(exc)
    if aimed is not None:
        finding.culprit, finding.fix, finding.diff, finding.fix_from = *aimed, "run"


def draw_fix(exc: BaseException) -> tuple[str, str, str | None] | None:
    """(culprit lines, fix, diff) for ``exc`` (module doc), or None when the frames do not show that shape."""
    import torch

    from torchdoctor._guard.ownfile import own_file

    hit = _REFUSED.search(str(exc))
    if hit is None:
        return None
    drew = hit.group(1) or hit.group(3)
    gen_type = hit.group(2) or hit.group(4)
    entries = []
    tb = exc.__traceback__
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    mine = [i for i, e in enumerate(entries) if own_file(e.tb_frame.f_code.co_filename)]
    if not mine or mine[-1] == len(entries) - 1:
        return None  # raised in the program's own code: not a library call's draw
    i = mine[-1]
    own, line = entries[i].tb_frame, entries[i].tb_lineno
    gen = next((g for e in entries[i + 1:] for g in _generators(e.tb_frame.f_locals.get("generator"))
                if g.device.type == gen_type), None)
    scope = {**own.f_globals, **own.f_locals}
    # the object the program's line called: the first library frame's ``self`` that line names (a decorator's
    # wrapper, ``torch.no_grad``'s, comes between)
    called = ((n, o) for e in entries[i + 1:] if (o := e.tb_frame.f_locals.get("self")) is not None
              and (n := _called(own.f_code.co_filename, line, o, scope)) is not None)
    oname, obj = next(called, (None, None))
    if obj is None or gen is None:
        return None
    gname = next((n for n, v in scope.items() if v is gen and not n.startswith("_")), None)
    devices = _devices(obj)
    if gname is None or oname is None or len(devices) != 1 or next(iter(devices)).type != drew:
        return None
    file = own.f_code.co_filename
    short = os.path.basename(file)
    made = _bound(file, line, gname)
    target = str(gen.device)
    written = _written(file, made) if made else None  # the device as the generator's line writes it ("cuda")
    stmt = f"{oname}.to({written or repr(target)})"
    from torchdoctor._report.diff import line_patch
    from torchdoctor._virtual.ownline import own_line

    here = own_line(file, line)
    diff = line_patch(file, line, f"{stmt}\n{here[1]}") if here is not None and len(here[2].body) == 1 else None
    gmade = f", made at {short}:{made}" if made else ""
    culprit = (f"culprit `{gname}` (a torch.Generator on {target}{gmade}) handed to `{oname}` "
               f"({type(obj).__name__}), whose modules are all on {next(iter(devices))}: it draws its random "
               f"tensors on its own device, and a generator draws only on the device it was made on")
    alt = f"; or make `{gname}` on {oname}'s device" + (f" at {short}:{made}" if made else "")
    fix = (f"{stmt}  # before {short}:{line}: move `{oname}` where `{gname}` draws ({target}){alt}\n"
           f"# {_proof(gen, devices, drew)}")
    return culprit, fix, diff


def _generators(v: Any) -> list[Any]:
    import torch

    if isinstance(v, torch.Generator):
        return [v]
    if isinstance(v, (list, tuple)):
        return [g for g in v if isinstance(g, torch.Generator)]
    return []


def _devices(obj: Any) -> set[Any]:
    """The devices of every parameter and buffer of ``obj`` (a module) or of the modules it holds as attributes."""
    import torch

    from torchdoctor._placement import tensor_device

    mods = [obj] if isinstance(obj, torch.nn.Module) else \
        [v for v in getattr(obj, "__dict__", {}).values() if isinstance(v, torch.nn.Module)]
    return {tensor_device(t) for m in mods for t in (*m.parameters(), *m.buffers())}


def _called(file: str, line: int, obj: Any, scope: dict[str, Any]) -> str | None:
    """The name (a plain name or an attribute chain of instance dicts) the program's line calls ``obj`` by."""
    body = linecache.getline(file, line).strip()
    try:
        tree = ast.parse(body)
    except SyntaxError:
        return None
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            text = ast.unparse(n.func)
            parts = text.split(".")
            cur = scope.get(parts[0])
            for p in parts[1:]:
                cur = getattr(cur, "__dict__", {}).get(p) if cur is not None else None
            if cur is obj and all(p.isidentifier() for p in parts):
                return text
    return None


def _bound(file: str, line: int, name: str) -> int | None:
    """The last line before ``line`` in its function (or module) that binds ``name``."""
    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
        return None
    scope: Any = min((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and
                      n.lineno <= line <= (n.end_lineno or n.lineno)),
                     key=lambda n: (n.end_lineno or n.lineno) - n.lineno, default=tree)
    hits = [n.lineno for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == name and
            isinstance(n.ctx, ast.Store) and n.lineno < line]
    return max(hits) if hits else None


def _written(file: str, line: int) -> str | None:
    """The device argument of the ``Generator(...)`` call at ``line``, as written (``"cuda"``, ``device``)."""
    try:
        tree = ast.parse(linecache.getline(file, line).strip())
    except SyntaxError:
        return None
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and ast.unparse(n.func).rsplit(".", 1)[-1] == "Generator":
            dev = n.args[0] if n.args else next((k.value for k in n.keywords if k.arg == "device"), None)
            return ast.unparse(dev) if dev is not None else None
    return None


def _proof(gen: Any, devices: set[Any], drew: str) -> str:
    """The fix tried on copies: the draw follows the modules' device, and a fresh generator on the generator's
    device draws there."""
    import torch

    on = next(iter(devices))
    try:
        fresh = torch.Generator(device=gen.device)
        out = torch.randn(2, generator=fresh, device=gen.device)
        ok = out.device.type == gen.device.type
    except Exception as exc:  # noqa: BLE001 - the answer, never a crash of the report
        return (f"fix unproven: the call drew for {drew}, its modules' device ({on}), but a fresh generator on "
                f"{gen.device} could not draw here to try it ({type(exc).__name__})")
    if not ok:
        return f"fix unproven: a fresh generator on {gen.device} drew on {out.device}"
    return (f"fix proven (on copies: the call drew for {drew}, the device of its modules ({on}), so it draws on "
            f"{gen.device} once they are there; a fresh generator on {gen.device} draws a tensor there)")

"""Provenance of tensors made in a virtual run: which op made a tensor, in which module, and from which model
tensors (by path) its device and dtype came, so a problem far downstream names its source, not only the op where
it surfaced ("made by aten.cat in `<root>` from params.0 … params.3").

One ``Made`` per result that took its device and dtype from named tensors or from an earlier made tensor; a chain
of made tensors is followed up to ``DEPTH`` links (beyond that a result shares its parent's record, so memory stays
bounded however long the forward). Module paths are resolved only when a problem is written.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from torchdoctor._virtual.asked import ran_as_asked as ran_as_asked  # recorder reads it here
from torchdoctor._virtual.castsites import CAST_OPS

if TYPE_CHECKING:  # pragma: no cover
    from torchdoctor._report.model import Problem

LOOSE = [0]  # records made from parameters no module of the run named (``makers.loose_call`` asks only then)
DEPTH = 8  # links of made-from-made kept per chain
NAMES = 16  # source paths kept per record


class Made:
    """How a tensor made in a run got its device and dtype."""

    __slots__ = ("op", "module", "paths", "count", "via", "depth", "at", "arg", "site", "made_of", "promotes",
                 "loose", "default", "hook", "mixed", "moves", "loaded", "widened")

    def __init__(self, op: str, module: Any, paths: tuple[str, ...] = (), count: int = 0, via: Made | None = None,
                 depth: int = 1) -> None:
        self.op = op  # "aten.cat", "torch.ones"
        self.module = module  # the innermost running module (None: outside any module)
        self.paths = paths  # the named tensors (model tensors, inputs) it came from, first NAMES of them
        self.count = count or len(paths)  # how many there were
        self.via = via  # the made tensor it came from, when no named one
        self.depth = depth
        # a factory (nothing it came from): the line that called it, so a tensor the user made is found by file:line
        self.at: str | None = where_called() if not paths and via is None else None
        self.arg: str | None = None  # an argument of the top-level call: its name as the forward sees it
        self.site: Any = None  # a cast at a line of the user's code (``castsites.CastSite``): the chain starts there
        self.made_of: tuple[str, ...] = ()  # the named tensor a cast was made from (its dtype is not the culprit)
        # a factory's tensor that later promoted other data outside any module: (their dtype, its own, file:line)
        self.promotes: tuple[str, str, str] | None = None
        self.loose: tuple[Any, ...] = ()  # parameters no module of the run named (a network patched in): named later
        self.default = False  # a factory given no dtype (``dtype=None`` too): the default dtype, nobody's choice
        self.hook: str | None = None  # a saved-tensor unpack hook that gave it back (``saved.py``): said as such
        self.mixed = False  # made from its named tensors and an unnamed one of their dtype (activation x weight)
        self.moves = False  # the program's own line sent it to another device: for its device, the maker (``moveby.carried``)
        self.loaded: Any = None  # made by torch.load at the program's line (``loaded.Loaded``): said so, by its holder
        self.widened: Any = None  # the program's line where it promoted the model's data (``widened.Widened``)

    @classmethod
    def argument(cls, label: str, fix_label: str, call: str, before: Made | None, chain: Made | None = None,
                 cast: Made | None = None) -> Made:
        """The record of a tensor the caller passed to the outermost ``forward`` (``input_ids``, ``extra[0]``,
        ``kwargs['rotary_pos_emb_list'][0]``): the source of everything made from it. ``fix_label`` is how the fix
        names it (``kwarg extra[0]``), ``before`` how it was made (a factory at file:line), None: before the run
        (a tensor moved in from before the run, or made by an op outside any module, is said to be neither).
        With ``chain`` (its record from a factory the user called without ``device=``), the chain stays the source,
        so a device fix is written at that call. With ``cast`` (the program's line that moved it cast it too), the
        dtype's source is that cast (``Made.source``) while its device stays the argument's own (``Made.placed_by``)."""
        m = cls("argument", None, (fix_label,), 1) if chain is None else \
            cls("argument", None, via=chain, depth=chain.depth + 1)
        if cast is not None and chain is None:
            m.via, m.depth, m.moves = cast, cast.depth + 1, True
        promoted = before.promotes if before is not None and before.at else None
        m.arg = f"{label} (an argument of the {call} call" + (
            f", computed at {promoted[2]} where a {promoted[1]} tensor made by {before.op} at {before.at} promotes "
            f"{promoted[0]} to {promoted[1]})" if promoted and before is not None else
            f", made by {before.site.describe()})" if before is not None and before.site is not None and before.at else
            f", made by {before.op} at {before.at})" if before is not None and before.at else
            ")" if before is not None else ", made before the run)")
        return m

    @classmethod
    def moved(cls, path: str, module: Any) -> Made:
        """The record of a copy of the model tensor ``path`` moved to another device by code running in ``module``'s
        forward: the line that moved it (``at``), which a device problem of the copy is fixed at."""
        m = cls("Tensor.to", module, (path,), 1)
        m.at = where_called()
        return m

    def moved_copy(self, t: Any, found: str, module_path: Callable[[Any], str | None]) -> tuple[str, str] | None:
        """``t``, named by path, as a copy moved to ``found`` inside a forward: what to add to its name, and its
        source for the fix (the line). None when it is no such copy, or its module holds it (a hook that moves a
        weight and installs it, as accelerate's offload does, made the moved tensor the model's own)."""
        if self.op != "Tensor.to" or self.at is None or self.module is None or self.paths != (t._td_path,):
            return None
        leaf = t._td_path.rsplit(".", 1)[-1]
        held = self.module.__dict__
        if any(t is x or x is not None and self.kept_as(x) for d in (held.get("_parameters", {}),
               held.get("_buffers", {}), held) for x in (d.get(leaf),)):
            return None
        return (f" (a copy moved to {found} by Tensor.to at {self.at} in `{module_path(self.module) or '<root>'}`)",
                f"moved {t._td_path} at {self.at}")

    def kept_as(self, x: Any) -> bool:
        """``x`` is the real tensor this record was kept for (a copy taken back to the CPU stays real)."""
        from torchdoctor._virtual.tensor import current_space

        space = current_space()
        kept = space.real_record(x) if space is not None and isinstance(x, torch.Tensor) else None
        return kept is not None and kept[1] is self

    @property
    def source(self) -> Made:
        """The first link of the chain: the op that made it from named tensors (or a factory)."""
        link = self
        while link.via is not None and link.site is None and link.widened is None:  # a cast set the dtype (or a
            # line promoted the model's data with the cast's tensor): it is where the chain starts
            link = link.via
        return link

    @property
    def placed_by(self) -> Made:
        """The first link of the chain for a device: a cast keeps its operand's device, so it goes through casts
        (``(ids > 0).long().cumsum(-1)`` on cpu was placed by whatever made ``ids``)."""
        link = self
        while link.via is not None and not link.moves:  # a move at the program's line placed it, not its maker
            link = link.via
        return link

    @property
    def first_path(self) -> str | None:
        """The model tensor the chain started from, if any (for a cast, the tensor it cast)."""
        src = self.source
        paths = src.made_of if src.site is not None else src.paths
        return paths[0] if paths else None

    def describe(self, module_path: Callable[[Any], str | None], placed: bool = False) -> str:
        """``a tensor made by aten.mul in `lin`, 2 ops after aten.cat in `<root>` from params.0 … params.3``; a
        chain through an argument of the call ends at the argument (``from extra[0] (an argument of ...)``).
        ``placed``: for a device, the chain goes on through casts (a cast keeps its operand's device)."""
        if self.arg is not None:
            return self.arg
        src = link = self.placed_by if placed and self.source.arg is None else self.source
        probe: Made | None = self.via
        while probe is not None:  # the caller's argument on the way, if any, is what the user knows it by
            if probe.arg is not None:
                link = probe
                break
            probe = None if probe is src else probe.via  # never past a cast that set the dtype
        head = f"a tensor made by {_link(src, module_path)}"
        if src.loaded is not None:  # torch.load at the program's line, not the torch.empty inside it (``loaded``)
            head = src.loaded.describe(src)
        if src is self:
            return head
        here = f"a tensor made by {self.op} in {_where(self.module, module_path)}"
        if self.depth - link.depth == 1:
            return f"{here} from {link.arg or head}"
        return f"{here}, {self.depth - link.depth} ops after {_link(link, module_path)}"


def _where(module: Any, module_path: Callable[[Any], str | None]) -> str:
    if module is None:
        return "code outside the model"
    path = module_path(module)
    return f"`{path or '<root>'}`" if path is not None else f"a {type(module).__name__} outside the model"


def _link(m: Made, module_path: Callable[[Any], str | None]) -> str:
    if m.arg is not None or m.hook is not None:
        return m.arg or m.hook or ""
    if m.widened is not None:  # the program's line where the model's data met it and was promoted
        return m.widened.describe(m, _link(m.via.source, module_path) if m.via is not None else "")
    if m.site is not None:  # the cast as written, its line and where its dtype was read from
        text = f"{m.site.describe()} in {_where(m.module, module_path)}"
        if m.made_of:
            return f"{text} from {m.made_of[0]}"
        return text + ("" if m.via is None else f" from {m.via.arg}" if m.via.arg else " from an argument" if str(
            m.via.op) == "argument" else f" from a tensor made by {m.via.op} in {_where(m.via.module, module_path)}")
    text = f"{m.op} in {_where(m.module, module_path)}"
    if m.moves and m.via is not None:  # the program's move of a tensor made before it: both named
        return f"{_link(m.via.source, module_path)}, then moved by the line at {m.at}"
    if m.at:  # a factory: the line that called it, inside a forward as outside one
        text += f" at {m.at}"
    if m.promotes:  # its tensor met other data outside the model, which it promoted there
        text += f" ({m.promotes[1]}, promoting {m.promotes[0]} data at {m.promotes[2]})"
    if not m.paths:
        return text
    if m.count == 1:
        return f"{text} from {m.paths[0]}"
    if m.count == 2 and len(m.paths) == 2:
        return f"{text} from {m.paths[0]} and {m.paths[1]}"
    return f"{text} from {m.paths[0]} … {m.paths[-1]}" + (f" ({m.count} tensors)" if m.count > len(m.paths) or
                                                            m.count > 4 else "")


# code whose frames are not where a user made a tensor: torchdoctor itself and torch
MACHINERY = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
              os.path.dirname(os.path.abspath(torch.__file__ or "")) + os.sep)


def user_frame(depth: int = 2) -> Any:
    """The first frame outside torch and torchdoctor, from ``depth`` frames up (None when there is none)."""
    f: Any = sys._getframe(depth)
    while f is not None and f.f_code.co_filename.startswith(MACHINERY):
        f = f.f_back
    return f


def built_module(depth: int = 2) -> str | None:
    """``torch.nn.BatchNorm2d`` when the factory running now was called by a torch module's ``__init__`` that the user's
    code called (a module built inside a forward): its parameters and buffers are made by that line, on the CPU."""
    f: Any = sys._getframe(depth)
    name = None
    while f is not None and f.f_code.co_filename.startswith(MACHINERY):
        if f.f_code.co_name == "__init__" and isinstance(f.f_locals.get("self"), torch.nn.Module):
            name = type(f.f_locals["self"]).__name__  # the outermost __init__ of the machinery wins
        f = f.f_back
    return f"torch.nn.{name}" if name and hasattr(torch.nn, name) else None


def where_called() -> str | None:
    """``file:line`` of the first frame outside torch and torchdoctor (the code that called a factory); a path under
    the working directory is relative to it."""
    f = user_frame(3)
    if f is None:
        return None
    at = short_at(f)
    if at not in IN_SCOPE and len(IN_SCOPE) < 4096:  # the tensor argument by the name its fix can use there
        code = f.f_code
        from torchdoctor._virtual.devvars import CPU_ARG, DEVICE_NAMES, device_name, device_vars

        IN_SCOPE[at] = device_name(f, code.co_varnames[:code.co_argcount])
        LINES[at] = (code.co_filename, f.f_lineno)
        if not IN_SCOPE[at] or (code.co_filename, f.f_lineno) in CPU_ARG:  # (an argument on the cpu: no device name)
            DEVICE_NAMES[at] = device_vars(f)
    return at


def maker_of(t: Any, module_path: Callable[[Any], str | None]) -> str | None:
    """How a tensor the run made was made (its record, or the one kept for a real cpu tensor: ``a tensor made by
    torch.from_numpy in code outside the model at app.py:17``); None when nothing was recorded."""
    from torchdoctor._virtual.tensor import current_space

    made = getattr(t, "_td_origin", None)
    if made is None and (space := current_space()) is not None and space.real and isinstance(t, torch.Tensor):
        kept = space.real_record(t)
        made = kept[1] if kept is not None else None
    return made.describe(module_path) if isinstance(made, Made) else None


IN_SCOPE: dict[str, str] = {}  # "file:line" of a factory call -> the first tensor argument of its function
LINES: dict[str, tuple[str, int]] = {}  # "file:line" as reports write it -> the full file name and the line
LIKE: dict[str, str] = {}  # "operand x at app.py:9" -> the operand whose device x should take there (a split model)


def short_at(f: Any) -> str:
    """``file:line`` of frame ``f`` as reports write it."""
    name = f.f_code.co_filename
    cwd = os.getcwd() + os.sep
    short = name[len(cwd):] if name.startswith(cwd) else os.sep.join(name.split(os.sep)[-2:])
    return f"{short}:{f.f_lineno}"


_LIKE = frozenset(f"aten.{n}_like" for n in ("randn", "rand", "randint"))  # new data; zeros_like(p) copies p's dtype


def made_from(op: str, module: Any, tensors: Any, dtype: Any, device: Any) -> Made | None:
    """The record of a result of ``op`` with ``dtype`` on ``device``: the arguments that share both gave it. A
    ``*_like`` factory the user's code calls outside any module (``noise = torch.randn_like(latents)``) is a maker
    of its own, named by its line."""
    if module is None and str(op) in _LIKE:
        return Made(f"torch.{str(op)[5:]}", None)
    paths: list[str] = []
    count = 0
    via = None
    cast = high = None  # a cast's source (``torch.arange(n).float()``): same device, the dtype set by the op
    for t in tensors:
        if t.dtype != dtype or t._td_device != device:
            if cast is None and t._td_device == device:
                cast = t
            continue
        high = t if high is None else high
        path = t._td_path
        if path is not None:
            count += 1
            if count <= NAMES:
                paths.append(path)
        elif via is None:
            via = t._td_origin
    if module is None and high is not None and cast is not None and cast.is_floating_point() and \
            dtype.is_floating_point:
        _promoting(high, cast.dtype, dtype)
    if count:
        (m := Made(op, module, tuple(paths), count)).mixed = count < sum(t.dtype == dtype and t._td_device == device
                                                                          for t in tensors)
        return m
    if via is not None and via.hook is not None:  # autograd's own views of what an unpack hook gave back: its own
        return via
    if via is None and cast is not None:
        if str(op) in CAST_OPS:  # a dtype cast in the user's code: the line, and where the dtype was read from
            site = _cast_here(dtype)
            if site is not None:
                m = Made(str(op), module, (f"cast at {site.at}",), 1, via=cast._td_origin,
                         depth=(cast._td_origin.depth + 1) if cast._td_origin is not None else 1)
                m.site, m.made_of = site, ((cast._td_path,) if cast._td_path is not None else ())
                return m
        if cast._td_path is not None:
            return Made(op, module, (cast._td_path,), 1)
        via = cast._td_origin
    if via is None and module is not None:  # parameters of a module the model does not hold (``patched``)
        loose = tuple(t for t in tensors if t._td_path is None and t._td_origin is None and t.requires_grad)
        if loose:
            m = Made(str(op), module)
            m.loose, LOOSE[0] = loose[:NAMES], LOOSE[0] + 1
            return m
    if via is None:
        # outside the model, from tensors nothing recorded (made before the run): the user's line that made it, so
        # `y = x.to(torch.float16)` in the block is found by file:line (inside modules this stays free)
        return Made(str(op), None) if module is None and tensors else None
    if module is not None and cast is not None and cast.is_floating_point() and via.source.site is not None:
        from torchdoctor._virtual.widened import widened_at  # the model's data promoted by a cast's tensor there

        if (w := widened_at(cast, dtype, via.source.site if high is not None and via is high._td_origin else None,
                            user_frame(2), short_at, LINES)) is not None:
            (m := Made(str(op), module, (f"widened at {w.at}",), 1, via=via, depth=via.depth + 1)).widened = w
            return m
    if via.depth >= DEPTH and via.site is None and not via.paths and via.arg is None and via.at is None:
        return via  # a plain record past the kept links stands for every op after it; never a cast or a source
    return Made(op, module, via=via, depth=via.depth + 1)


def operand_at(t: Any) -> str | None:
    """``target at app.py:16``: the name the user's line calls the operand ``t`` by (a local holding it, written on
    that line), where a fix casts it at the call; None when there is none."""
    import linecache
    import re

    f = user_frame(2)
    line = linecache.getline(f.f_code.co_filename, f.f_lineno) if f is not None else ""
    for name, v in (f.f_locals.items() if f is not None else ()):
        if v is t and re.search(rf"(?<![\w.]){re.escape(name)}\b", line):
            at = short_at(f)
            LINES[at] = (f.f_code.co_filename, f.f_lineno)
            return f"{name} at {at}"
    return None


def _promoting(t: Any, low: Any, dtype: Any) -> None:
    """``t`` (of ``dtype``) promotes data of ``low`` in an op outside any model (``(1 - sigmas) * latents``): the
    factory it came from is told so, once, with that line (``Made.promotes``)."""
    from torchdoctor._placement import dtype_str

    origin = getattr(t, "_td_origin", None)
    src = origin.source if origin is not None else None
    if src is not None and src.at and src.promotes is None and torch.promote_types(low, dtype) == dtype:
        src.promotes = (dtype_str(low), dtype_str(dtype), where_called() or "?")


def _cast_here(dtype: Any) -> Any:
    """The site of a cast the user's code is running now (None outside user code)."""
    from torchdoctor._virtual.castsites import cast_site

    f = user_frame(3)
    return cast_site(f, short_at(f), dtype) if f is not None and isinstance(dtype, torch.dtype) else None


def from_origin(p: Problem, origin: dict[tuple[str, ...], str], culprits: Any = ()) -> Problem:
    """A tensor made in forward names the model tensor its wrong dtype or device came from (unless it names one
    of the ``culprits`` already: ``made ... from a.adapter.up and a.adapter.down``)."""
    src = origin.get((p.kind, p.found)) or origin.get((p.kind, p.found, p.module_path or ""))
    words = set(p.message.replace(",", " ").split()) if culprits else set()
    if src is not None and any(c in words for c in culprits):
        return p
    if src is not None and "a tensor made by " in p.message and f" {src} " not in p.message:
        # the chain ends at a tensor that is right as it is (a rotary buffer kept float32, cast with
        # ``.to(x.dtype)`` where x came from the culprit): the data flow cannot see a dtype read from another tensor
        return replace(p, message=f"{p.message} (the {p.found} culprit: {src})")
    if src is None or "a tensor made in forward" not in p.message or "a tensor made in forward from" in p.message:
        return p
    return replace(p, message=p.message.replace("a tensor made in forward",
                                                f"a tensor made in forward from {src} ({p.found})", 1))


def moved_by_apply(t: Any) -> str | None:
    """The path of ``t`` while ``Module.to`` moves it (``_apply`` frames: the outermost module moved, and the
    attribute of the innermost one that holds ``t``), for a move refused before the run named the tensor."""
    f: Any = sys._getframe(1)
    frames: list[dict[str, Any]] = []
    while f is not None:
        if f.f_code.co_name == "_apply" and isinstance(f.f_locals.get("self"), torch.nn.Module):
            frames.append(f.f_locals)
        f = f.f_back
    if not frames:
        return None
    inner, root = frames[0]["self"], frames[-1]["self"]
    key = next((k for k, v in [*inner._parameters.items(), *inner._buffers.items()] if v is t or (
        v is not None and getattr(v, "data", None) is t)), frames[0].get("key"))
    base = next((n for n, m in root.named_modules() if m is inner), None)
    return None if key is None or base is None else f"{base}.{key}" if base else str(key)

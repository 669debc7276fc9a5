"""The maker of a model's own tensor that the program made on the CPU inside a run: a buffer registered from
``torch.from_numpy(...)`` (which takes no device and ignores a ``with torch.device("cuda"):`` context), a state dict
filled with ``torch.empty(v.shape)`` and loaded with ``assign=True``. The module-entry check finds the parameter or
buffer on the CPU; the fix is at the line that made it (``device=`` given, a host-data maker moved after it), not a
move of the model's tensor after the fact, which the program's next load or build would undo.

Real tensors keep no record of their own, and ``nn.Parameter(t)`` / ``load_state_dict(assign=True)`` wrap ``t`` in a
new object: the record is kept by the storage the tensors share (``remember``), for this run only (``clear``, when
the next run starts), bounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchdoctor._placement import FLOAT8_DTYPES

_LIMIT = 4096
# (storage, data pointer, bytes) -> (maker, file:line, whether a default-device context was set when it ran, whether
# a module's __init__ was running)
_MADE: dict[tuple[int, int, int], tuple[str, str, bool, bool]] = {}
_SHAPES: dict[tuple[int, int, int], tuple[tuple[int, ...], torch.dtype]] = {}  # its shape and dtype when made
_STORAGES: dict[tuple[int, int, int], Any] = {}  # the storages themselves, so no other one takes their address
_HELD = [0]  # their bytes
_BYTES = 1 << 28  # at most this much is held past the tensors' own life (a state dict the program filled)


def _key(t: torch.Tensor) -> tuple[int, int, int] | None:
    try:  # machinery: under the run's function mode a storage asked for outside its handler is not a valid one
        with torch._C.DisableTorchFunction():  # (a module-entry check's ``maker_note``: "invalid python storage")
            s = t.untyped_storage()
            return (s._cdata, s.data_ptr(), s.nbytes())
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):
        return None


def remember(t: Any, made: Any) -> None:
    """A real CPU tensor a factory made at a line of the program (``made.at``) during a run, with whether it ignored
    a default-device context (``torch.from_numpy`` under ``with torch.device("cuda"):``) and whether a module's
    ``__init__`` made it: its device is that line's fault when it ignored the context or was made outside any
    ``__init__`` (a state dict filled to be loaded with ``assign=True``); a tensor a model's ``__init__`` makes on the
    cpu is moved with the model, which is that fix. Its dtype is that line's in any case (numpy's float64)."""
    op, at = getattr(made, "op", None), getattr(made, "at", None)
    if not at or not isinstance(op, str) or not op.startswith("torch.") or op.startswith("torch.nn.") or \
            getattr(made, "module", None) is not None or type(t) is not torch.Tensor or t.device.type != "cpu" or \
            len(_MADE) >= _LIMIT:
        return  # a forward's own factories (the run's bulk) are named by the ops they meet
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return
    if _HELD[0] + storage.nbytes() > _BYTES:
        return
    key = _key(t)
    if key is not None and key[1]:  # a model built on the cpu and never moved: its move, not this line, fixes its
        _MADE[key] = (op, at, _default_device_set(), _building())  # device (its dtype is this line's)
        _SHAPES[key] = (tuple(t.shape), t.dtype)
        # held until the next run: its address is never another storage's while its record stands
        _STORAGES[key] = storage
        _HELD[0] += storage.nbytes()


# dtypes some device cannot hold (float8 on mps, float64 on mps and some xpu): a host cast to one keeps its line
REFUSABLE = frozenset({*FLOAT8_DTYPES, torch.float64})
_CASTS: dict[tuple[int, int, int], Any] = {}  # storage key -> ``dtypevar.HostCast`` (the program's cast, its dtype's
# binding), for this run


def cast(t: Any, src: Any) -> Any:
    """``t``, the program's host cast of ``src``; a cast to a dtype some device refuses (``w.data.to(weight_dtype)``
    to float8) keeps its line and where its dtype was bound (``weight_dtype = torch.float8_e4m3fn``) by the storage
    the tensors share, for a refused move of the parameter that holds it later."""
    if type(t) is torch.Tensor and t.dtype in REFUSABLE and t.dtype != src.dtype:
        _cast(t)
    if isinstance(t, torch.Tensor) and isinstance(src, torch.Tensor) and t is not src and t.dtype != src.dtype and \
            t.is_floating_point() and src.is_floating_point():
        _cast_made(t, src)
    return t


def _cast_made(t: torch.Tensor, src: torch.Tensor) -> None:
    """The program's own line cast ``src`` on the CPU (``(img * 2).to(weight_dtype)``, ``img.half()``): that line
    chose ``t``'s dtype, so it is the dtype's maker once ``t`` meets the virtual tensors (``Made.source`` stops at
    its cast site), never the factory that made ``src`` in the dtype it had; its device stays ``src``'s maker's."""
    from torchdoctor._virtual.castsites import cast_site
    from torchdoctor._virtual.moveby import is_own
    from torchdoctor._virtual.origin import LINES, Made, short_at, user_frame
    from torchdoctor._virtual.tensor import current_space

    space = current_space()
    f = user_frame(3) if space is not None and space.real else None
    if f is None or not is_own(f.f_code.co_filename):
        return
    at = short_at(f)
    site = cast_site(f, at, t.dtype)
    if site is None:
        return
    kept = space.real_record(src)  # type: ignore[union-attr]
    running = space.hooks.running()  # type: ignore[union-attr]
    # its device's maker: what made ``src``, else this line as the run names a tensor made before it (never the
    # cast's site, which only a dtype is fixed at)
    via = kept[1] if kept is not None and kept[1] is not None else Made("Tensor.to", running)
    made = Made("Tensor.to", running, (f"cast at {at}",), 1, via=via, depth=via.depth + 1)
    made.site, made.at = site, at
    LINES.setdefault(at, (f.f_code.co_filename, f.f_lineno))
    space.keep_real(t, None, made)  # type: ignore[union-attr]


def _cast(t: torch.Tensor) -> None:
    from torchdoctor._virtual.dtypevar import host_cast

    key = _key(t)
    rec = host_cast(t.dtype) if key is not None and key[1] else None
    if rec is not None:  # (its storage is not held: a model's weights; a record is read for its dtype only)
        if len(_CASTS) >= _LIMIT:  # the oldest goes (a loop of float64 math before the weights' cast)
            _CASTS.pop(next(iter(_CASTS)))
        _CASTS[key] = rec  # type: ignore[index]


def cast_of(t: Any) -> Any:
    """The program's host cast that made ``t``'s storage (``dtypevar.HostCast``), or None."""
    if not _CASTS or not isinstance(t, torch.Tensor) or t.device.type != "cpu":
        return None
    key = _key(t)
    rec = _CASTS.get(key) if key is not None else None
    return rec if rec is not None and rec.dtype == t.dtype else None


def clear() -> None:
    from torchdoctor._virtual.defaultdtype import clear as default_made
    from torchdoctor._virtual.dtypevar import _KNOWN, SAID

    default_made()  # the default-dtype factories noted are this run's too
    SAID.clear()
    _KNOWN.clear()
    _CASTS.clear()
    _MADE.clear()
    _REFUSED.clear()
    _SHAPES.clear()
    _STORAGES.clear()
    _HELD[0] = 0


_REFUSED: dict[str, tuple[str, str, bool, bool]] = {}  # a model tensor's path -> the maker of the tensor whose move
# the device refused in its dtype (the model then holds a stand-in, no longer that storage), for this run


def refused(path: str, t: Any) -> str:
    """``t``, the model tensor at ``path`` whose move the device refuses in its dtype (numpy's float64 statistics
    registered as a buffer, bound for mps): its maker kept by path for the fix at that line, and said as
    `` (made by torch.from_numpy at app.py:16)``; empty when no factory of the program made it in this run."""
    hit = maker(t)
    if hit is None:
        return ""
    if len(_REFUSED) < _LIMIT:
        _REFUSED[path] = hit
    return f" (made by {hit[0]} at {hit[1]})"


def refused_maker(path: str) -> tuple[str, str, bool, bool] | None:
    return _REFUSED.get(path)


def made_like(t: Any, dtype: torch.dtype, makers: Sequence[str]) -> tuple[str, str, bool, bool] | None:
    """The one record of ``makers`` (host-data makers) that made a tensor of ``t``'s shape in ``dtype``: a buffer
    whose refused move (float64 to MPS) left a stand-in in its place; None unless exactly one matches."""
    if not isinstance(t, torch.Tensor):
        return None
    hits = {_MADE[k] for k, (shape, dt) in _SHAPES.items() if shape == tuple(t.shape) and dt == dtype and
            k in _MADE and _MADE[k][0] in makers}
    return next(iter(hits)) if len(hits) == 1 else None


def recorded() -> bool:
    """Any factory of the program made a tensor this run kept a record of."""
    return bool(_MADE)


def maker(t: Any) -> tuple[str, str, bool, bool] | None:
    """(maker, file:line, context ignored, made in an ``__init__``) of the factory that made ``t``'s storage in this
    run, or None."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or not _MADE:
        return None
    key = _key(t)
    return _MADE.get(key) if key is not None else None


def maker_note(t: Any) -> str:
    """`` (made by torch.from_numpy at app.py:7, which ignores the torch.device context)`` for a model tensor the
    program made on the CPU in this run; empty when no factory of the program made it."""
    hit = maker(t)
    if hit is None:
        return _computed_note(t)
    op, at, ctx, building = hit
    if building and not ctx:
        return ""  # a model built on the cpu: not moved, whatever made its tensors
    name = bound_name(at)
    return f" (made by {op} at {at}" + (f" as `{name}`" if name else "") + (
        ", which ignores the torch.device context)" if ctx else ")")


def _computed_note(t: Any) -> str:
    """`` (made by torch.ones at app.py:3 as `pos`)`` for a tensor the program computed on the host from one
    factory's tensor at its own line (``torch.ones(3) * 2``), outside any forward; else empty."""
    from torchdoctor._virtual.tensor import current_space

    space = current_space()
    kept = space.real_record(t) if space is not None and space.real and isinstance(t, torch.Tensor) else None
    made = kept[1] if kept is not None else None
    op, at = getattr(made, "op", None), getattr(made, "at", None)
    if not isinstance(op, str) or not op.startswith("torch.") or op.startswith("torch.nn.") or not at or \
            getattr(made, "module", None) is not None:
        return ""
    name = bound_name(at)
    if name and not _bound_to(name, t):  # computed later from the tensor that name holds (``w = n.sum() / n``)
        return f" (computed on the host from `{name}`, made by {op} at {at})"
    return f" (made by {op} at {at}" + (f" as `{name}`)" if name else ")")


def _bound_to(name: str, t: Any) -> bool:
    """A live frame of the program binds ``name`` to ``t`` itself (else ``t`` was computed from what it holds);
    True when no frame binds the name (nothing says otherwise)."""
    import sys

    f: Any = sys._getframe(2)
    seen = False
    while f is not None:
        if name in f.f_locals:
            if f.f_locals[name] is t:
                return True
            seen = True
        f = f.f_back
    return not seen


def bound_name(at: str) -> str | None:
    """``class_weights`` of ``class_weights = torch.tensor([...])`` at ``at`` (the program's own line): the name the
    program gave what the line made, which it then handed on; None for a line that binds no one name."""
    import ast

    from torchdoctor._virtual.origin import LINES
    from torchdoctor._virtual.ownline import own_line

    file, line = LINES.get(at, ("", 0))
    read = own_line(file, line) if file else None
    stmt = read[2].body[0] if read is not None and len(read[2].body) == 1 else None
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
        stmt, ast.AnnAssign) else []
    if len(targets) != 1 or not isinstance(targets[0], (ast.Name, ast.Attribute, ast.Subscript)):
        return None
    return ast.unparse(targets[0])


def _building() -> bool:
    """A module's ``__init__`` is running (the factory builds a model's own tensor, as the model is built)."""
    import sys

    f: Any = sys._getframe(2)
    for _ in range(64):
        if f is None:
            return False
        code = f.f_code  # its first argument by whatever name (``def __init__(s)``)
        if code.co_name == "__init__" and code.co_argcount and \
                isinstance(f.f_locals.get(code.co_varnames[0]), torch.nn.Module):
            return True
        f = f.f_back
    return False


def _default_device_set() -> bool:
    try:
        return torch.get_default_device().type != "cpu"
    except Exception:  # an older torch: no context to ignore
        return False

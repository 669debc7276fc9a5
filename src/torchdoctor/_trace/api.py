"""The public ``trace``: a context manager and decorator recording every device or dtype change, with its call.

>>> import torch, torchdoctor
>>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
>>> with torchdoctor.trace(model) as t:
...     model.to(torch.float16)  # doctest: +ELLIPSIS
Sequential(...)
>>> t.who_moved("0.bias").call, t.who_moved("0.bias").to_dtype
('to()', 'float16')
>>> t.history("0.weight")[0].from_dtype
'float32'
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from typing import IO, Any

import torch

from torchdoctor._trace import patches
from torchdoctor._trace.record import TraceRecord
from torchdoctor._trace.session import Session
from torchdoctor._report.text import public_types

log = logging.getLogger("torchdoctor.trace")


class trace(contextlib.ContextDecorator):  # noqa: N801 - reads like torch.no_grad
    """Record every change of device or dtype of ``obj``'s tensors while the block (or decorated function) runs.

    ``obj`` is a module, a pipeline or any object holding modules and tensors; ``None`` traces every module
    that the code moves (each becomes a root the first time a move or a LoRA call touches it).
    Each change is a ``TraceRecord``: path, from -> to, the library call (``unfuse_lora()``), the user's
    source line and the time. Selected records (``moves``: device/dtype changes; ``lora``: everything LoRA
    and adapter calls did, including tensors they added or removed) are logged on the ``torchdoctor.trace``
    logger at INFO, one line each, and written as JSON lines to ``file``; ``history()`` and ``who_moved()``
    answer from every record. Nothing is patched while no trace is active, and tracing never changes the model.
    """

    def __init__(self, obj: Any = None, *, moves: bool = True, lora: bool = False,
                 file: str | os.PathLike[str] | None = None, logger: logging.Logger | None = None) -> None:
        if isinstance(obj, (str, bytes, int, float)) or (obj is not None and isinstance(obj, type)):
            raise TypeError(f"trace() needs the object whose tensors to watch (a module, a pipeline, a dict of "
                            f"modules...), not {type(obj).__name__} {obj!r}; pass None to trace every module "
                            "the code moves")
        self.obj = obj
        self.moves = moves
        self.lora = lora
        self.file = os.fspath(file) if file is not None else None
        self.logger = logger or log
        self._lock = threading.RLock()
        self._depth = 0
        self._session: Session | None = None
        self._sessions: list[Session] = []
        self._fh: IO[str] | None = None
        self._opened = False

    # -- activation -----------------------------------------------------------------------------------------
    def __enter__(self) -> trace:
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                if self.file is not None:
                    self._fh = open(self.file, "a" if self._opened else "w", encoding="utf-8")
                    self._opened = True
                session = Session(self.obj, adopt=self.obj is None, emit=self._emit, live=self._live)
                self._session = session
                self._sessions.append(session)
                patches.start(session)
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._session is not None:
                session, self._session = self._session, None
                try:
                    session.final_check()
                except Exception:  # a diagnostic never breaks the program it watches
                    log.warning("torchdoctor.trace: the final look at the traced object failed", exc_info=True)
                finally:
                    patches.stop(session)
                    if self._fh is not None:
                        self._fh.close()
                        self._fh = None

    def selected(self, rec: TraceRecord) -> bool:
        """Does ``moves``/``lora`` select this record for the log and the file?"""
        return (self.moves and rec.kind == "move") or (self.lora and rec.lora)

    def _live(self) -> bool:
        """Is a record written anywhere the moment it is made (the log at INFO, a file)?"""
        return self._fh is not None or self.logger.isEnabledFor(logging.INFO)

    def _emit(self, rec: TraceRecord) -> None:
        if not self.selected(rec):
            return
        if self.logger.isEnabledFor(logging.INFO):
            self.logger.info("%s", rec.line_text())
        fh = self._fh
        if fh is not None:
            with self._lock:
                fh.write(json.dumps(rec.to_dict()) + "\n")
                fh.flush()  # a script that crashes later still leaves its moves on disk

    # -- queries --------------------------------------------------------------------------------------------
    @property
    def records(self) -> tuple[TraceRecord, ...]:
        """Every record so far, oldest first (also the ones ``moves``/``lora`` did not select for output)."""
        return tuple(r for s in self._sessions for r in s.records)

    def _path(self, path_or_tensor: str | torch.Tensor) -> str | None:
        if isinstance(path_or_tensor, torch.Tensor):
            for s in reversed(self._sessions):
                p = s.path_of(path_or_tensor)
                if p is not None:
                    return p
            return None
        if not isinstance(path_or_tensor, str):
            raise TypeError(f"a tensor path (like 'unet.conv_in.bias') or a tensor, not {type(path_or_tensor).__name__}")
        return path_or_tensor

    def history(self, path_or_tensor: str | torch.Tensor) -> list[TraceRecord]:
        """Every record of the tensor at this path (or of this tensor), oldest first.

        A path that is not recorded exactly matches records whose path ends with it (``to_q.bias`` finds
        ``unet.mid_block.attentions.0.to_q.bias``)."""
        path = self._path(path_or_tensor)
        if path is None:
            return []
        return [r for s in self._sessions for r in s.history(path)]

    def who_moved(self, path_or_tensor: str | torch.Tensor) -> TraceRecord | None:
        """The last record that put the tensor where it is (a move, or the call that created it), or None."""
        for rec in reversed(self.history(path_or_tensor)):
            if rec.kind in ("move", "add"):
                return rec
        return None

    def __repr__(self) -> str:
        state = "active" if self._depth else "inactive"
        return f"<torchdoctor.trace {state}, {len(self.records)} records>"


def active() -> bool:
    """Is any trace recording right now (in any thread)?"""
    return bool(patches.SESSIONS)


def record_for(tensor_or_path: torch.Tensor | str, root: str | None = None) -> TraceRecord | None:
    """The active traces' last record of this tensor (or path), or None when no trace is active or nothing was
    recorded. ``root``: the type name of the object the path is relative to; its records win over another
    object's at the same path."""
    try:
        for s in reversed(patches.SESSIONS):
            path = s.path_of(tensor_or_path) if isinstance(tensor_or_path, torch.Tensor) else tensor_or_path
            if not isinstance(path, str):
                continue
            recs = s.history(path)
            if root:  # another object's record at a path that merely ends the same (``0.weight`` for ``weight``)
                recs = [r for r in recs if r.root == root] or [r for r in recs if _holds(s, r, path, root)]
            if recs:
                return recs[-1]
    except Exception:  # called while an error is being explained: never raise
        log.debug("torchdoctor.trace: record_for failed", exc_info=True)
    return None


def _holds(s: Any, r: TraceRecord, path: str, root: str) -> bool:
    """Record ``r`` of another traced root is the last change of the tensor at ``path`` of a ``root`` object only
    when that root holds such an object where ``r.path`` says (``loss_fn.weight`` of a model holding its
    ``CrossEntropyLoss``): a module's ``.to()`` is the last change of the tensors it holds, never of another's; an
    unlabelled root (``trace(obj)``) records the object asked for, at exactly that path."""
    if r.path == path:
        return not r.root
    prefix = r.path[:-len(path) - 1]
    for traced in s.roots:
        if traced.label == r.root:
            held = traced.resolve(prefix)
            if held is not None and type(held).__name__ == root:
                return True
    return False


def note_for(tensor_or_path: torch.Tensor | str, root: str | None = None) -> str | None:
    """What the active traces know about the last change of this tensor (or path), as a sentence:
    ``on cpu since `unfuse_lora()` at app.py:42``; None when no trace is active or nothing was recorded."""
    rec = record_for(tensor_or_path, root)
    return rec.note() if rec is not None else None


__all__ = ["TraceRecord", "active", "note_for", "record_for", "trace"]

public_types(trace)

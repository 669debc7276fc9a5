"""A silent promotion seen from the outside: the model's output comes back in a wider floating dtype than the model
computes in (a bf16 model returns float32), with no error on the way.

explain checks no op, and strict with a model checks ops only inside modules whose own tensors disagree
(``_guard/fastpath.py``): a promotion by a tensor made in a forward whose module agreed (``h * torch.ones(n)``) runs
unchecked in both. So when the outermost module returns, its output's dtype is compared with the model's: the cheap
test (the first floating parameter's dtype) runs once per model and output dtype in a session, the model's policy is
walked only when the output is wider, and only then a copy of the model runs the same call again under strict on every
op, which stops at the promoting op with guard's own report (the operand by path or by its maker, the fix, its proof).
explain warns with that report and records its problems (the output the program got is left as it is); strict raises
it. A model whose output is wider because its forward casts it so (``logits.float()``) has no promoting op: quiet.
"""

from __future__ import annotations

from torchdoctor._guard import trialcopy as copy
import logging
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from torchdoctor._report.text import user_stacklevel

if TYPE_CHECKING:  # pragma: no cover - the report types load with the first model whose output widens
    from torchdoctor._report.model import PlacementError

log = logging.getLogger("torchdoctor.guard")
_T = torch.Tensor


def _first_float(out: Any) -> torch.Tensor | None:
    """The first floating tensor of a forward's output (a tensor, a tuple or list, a dict or ``ModelOutput``)."""
    if type(out) is _T or isinstance(out, _T):
        return out if out.is_floating_point() else None
    values = dict.values(out) if isinstance(out, dict) else out if type(out) in (list, tuple) else ()
    for v in values:
        if isinstance(v, _T) and v.is_floating_point():
            return v
    return None


class Outcome:
    """The output check of one session (explain, strict with a model): ``check(root, args, kwargs, out)`` when the
    outermost module returns."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.seen: set[tuple[int, torch.dtype]] = set()

    def check(self, root: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        s = self.session
        if s.replaying:
            return
        t = _first_float(out)
        if t is None:
            return
        key = (id(root), t.dtype)
        if key in self.seen:
            return
        self.seen.add(key)
        try:
            found = self._promoted(root, args, kwargs, t.dtype)
        except Exception:  # a read-only check never raises into the program it watches
            log.debug("output check failed", exc_info=True)
            return
        if found is None:
            return
        from torchdoctor._report.model import PlacementWarning

        err, note = found
        g = s.g
        problems = list(err.problems)
        g._record_problems(problems)
        g._note(problems, note)
        if s.mode == "strict":
            raise err
        warnings.warn(f"torchdoctor.guard: `{type(root).__name__}` returned {_name(t.dtype)}, wider than the model's "
                      f"{problems[0].expected if problems else 'dtype'}: a silent promotion\n{err}", PlacementWarning,
                      stacklevel=user_stacklevel())

    def earlier(self, root: Any) -> tuple[PlacementError, Any] | None:
        """strict at the module boundary, failing on an operand made in a forward that ran unchecked: the op that
        promoted it silently before (``self.b(self.a(x) * gate)``: the ``mul``, not the ``addmm`` that refused its
        result), from a strict re-run of the whole forward on a copy; None when no op before promoted."""
        inputs = tuple(self.session.frames.inputs_of(root)) if isinstance(root, nn.Module) else ()
        if not inputs or self.session.replaying:
            return None
        return self._rerun(root, inputs, {})

    def _promoted(self, root: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                  dtype: torch.dtype) -> tuple[PlacementError, Any] | None:
        """The report of the op that promoted the model's dtype to ``dtype``, from a strict re-run on a copy; None
        when the output is not wider than the model's dtype or no op promoted it."""
        if not _widens(next((x.dtype for x in root.parameters()
                                  if x.is_floating_point() and not _float8(x.dtype)), None), dtype):
            return None
        if any(isinstance(a, _T) and a.dtype == dtype for a in (*args, *kwargs.values())):
            return None  # the caller fed that dtype: no promotion of the model's own
        maps = self.session.maps_for(root)
        want = maps.dtype_for("") if maps is not None else None
        if not _widens(want, dtype):
            return None
        return self._rerun(root, args, kwargs)

    def _rerun(self, root: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> tuple[PlacementError, Any] | None:
        s = self.session
        from torchdoctor._guard.component import _quiet, copyable
        from torchdoctor._report.model import PlacementError

        if not copyable(root):
            return None
        frames = s.frames
        kept = {k: copy.copy(getattr(frames, k)) for k in ("stack", "inputs", "ran", "bw") if hasattr(frames, k)}
        rng = torch.get_rng_state()
        s.replaying = True
        inner: Any = None
        found: PlacementError | None = None
        try:
            _quiet(True)
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                trial = copy.deepcopy(root)
                inner = type(s.g)(trial, mode="strict", every_op=True)  # paths as in the user's model
                with inner:
                    trial(*args, **kwargs)
        except PlacementError as err:
            if any("promotes the model's" in p.message for p in err.problems):
                found = err
        except Exception:  # the re-run's own failure says nothing of this run: quiet
            found = None
        finally:
            _quiet(False)
            s.replaying = False
            for k, v in kept.items():
                getattr(frames, k).clear()
                getattr(frames, k).update(v) if isinstance(v, (dict, set)) else getattr(frames, k).extend(v)
            torch.set_rng_state(rng)
        if found is None:
            return None
        from torchdoctor._guard.record import Note

        notes = [inner.report().note(p) for p in found.problems]
        note = next((n for n in notes if n.fix or n.maker), None) or Note(
            None, found.fix, getattr(found, "proof", None), getattr(found, "patch", None))
        return found, note


def _widens(held: torch.dtype | None, out: torch.dtype) -> bool:
    """Is ``out`` a promotion of ``held``? Never for float8 (torch promotes nothing with it: an fp8 weight cast per
    call returns the compute dtype), integer, bool or complex dtypes.

    >>> _widens(torch.bfloat16, torch.float32), _widens(torch.float8_e4m3fn, torch.bfloat16)
    (True, False)
    """
    if held is None or held == out or _float8(held) or _float8(out) or not held.is_floating_point \
            or not out.is_floating_point:
        return False
    try:
        return torch.promote_types(held, out) == out
    except (RuntimeError, TypeError):
        return False


def _float8(dtype: torch.dtype) -> bool:
    """A float8 (or packed float4) dtype, by its one-byte floating storage: torch promotes nothing with either."""
    return dtype.is_floating_point and dtype.itemsize == 1


def _name(dtype: torch.dtype) -> str:
    from torchdoctor._placement import dtype_str

    return dtype_str(dtype)

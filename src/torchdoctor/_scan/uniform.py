"""``tally`` for the commonest walk: one root component, plain ``Tensor``/``Parameter`` objects only, every tensor on
one device in one dtype (a model as built, loaded or moved whole). Its rows are read at C speed (``map`` of
``attrgetter`` over the entries and tensors, ``zip`` into rows), and the vote needs no counting: with one device and
one dtype in the model a component's vote has one key at most, so what decides it is whether some tensor votes at
all, and the search stops at the first that does.

Everything ``tally`` fills is filled the same (rows, canonical pairs, non-persistent buffers, 16-bit computed
buffers, components with every parameter on meta, the summary group); the vote tables hold the one key each
(its counts are never read: ``Policy._components`` picks the only key of a one-key table). Anything else returns
None and ``tally``'s loop decides (tests/scan/test_tally_uniform.py compares the two on the zoo).
"""

from __future__ import annotations

from itertools import compress, islice, repeat
from operator import attrgetter, eq, is_
from typing import Any

import torch
from torch import nn

from torchdoctor._scan import intent
from torchdoctor._scan.apps import module_casts
from torchdoctor._scan.intent import STORAGE_DTYPES, packed_scale

__all__ = ["uniform_tally"]

_META = torch.device("meta")
_F32 = torch.float32
_BF16, _F16 = torch.bfloat16, torch.float16
_PLAIN = frozenset({torch.Tensor, nn.Parameter})
_TENSOR = attrgetter("tensor")
# what a row holds of the entry and of its tensor, read at C speed (one getter a field: a tuple getter and a
# transpose cost more)
_PATH, _ROLE, _MOVED, _ALIAS = (attrgetter(n) for n in ("path", "role", "moved_by_module_to", "alias_of"))
_DEVICE, _DTYPE, _SHAPE, _NBYTES = (attrgetter(n) for n in ("device", "dtype", "shape", "nbytes"))


def uniform_tally(policy: Any, summary: bool, votable: dict[torch.dtype, bool], scaled: dict[Any, bool]
                  ) -> tuple[list[dict[torch.device, list[Any]]], list[dict[torch.dtype, list[Any]]]] | None:
    """``tally`` for a one-device, one-dtype walk of one root component (see the module docstring), or None."""
    const = policy._const_ctx  # one component, the root, with no fp32 names, dispatch hooks or offloads
    entries = policy.w.entries
    n = len(entries)
    if const is None or not n:
        return None
    tensors = list(map(_TENSOR, entries))
    if not _PLAIN.issuperset(map(type, tensors)):
        return None
    try:  # a nested or sparse COO plain Tensor refuses its shape or nbytes: the loop describes it
        devs = list(map(_DEVICE, tensors))
        dts = list(map(_DTYPE, tensors))
        shapes = list(map(_SHAPE, tensors))
        nbytes = list(map(_NBYTES, tensors))
    except Exception:
        return None
    dev, dt = devs[0], dts[0]
    if dts.count(dt) != n or devs.count(dev) != n:  # dtypes are singletons; devices compare by value
        return None
    # a parameter's or buffer's entry always has its module (the walker reads them from modules' slots): what has
    # none (a tensor beside the component in a dict) has another role, which the loop skips before its module too
    paths, roles = list(map(_PATH, entries)), list(map(_ROLE, entries))
    moved, aliases = list(map(_MOVED, entries)), list(map(_ALIAS, entries))
    # every row shares one device object, as the loop's rows share one per run of a device
    rows = list(zip(paths, roles, repeat(dev, n), dts, shapes, nbytes, moved, aliases))
    canonical = aliases.count(None)
    if canonical == n:
        canon = list(zip(entries, rows))
        roles_c: Any = roles
    else:  # an alias (a tied weight's second path) has its row and nothing else
        keep = list(map(is_, aliases, repeat(None)))
        canon = list(compress(zip(entries, rows), keep))
        roles_c = list(compress(roles, keep))
        nbytes = list(compress(nbytes, keep))
    meta = dev == _META
    policy.rows, policy.canon = rows, canon
    # a model on meta has no storage to share: one summary group of every canonical tensor
    policy.groups = {(dev, dt): [canonical, sum(nbytes)]} if summary and meta else None
    comp = const[0]
    n_params = roles_c.count("parameter")
    policy.unloaded = {id(comp): (comp, n_params)} if meta and n_params >= 2 else {}
    nonpersistent = policy.nonpersistent
    if "buffer" in roles_c:  # the few buffers picked at C speed, in order, from the first (after the parameters)
        at = roles_c.index("buffer")
        for e, row in compress(islice(canon, at, None), map(eq, islice(roles_c, at, None), repeat("buffer"))):
            if e.key in (e.owner.__dict__.get("_non_persistent_buffers_set") or ()):
                nonpersistent.add(row[0])
                if dt is _BF16 or dt is _F16:  # a computed buffer in 16 bits: ``rounded`` reads these
                    policy.computed16.append(e)
    ok = votable.get(dt)
    if ok is None:
        ok = votable[dt] = dt.is_floating_point and dt not in STORAGE_DTYPES
    dev_vote = dt_vote = False
    if ok:
        # the layers that cast or move their weights per call: the policy's table where it was made, else the one
        # module asked (``apps.module_casts``: the same answer)
        casting, adapters, kbit = policy.__dict__.get("casting"), policy.adapter_of, policy.kbit
        norms = intent.NORM_TYPES
        for e, row in canon:  # the first tensor that votes decides; the loop's filters, in its order
            role = row[1]
            if role != "parameter" and role != "buffer" or not row[6] or (adapters and row[0] in adapters) or (
                    id(e.module) in casting if casting is not None else module_casts(e.module)):
                continue
            dev_vote = True
            if nonpersistent and row[0] in nonpersistent or (kbit and intent.follows_input(e)):
                continue
            key = e.key
            scale = scaled.get(key)
            if scale is None:
                if len(scaled) > 4096:
                    scaled.clear()
                scale = scaled[key] = type(key) is str and "scale" in key.lower()
            if scale and packed_scale(e):
                continue
            if dt is _F32:
                mod = e.module
                norm = norms.get(type(mod))
                if norm is None:
                    norm = intent.is_norm(mod)
                if norm:
                    continue
            dt_vote = True
            break
    # one key each: its counts decide nothing (``Policy._components`` takes a one-key table's key as it is)
    return [{dev: [set(), 0, 0]} if dev_vote and not meta else {}], [{dt: [set(), 0, 0]} if dt_vote else {}]

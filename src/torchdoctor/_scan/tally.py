"""The one pass over a walk's entries that every policy makes: each entry's row, the canonical entries, the
non-persistent buffers, each component's votes (device and dtype), the components whose weights are all on meta,
and, for scan, the summary by device and dtype when no tensor in it has a readable storage.

scan ran six passes after the walk (rows, canon, non-persistent buffers, votes, unloaded components, summary);
folding them into this loop is most of what makes a scan cost about what accelerate's own listing costs (issue 28).
A row is a tuple in ``TensorInfo``'s field order (``PATH`` .. ``ALIAS`` index it; the shape may still be a
``torch.Size``): the report builds its ``TensorInfo`` objects only when ``report.tensors`` is first read.
"""

from __future__ import annotations

from functools import partial
from itertools import compress
from operator import is_, itemgetter
from typing import Any

import torch
from torch import nn

from torchdoctor._scan import intent
from torchdoctor._scan.intent import STORAGE_DTYPES, packed_scale
from torchdoctor._scan.uniform import uniform_tally
from torchdoctor._walk import describe

# ``Policy`` (torchdoctor._scan.policy) calls in here; annotated ``Any`` so this module never imports the policy back.
Policy = Any

_META = torch.device("meta")
_F32 = torch.float32
_BF16, _F16 = torch.bfloat16, torch.float16
_PARAM = nn.Parameter
_TENSOR = torch.Tensor
_VOTABLE: dict[torch.dtype, bool] = {}  # dtype -> floating and not packed storage (dtypes are few)
_SCALE_KEYS: dict[str, bool] = {}  # tensor name -> has "scale" in it (names repeat across layers)
PATH, ROLE, DEVICE, DTYPE, SHAPE, NBYTES, MOVED, ALIAS = range(8)  # a row's fields, in TensorInfo's order
_ALIAS_OF, _is_none = itemgetter(ALIAS), partial(is_, None)


def row_of(e: Any) -> tuple[Any, ...]:
    """The row of an entry whose tensor is not a plain ``Tensor``/``Parameter`` (sizes may be symbolic: jagged
    nested tensors; sparse COO has no ``nbytes``), as ``Entry.info`` reads it."""
    t = e.tensor
    shape, nbytes = describe(t)
    return (e.path, e.role, t.device, t.dtype, shape, nbytes, e.moved_by_module_to, e.alias_of)


def _add(groups: dict[tuple[torch.device, torch.dtype], list[int]], key: tuple[Any, Any], n: int, nbytes: int) -> None:
    g = groups.get(key)
    if g is None:
        g = groups[key] = [0, 0]
    g[0] += n
    g[1] += nbytes


def tally(policy: Policy, summary: bool) -> tuple[list[dict[torch.device, list[Any]]], list[dict[torch.dtype, list[Any]]]]:
    """Fill ``policy.rows``, ``canon``, ``nonpersistent``, ``unloaded`` and (``summary``) ``groups``; return the
    vote tables per component (device and dtype -> [layers, tensors, bytes]), in ``policy.components`` order.
    A one-component walk on one device in one dtype is read at C speed (``uniform``); anything else by the loop."""
    got = uniform_tally(policy, summary, _VOTABLE, _SCALE_KEYS)
    return got if got is not None else tally_loop(policy, summary)


def tally_loop(policy: Policy, summary: bool) -> tuple[list[dict[torch.device, list[Any]]],
                                                       list[dict[torch.dtype, list[Any]]]]:
    """``tally`` entry by entry: any walk."""
    comps = policy.components
    devs: list[dict[torch.device, list[Any]]] = [{} for _ in comps]
    dts: list[dict[torch.dtype, list[Any]]] = [{} for _ in comps]
    index = {id(c): i for i, c in enumerate(comps)}
    counts: dict[int, list[Any]] = {}  # component -> [component, parameters, parameters on meta]
    groups: dict[tuple[torch.device, torch.dtype], list[int]] | None = {} if summary else None
    rows: list[Any] = []
    adapters, nonpersistent, votable = policy.adapter_of, policy.nonpersistent, _VOTABLE
    const, cache, ctx, prefixes, kbit = policy._const_ctx, policy._ctx_cache, policy.ctx, policy.fp32_prefixes, \
        policy.kbit
    scaled, casting, add_row = _SCALE_KEYS, policy.casting, rows.append
    # Reading a tensor's device makes a new object each time: rows share one per device (equal, fewer kept), and
    # what depends only on the device, the component or the group is carried from the previous entry while it holds.
    last_dev: Any = None
    meta = False
    last_comp: Any = None
    c: Any = None
    i = 0
    last_mod: Any = None  # the module of the entry before, its path, and what follows from them
    last_mp: Any = None
    comp: Any = None
    kept = cast = False
    norm: bool | None = None
    norms = intent.NORM_TYPES  # module class -> a normalisation layer (``intent.is_norm`` fills it)
    last_dt: Any = None
    ok: bool | None = False
    # Runs of entries with one key (a summary group, a component's device or dtype) are counted in locals and
    # added to their table when the key changes and at the end: a table read and two item updates per tensor
    # were a tenth of a scan after the walk.
    gdev: Any = None  # the summary group counted: (device, dtype), tensors, bytes
    gdt: Any = None
    gn = gb = 0
    dv: Any = None  # the device vote counted: component index, device, its vote, tensors, bytes, last layer
    dv_i = -1
    dv_dev: Any = None
    dn = db = 0
    dl: Any = None
    tv: Any = None  # the same for the dtype vote
    tv_i = -1
    tv_dt: Any = None
    tn = tb = 0
    tl: Any = None
    aliased = False
    entries = policy.w.entries
    for e in entries:
        t = e.tensor
        tp = type(t)
        info = None
        if tp is _PARAM or tp is _TENSOR:
            try:  # nested and sparse COO tensors are plain Tensors too: their shape or nbytes refuse
                dev, dt, shape, nbytes = t.device, t.dtype, t.shape, t.nbytes  # nbytes: numel * itemsize, one call
                if dev == last_dev:
                    dev = last_dev
                else:
                    last_dev, meta = dev, dev == _META
                info = (e.path, e.role, dev, dt, shape, nbytes, e.moved_by_module_to, e.alias_of)
            except Exception:
                pass
        if info is None:
            info = row_of(e)
            dev, dt, shape, nbytes = info[2], info[3], info[4], info[5]
            last_dev, meta = dev, dev == _META
        add_row(info)
        if info[7] is not None:
            aliased = True
            continue
        if groups is not None:
            # a storage is counted once (tied weights, views): that needs its storage, read apart from any
            # function mode (``ScanReport`` fills it in then); meta and virtual tensors have none to share
            if meta or hasattr(tp, "_td_device"):
                if dev is not gdev or dt is not gdt:
                    if gn:
                        _add(groups, (gdev, gdt), gn, gb)
                    gdev, gdt, gn, gb = dev, dt, 0, 0
                gn += 1
                gb += nbytes
            else:
                groups = None
        role = info[1]
        if role != "parameter":
            if role != "buffer":
                continue
            if e.key in (e.owner.__dict__.get("_non_persistent_buffers_set") or ()):
                nonpersistent.add(info[0])
                if dt is _BF16 or dt is _F16:  # a computed buffer in 16 bits: ``rounded`` reads these
                    policy.computed16.append(e)
        mod = e.module
        if mod is None:
            continue
        mp = e.module_path
        if mod is not last_mod or mp is not last_mp:  # a module's tensors come together: its facts read once
            last_mod, last_mp, norm = mod, mp, None
            comp, kept, _ = const or cache.get(mp) or ctx(mp)
            cast = casting and id(mod) in casting
        if comp is None:
            continue
        if comp is not last_comp:
            last_comp, i = comp, index[id(comp)]
            c = counts.get(id(comp))
            if c is None:
                c = counts[id(comp)] = [comp, 0, 0]
        if role == "parameter":
            c[1] += 1
            c[2] += meta
        if cast:
            continue
        if dt is not last_dt:
            last_dt = dt
            ok = votable.get(dt)
            if ok is None:
                ok = votable[dt] = dt.is_floating_point and dt not in STORAGE_DTYPES
        if not ok or not info[6] or (adapters and info[0] in adapters):
            continue
        if tp is not _PARAM and tp is not _TENSOR and intent.packed_param(t):
            continue  # packed 4-bit data stored in a float dtype: no vote
        if kept or (dt is _F32 and prefixes and policy._fp32_kept(e)):
            continue
        # one vote per layer (module) holding compute weights (>= 2 dims), then tensors, then bytes: a single
        # large tensor (an upcast tied embedding) cannot swing a component; vectors decide only where no layer does
        layer = id(mod) if role == "parameter" and len(shape) >= 2 else None
        if not meta:
            if dev is not dv_dev or i != dv_i:
                if dv is not None:
                    dv[1] += dn
                    dv[2] += db
                dv_i, dv_dev, dn, db, dl = i, dev, 0, 0, None
                dv = devs[i].get(dev)
                if dv is None:
                    dv = devs[i][dev] = [set(), 0, 0]
            if layer is not None and layer != dl:
                dv[0].add(layer)
                dl = layer
            dn += 1
            db += nbytes
        if nonpersistent and info[0] in nonpersistent or (kbit and intent.follows_input(e)):
            continue
        key = e.key  # a parameter's or buffer's name: a dict key (hashable), nearly always a str
        scale = scaled.get(key)
        if scale is None:
            if len(scaled) > 4096:
                scaled.clear()
            scale = scaled[key] = type(key) is str and "scale" in key.lower()
        if scale and packed_scale(e):
            continue
        if dt is _F32:
            if norm is None:
                norm = norms.get(type(mod))
                if norm is None:
                    norm = intent.is_norm(mod)
            if norm:
                continue
        if dt is not tv_dt or i != tv_i:
            if tv is not None:
                tv[1] += tn
                tv[2] += tb
            tv_i, tv_dt, tn, tb, tl = i, dt, 0, 0, None
            tv = dts[i].get(dt)
            if tv is None:
                tv = dts[i][dt] = [set(), 0, 0]
        if layer is not None and layer != tl:
            tv[0].add(layer)
            tl = layer
        tn += 1
        tb += nbytes
    if groups is not None and gn:
        _add(groups, (gdev, gdt), gn, gb)
    if dv is not None:
        dv[1] += dn
        dv[2] += db
    if tv is not None:
        tv[1] += tn
        tv[2] += tb
    # the canonical (entry, row) pairs, made at C speed: every entry has its row, an alias's is left out
    canon = list(zip(entries, rows)) if not aliased else list(compress(zip(entries, rows), map(_is_none, map(
        _ALIAS_OF, rows))))
    policy.rows, policy.canon, policy.groups = rows, canon, groups
    # components whose parameters are all on meta (at least two): a model built without weights, one summary each
    policy.unloaded = {k: (v[0], v[1]) for k, v in counts.items() if v[1] >= 2 and v[1] == v[2]}
    return devs, dts


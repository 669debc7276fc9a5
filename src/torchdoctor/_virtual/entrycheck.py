"""A fix that casts or moves a whole component (``model.text_encoder.to(torch.bfloat16)``) or a module the program
holds apart (``self._cn.to('cuda:0')``), proven at the entries of its torch layers as well as at the failing op: a
layer computes with what it is given, so a tensor given from outside the component that the fix leaves as it was
(the caller's float32 input of an encoder now in bfloat16, a control image still on the cpu) would fail there next.
Such a tensor joins the fix with its own (its argument cast, or its factory given ``device=`` / ``dtype=``), and the
fix is proven with it; one that cannot be named leaves the fix unproven, saying which layer would fail.

A block (``torchdoctor run``, the marker) cannot re-run the program; this is how its verdict agrees with the one a
re-run gives ``simulate``.
"""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor._placement import device_str, dtype_str
from torchdoctor._virtual.prove import Fix


def targets(o: Any, fix: Fix) -> list[Any]:
    """What ``fix`` sets on operand ``o``: devices and dtypes, in order (nothing when it does not name it)."""
    out: list[Any] = []
    for tag, target in fix.sets:
        if tag == "*":  # the model moved or cast as a whole: its tensors (a cast: its floating ones)
            if o.named:
                out.extend(x for x in (target if isinstance(target, tuple) else (target,))
                           if not isinstance(x, torch.dtype) or o.meta.is_floating_point())
        elif tag in o.tags or (tag.endswith(".") and any(t.startswith(tag) for t in o.tags)):
            # a far argument's or factory's dtype: the ops between may promote it back (a bf16 timestep times fp32
            # frequencies), so only a re-run judges it
            out.extend(x for x in (target if isinstance(target, tuple) else (target,))
                       if not (tag in o.far and isinstance(x, torch.dtype)))
    return out


def _covered(fix: Fix, entries: dict[str, tuple[int, list[Any]]]) -> tuple[str, list[str]] | None:
    """(the component's prefix, the layer paths inside it) of a component or held-apart fix, else None."""
    names = [n for n, _ in fix.sets]
    if fix.kind == "apart":  # the module's own tensor paths: the layers holding them
        layers = sorted({n.rsplit(".", 1)[0] for n in names if "." in n} & set(entries))
        return ("", layers) if layers else None
    prefix = next((n for n in names if n.endswith(".") and n != "*"), None)
    if fix.kind == "path" and prefix is None and names and "*" not in names and \
            all(isinstance(t, torch.device) for _, t in fix.sets):
        # tensors of torch layers moved one by one (``model.seg.conv.weight.data = ….to('xpu:0')``): each layer then
        # computes on that device with what it is given, which the program may place elsewhere (its own device
        # variable): checked at those layers' entries as a component's are
        layers = sorted({n.rsplit(".", 1)[0] for n in names if "." in n} & set(entries))
        return ("", layers) if layers else None
    if fix.kind != "path" or prefix is None or len(names) != 1:
        return None
    layers = [p for p in entries if p.startswith(prefix) or p == prefix[:-1]]
    return (prefix, layers) if layers else None


def _wrong(o: Any, wants: tuple[Any, ...], prefix: str, fixes: list[Fix], name: str = "",
           own: frozenset[str] = frozenset()) -> str | None:
    """What is wrong with operand ``o`` once ``wants`` apply to the layer it is given to (None: nothing). ``name``:
    the module the fix casts, as the program names it (an input cast to ``name.dtype`` at the program's line follows
    the fix: ``latents.to(controlnet.dtype)``); ``own``: its tensors' paths (what they alone made follows it too)."""
    if prefix and any(t.startswith(prefix) for t in o.tags):
        return None  # made inside the component: the fix changes it too
    changed = [t for f in fixes for t in targets(o, f)]
    for want in wants:
        if isinstance(want, torch.dtype) and o.meta.dtype != want and o.meta.is_floating_point() and \
                not any(isinstance(t, torch.dtype) and t == want for t in changed) and not _follows(o, name, own):
            return f"{dtype_str(o.meta.dtype)}, not {dtype_str(want)}"
        if isinstance(want, torch.device) and o.device != want and o.meta.dim() > 0 and \
                not any(isinstance(t, torch.device) and t == want for t in changed):
            return f"on {device_str(o.device)}, not {device_str(want)}"
    return None


def _follows(o: Any, name: str, own: frozenset[str]) -> bool:
    """``o`` was made from the module's own tensors alone (``own``), or cast at the program's line to the dtype of
    the module ``name`` (``x.to(controlnet.dtype)``)."""
    if not name:
        return False
    if o.tags and all(t.removeprefix("far ") in own for t in o.tags):
        return True
    from torchdoctor._virtual.castsites import SITES

    for tag in o.tags:
        at = tag.removeprefix("far ")
        site = SITES.get(at[8:]) if at.startswith("cast at ") else None
        if site is not None and f"{name}.dtype" in site.cast.replace(" ", ""):
            return True
    return False


def _joined(o: Any, want: tuple[Any, ...]) -> Fix | None:
    """The fix of a tensor given to the component from outside it: its argument cast, or its factory fixed."""
    from torchdoctor._guard.maps import value_code
    from torchdoctor._virtual.fixes import factory_fix

    target = want if len(want) > 1 else want[0]
    for tag in o.tags:
        if tag.startswith(("input ", "kwarg ")) and not any(isinstance(t, torch.device) for t in want):
            return Fix(f"# pass {tag} as tensor.to({value_code(target)})", "input", target, tag,
                       sets=((tag, target),))
        if tag.startswith("factory ") and " at " in tag:
            wrong = {("device" if isinstance(t, torch.device) else "dtype"): (
                device_str(o.device) if isinstance(t, torch.device) else dtype_str(o.meta.dtype), t) for t in want}
            return factory_fix(tag, wrong)
    return None


def entry_check(fixes: list[Fix], entries: dict[str, tuple[int, list[Any]]]) -> None:
    """Each proven component or held-apart fix, checked at its layers' entries; ``fixes`` gains the fixes of what
    they are given from outside, or the fix becomes unproven."""
    have = {f.code for f in fixes}
    for f in list(fixes):
        cover = _covered(f, entries) if f.proven else None
        if cover is None:
            continue
        prefix, layers = cover
        want = f.target if isinstance(f.target, tuple) else (f.target,)
        if all(w is None for w in want):  # a fix by tensors: what it sets on them
            want = tuple(dict.fromkeys(t for _, t in f.sets if isinstance(t, (torch.device, torch.dtype))))
        for layer in layers:
            if not any(x is f for x in fixes):  # replaced by the move of its module's output
                break
            for o in entries[layer][1]:
                wrong = _wrong(o, want, prefix, fixes, f.code.split(".to(", 1)[0] if f.kind == "apart" else "",
                               frozenset(n for n, _ in f.sets))
                if wrong is None:
                    continue
                extra = _joined(o, tuple(t for t in want if t is not None))
                if extra is None and f.kind == "apart" and isinstance(f.target, torch.device):
                    from torchdoctor._virtual.handout import hand_out  # kept there with its inputs: its output moved

                    if hand_out(fixes, f, layer, wrong):
                        break
                if extra is None:
                    f.proven = False
                    f.tried = (f"{f.tried}; but {layer} would then be given a tensor {wrong} (from outside it, not "
                               "named: fix it where it is made)")[:400]
                    break
                if extra.code not in have:
                    have.add(extra.code)
                    extra.at_op, extra.proven = True, True
                    extra.tried = f"at the entry of {layer}: what it is given from outside, made as the fix leaves it"
                    fixes.append(extra)
                    f.tried = f"{f.tried}; and at the entry of {layer}, with what it is given fixed too"[:400]

"""``explain``: from a device/dtype error message, an exception or a whole log to causes and fixes.

The log is read in blocks; every signature anchor is found in a few literal-first passes (``prefilter``), and
only the lines around a hit are looked at, so time is linear in the input and memory is bounded by the block
size. Identical errors (a ComfyUI ``!!! Exception during processing !!!`` line and its traceback's last
line, or the same failure repeated) become one diagnosis. Torch-free: nothing here imports torch.

>>> report = explain("RuntimeError: Expected all tensors to be on the same device, but found at least two "
...                  "devices, cuda:0 and cpu! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)")
>>> report[0].category, report[0].fixes[0][1]
('device_mismatch', 'model.to("cuda:0")')
>>> [a.category for a in report[0].alternatives]
['quantization_device', 'mixed_device_model']
>>> classify("Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same")
'input_weight_type_mismatch'
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

from torchdoctor._explain.apps import app_fixes, step_fixes
from torchdoctor._explain.backends import forget as forget_backends
from torchdoctor._explain.catalog import causes, context_rules
from torchdoctor._explain.context import derive, find_word, lookup, rank
from torchdoctor._explain.fill import fill as _render
from torchdoctor._explain.fill import forget
from torchdoctor._explain.fill import fill_or_none as _try
from torchdoctor._explain.inplace import Text, feed_span
from torchdoctor._explain.plugins import line_fixes, plugin_fields, plugin_fixes
from torchdoctor._explain.prose import forget as forget_lines
from torchdoctor._explain.report import SCHEMA, Alternative, Diagnosis, ExplainReport, render, to_json
from torchdoctor._explain.scanner import BLOCK, Group, Scanner, clean
from torchdoctor._explain.sigs_frames import WEAK_PREFIXES
from torchdoctor._explain.sigs_own import PREFIX as OWN
from torchdoctor._explain.sigs_own import own_fields

__all__ = ["Alternative", "Diagnosis", "ExplainReport", "SCHEMA", "best_fix", "classify", "explain",
           "explain_stream", "install_excepthook", "render", "to_json"]

log = logging.getLogger("torchdoctor.explain")
_RULE_SPAN = 12_000  # characters of context (before and after the error line) the rules read, per occurrence
def _diagnose(group: Group) -> Diagnosis:
    sig = group.sig
    # the first occurrence is enough (repeats bring the same frames); the frames that decide sit near the error
    original = "\n".join(c[-_RULE_SPAN:] for c in group.contexts[:1]) or group.message
    # each distinct line once, in order of first appearance: a log repeats its lines (progress bars, warnings), and
    # what is read here is whether a word (none spans a line) or a version occurs, and the first line holding it;
    # a word looked up in 12,000 characters was most of a diagnosis
    original = "\n".join(dict.fromkeys(original.split("\n")))
    context = original.lower().replace("\\", "/")
    fields, flags = derive(sig.name, group.fields, group.message, context)
    fields.update(plugin_fields(original))
    own_report = sig.name.startswith(OWN)
    if own_report:  # torchdoctor's own report: its fix block and proof, from the message's first line on
        at = original.find(group.message.split("\n", 1)[0])
        fields.update(own_fields(original[at:] if at != -1 else group.message, fields,
                                 "dtype" if sig.category == "dtype_mismatch" else "device"))
    rules = context_rules()
    look = lookup(context, rules)  # words found or not in the context: the rules' first, the app's after them
    categories, ranked, fired = rank(sig.category, sig.causes, sig.alternatives, context, flags, rules,
                                     group.message.lower().replace("\\", "/"), look)
    category = categories[0][0]
    table = causes()
    # each cause whose text the fields fill, with that text (the first four, one for torchdoctor's own report)
    usable = [(c, text) for c, _ in ranked if c in table and (text := _try(table[c].text, fields)) is not None]
    if not usable:  # the winning category has no cause of its own here: keep the signature's
        usable = [(c, text) for c, _ in sig.causes if c in table and (text := _try(table[c].text, fields)) is not None]
    usable = usable[:1] if own_report else usable[:4]  # torchdoctor named the culprit: no other cause
    likely = tuple(text for _, text in usable)
    fixes: list[tuple[str, str]] = []
    first = 0  # how many fixes the first cause gave: a plugin's update / disable steps follow them
    for cid, _ in usable:
        for title, code in table[cid].fixes:
            if len(fixes) >= 6:  # (six at most: the rest is not filled)
                break
            t, c = _try(title, fields), _try(code, fields, prose=False)
            if t is not None and c is not None and all(c != code for _, code in fixes):
                fixes.append((t, c))
        first = first or len(fixes)
    # the plugin whose frame ran the failing code, named in its own update and disable steps (issue 42, point 5)
    steps = plugin_fixes(fields)
    if steps:  # its update where a cause already gave it, or after the first cause's fixes; its disable step next
        at = next((i + 1 for i, (_, code) in enumerate(fixes) if code == steps[0][1]), first)
        fixes[at:at] = [f for f in steps if all(f[1] != code for _, code in fixes)]
    if not fixes:  # never a diagnosis without something to do
        fixes.append(("Check what this environment provides", "torchdoctor env"))
    # an app's user rarely edits the app's code: its own flag or setting comes first, the generic fix after it
    # a layer on another device (not another dtype) takes the app's placement fix, not its precision one
    as_app = "device_mismatch" if "iw_device" in flags and "iw_dtype" not in flags else category
    app, own = app_fixes(as_app, context, flags, look)
    if own_report:  # the culprit is named: an app's precision or placement switch is not the fix
        own = ()
    if "plugin" in fields:  # a plugin's frame ran the failing code: its fix first, the app's flags after it
        fixes.extend(f for f in own if f not in fixes)
    else:
        fixes[:0] = [f for f in own if f not in fixes]
    if app is None:  # a bare paste: the app that runs this step itself is a likely source
        fixes.extend(f for f in step_fixes(sig.name, context, look) if f not in fixes)
    fixes[:0] = [f for f in line_fixes(sig.name, original) if f not in fixes]  # at the traceback's own line
    if not likely:
        likely = (f"{sig.title}.",)
    top = table[usable[0][0]] if usable else None
    confidence = sig.confidence - (0.15 if not group.fields and sig.patterns else 0.0)
    if category != sig.category:
        confidence -= 0.05
    if top and any(top.id == c for rule, _ in fired for c, w in rule.boosts if w > 0):
        confidence += 0.05
    confidence = round(min(0.99, max(0.05, confidence)), 3)
    best = categories[0][1] or 1.0
    alternatives = tuple(Alternative(c, round(min(confidence - 0.01, confidence * s / best), 3),
                                     why or f"the message also fits {c.replace('_', ' ')}")
                         for c, s, why in categories[1:4] if s > 0)
    evidence = list(group.evidence)
    plugin_line = fields.get("plugin_line")
    if plugin_line and plugin_line not in evidence:  # the plugin that ran the failing code, whatever the category
        evidence.append(clean(plugin_line, 200))
    lines: list[str] = []  # the original's lines, split once
    for rule, word in fired:
        if word and len(evidence) < len(group.evidence) + 3:
            line = _context_line(original, context, word, lines)
            if line and not any(line[:60] in e or e[:60] in line for e in evidence):
                evidence.append(line)
    confirm = (_try(top.confirm, fields, prose=False) if top else None) or "torchdoctor env"
    return Diagnosis(category=category, title=sig.title, what_happened=_render(sig.what, fields),
                     likely_causes=likely, fixes=tuple(fixes), confirm_with=confirm, confidence=confidence,
                     evidence=tuple(evidence), signature=sig.name, count=group.count, alternatives=alternatives)


def _context_line(original: str, context: str, word: str, lines: list[str]) -> str:
    """The line of the original text (not the lower-cased copy) where a context word was found; ``lines``: the
    original's lines (filled here when empty)."""
    p = find_word(context, word)
    if p == -1:
        return ""
    if not lines:
        lines.extend(original.split("\n"))
    n = context.count("\n", 0, p)
    return clean(lines[n], 200) if n < len(lines) else ""


def _exception_text(exc: BaseException) -> str:
    """The chain oldest first, like Python prints it: frames (file, function, class of ``self``), then the message."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen and len(chain) < 16:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ if e.__cause__ is not None else (None if e.__suppress_context__ else e.__context__)
    parts: list[str] = []
    for e in reversed(chain):
        tb, n = e.__traceback__, 0
        parts.append("Traceback (most recent call last):")
        while tb is not None and n < 200:
            code = tb.tb_frame.f_code
            owner = ""
            try:
                obj = tb.tb_frame.f_locals.get("self")
                if obj is not None:
                    owner = f"  [{type(obj).__module__}.{type(obj).__qualname__}]"
            except Exception:  # a frame we cannot look at is no reason to fail
                owner = ""
            parts.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}{owner}')
            tb, n = tb.tb_next, n + 1
        try:
            message = str(e)
        except Exception:
            message = "<unprintable message>"
        parts.append(f"{type(e).__qualname__}: {message}")
        parts.extend(str(note) for note in getattr(e, "__notes__", ()) or ())
    return "\n".join(parts)


def _blocks(source: str | IO[str]) -> Iterable[str]:
    if isinstance(source, str):  # its blocks are read in place (``inplace``); iterated, its slices
        return Text(source)
    return _stream_blocks(source)


def _stream_blocks(source: IO[str]) -> Iterator[str]:
    while True:
        block = source.read(BLOCK)
        if not block:
            return
        yield block


def _explain_blocks(blocks: Iterable[str], limit: int | None) -> list[Diagnosis]:
    # The cyclic GC is paused while a text is read: a long log makes objects faster than they die (one per hit
    # line), and each full collection that triggers walks the caller's whole heap (~360k objects with torch and
    # transformers loaded, ~0.2 s each), so time per MB grew with the input. What explain makes is freed by
    # reference counting; the GC is restored as it was, also on errors.
    was = gc.isenabled()
    gc.disable()
    try:
        return _explain_paused(blocks, limit)
    finally:
        if was:
            gc.enable()


def _merge_shorter(groups: list[Group]) -> list[Group]:
    """One error printed twice, once short (ComfyUI's "!!! Exception during processing !!! <message>" header, a
    logger's one-line record) and once in full at the end of its traceback ("... (when checking argument for
    argument tensors in method wrapper_CUDA_cat)"), is one diagnosis: of two errors of one signature met one right
    after the other, the one whose fields are a proper subset of the other's is folded into it."""
    seq = sorted(groups, key=lambda g: g.last)
    drop: set[int] = set()
    for short, full in zip(seq, seq[1:]):
        if short.sig is not full.sig or id(short) in drop:
            continue
        if full.fields.items() < short.fields.items():
            short, full = full, short
        if short.fields.items() < full.fields.items() and _said_again(short, full):
            full.count += short.count
            full.last = max(full.last, short.last)
            drop.add(id(short))
    return [g for g in groups if id(g) not in drop] if drop else groups


def _said_again(short: Group, full: Group) -> bool:
    """Whether the short record's message, from its signature's anchor on, is also in the full one."""
    line = short.message.split("\n", 1)[0].lower()
    at = min((p for p in (line.find(a) for a in short.sig.anchors) if p != -1), default=-1)
    return at != -1 and line[at:].strip() in " ".join(full.message.lower().split())


def _explain_paused(blocks: Iterable[str], limit: int | None) -> list[Diagnosis]:
    forget()
    forget_backends()
    forget_lines()
    scanner = Scanner()
    if isinstance(blocks, Text):  # a string: its blocks read in place
        text = blocks.text
        for i in range(0, len(text), BLOCK):
            feed_span(scanner, text, i, min(i + BLOCK, len(text)))
    else:
        for block in blocks:
            scanner.feed(block)
    scanner.feed("", final=True)
    groups = list(scanner.groups.values())
    if any(not g.sig.name.startswith(WEAK_PREFIXES) for g in groups):  # frames speak only when no message does
        groups = [g for g in groups if not g.sig.name.startswith(WEAK_PREFIXES)]
    order = sorted(_merge_shorter(groups), key=lambda g: -g.last)
    out: list[Diagnosis] = []
    for group in order[:1000]:
        try:
            out.append(_diagnose(group))
        except Exception:  # one confusing error must not hide the others
            log.debug("explain: could not diagnose %s", group.sig.name, exc_info=True)
    out.sort(key=lambda d: -d.confidence)  # stable: equally sure errors keep "latest first"
    return out[:limit] if limit is not None else out


def explain(text_or_exception: object, *, limit: int | None = None) -> ExplainReport:
    """Diagnoses for an error message, a whole log or an exception, best first, as an ``ExplainReport`` (a
    sequence of ``Diagnosis``; false when nothing was recognised). Never raises.

    An exception contributes its message, its ``__cause__``/``__context__`` chain and its traceback frames;
    frames and words around an error (bitsandbytes, peft, IPEX, accelerate, offloading, ComfyUI ...) rank causes.

    >>> log = '''  File "/site-packages/bitsandbytes/autograd/_functions.py", line 462, in forward
    ... RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!'''
    >>> d = explain(log)[0]
    >>> d.category, d.confirm_with
    ('quantization_device', 'torchdoctor.scan(model, device="cuda:0")')
    >>> d.alternatives[0].category
    'device_mismatch'
    >>> report = explain("all fine")
    >>> report.ok, len(report), bool(report)
    (True, 0, False)
    """
    try:
        if isinstance(text_or_exception, BaseException):
            text = _exception_text(text_or_exception)
        elif isinstance(text_or_exception, (bytes, bytearray)):
            text = bytes(text_or_exception).decode("utf-8", errors="replace")
        elif isinstance(text_or_exception, str):
            text = text_or_exception
        else:
            text = str(text_or_exception)
        if not text or text.isspace():  # (not ``strip``: a log that ends with a line end would be copied whole)
            return ExplainReport(nothing_to_check=True)
        return ExplainReport(tuple(_explain_blocks(_blocks(text), limit)))
    except Exception:  # explaining must never crash the caller
        return ExplainReport()


def explain_stream(source: IO[str], name: str | None = None) -> ExplainReport:
    """``explain`` over a text stream read in blocks (a file, stdin): memory stays bounded by the block size."""
    seen = [False]

    def blocks() -> Iterator[str]:
        for block in _blocks(source):
            seen[0] = seen[0] or not block.isspace() and block != ""
            yield block

    try:
        found = tuple(_explain_blocks(blocks(), None))
        return ExplainReport(found, name, nothing_to_check=not seen[0])
    except OSError:  # an unreadable file is the caller's to report
        raise
    except Exception:  # a stream that fails half-way still must not crash the caller
        return ExplainReport((), name)


def classify(message: str) -> str | None:
    """The category of one error message, or None. Cheap; for ``guard``.

    >>> classify("RuntimeError: mixed dtype (CPU): expect parameter to have scalar type of Float")
    'dtype_mismatch'
    """
    try:
        # torchdoctor's own report is not an error for guard to explain again (it would wrap its own PlacementError),
        # nor is bitsandbytes refusing a dtype it quantizes: no operand of the failing op is on the wrong side
        found = [d for d in _explain_blocks([message[:20_000]], 3)
                 if not d.signature.startswith(OWN) and d.signature != "quant.bnb_requantize"]
        return found[0].category if found else None
    except Exception:
        return None


def best_fix(message: str) -> tuple[str, str] | None:
    """``(title, code)`` of the best fix for one error message, or None.

    >>> best_fix("TypeError: Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't "
    ...          "support float64. Please use float32 instead.")
    ('Cast to float32 before moving to mps', 't = t.to(torch.float32).to("mps")')
    """
    try:
        found = _explain_blocks([message[:20_000]], 1)
        return found[0].fixes[0] if found and found[0].fixes else None
    except Exception:
        return None


def _report(exc: BaseException, stream: IO[str] | None = None) -> None:
    found = explain(exc, limit=3)
    if found:
        out = stream or sys.stderr
        print("\n" + render(found), file=out)


def install_excepthook() -> None:
    """Add the explanation to uncaught exceptions (``sys.excepthook``, and IPython's when it is running).

    Installing twice is harmless; the previous hook still prints the traceback first.

    >>> saved = sys.excepthook
    >>> install_excepthook()
    >>> sys.excepthook is not saved
    True
    >>> sys.excepthook = saved
    """
    previous = sys.excepthook
    if not getattr(previous, "_torchdoctor", False):
        def hook(etype: type[BaseException], value: BaseException, tb: Any) -> None:
            previous(etype, value, tb)
            try:
                _report(value)
            except Exception:
                pass

        hook._torchdoctor = True  # type: ignore[attr-defined]
        sys.excepthook = hook
    ipython_mod = sys.modules.get("IPython")
    shell = getattr(ipython_mod, "get_ipython", lambda: None)() if ipython_mod else None
    if shell is not None and not getattr(shell, "_torchdoctor_hooked", False):
        def custom(self: Any, etype: type[BaseException], value: BaseException, tb: Any,
                   tb_offset: int | None = None) -> None:
            self.showtraceback((etype, value, tb), tb_offset=tb_offset)
            _report(value, sys.stdout)

        shell.set_custom_exc((Exception,), custom)
        shell._torchdoctor_hooked = True

"""torchdoctor's own texts read back: a ``PlacementError`` / ``PlacementWarning`` (guard), a virtual-device run's
report, or guard's explanation of an escaping error, as an app logged it after catching it.

They already name the culprit, its dtype or device and the fix; explain reports that problem (the culprit's path,
the fix as printed, with its proof) instead of falling through to "no known error". The signatures are data like
the others; ``own_fields`` reads the fix block, which the patterns cannot (they see a window with its line ends
squeezed). Torch-free.
"""

from __future__ import annotations

import re

from torchdoctor._explain.causes import define_cause as _c
from torchdoctor._explain.signatures import define as _sig

__all__ = ["PREFIX", "own_fields"]

PREFIX = "own."
_PATH = r"[\w.\[\]'\"-]{1,200}"
_VAL = r"[\w:.']{1,40}"
_COMPACT = r"\w{1,12}\[[\d, ]{0,60}\]@[\w:]{1,12}"


def _patterns(kind: str) -> tuple[str, ...]:
    # the culprit lines first (the first pattern that gives a field wins), then the headlines
    return (rf"culprit (?P<culprit>{_PATH}) = [^:]{{1,80}}: (?P<compact>{_COMPACT}) \(expected (?P<expected>{_VAL})\)",
            rf"culprit (?P<culprit>{_PATH}): \S{{1,80}} is (?P<found>{_VAL}), expected (?P<expected>{_VAL})",
            rf"{kind} mismatch caused by `(?P<culprit>[^`\s]{{1,200}})` \((?P<found>{_VAL}), expected "
            rf"(?P<expected>{_VAL})\)",
            rf"{kind} problem in `(?P<module>[^`\s]{{0,200}})`(?: \([\w.]{{1,80}}\))? at (?P<op>[\w.:]{{1,120}}): "
            rf"(?P<culprit>{_PATH}) is (?P<found>{_VAL}), expected (?P<expected>{_VAL})",
            rf"placement problem\(s\) on virtual (?P<target>[\w:]{{1,20}}), first in .{{0,200}}?: {kind} "
            rf"(?P<culprit>{_PATH}) (?P<compact>{_COMPACT})",
            rf"{kind} problem in (?:`(?P<module>[^`\s]{{0,200}})`(?: \((?P<mtype>[\w.]{{1,80}})\))?|no module) at "
            rf"(?P<op>[\w.:]{{1,120}}): (?P<arg>arg \d{{1,2}} \(\w{{1,40}}\)|{_PATH}) (?:is|are) (?P<found>{_VAL}), "
            rf"expected (?P<expected>{_VAL})",
            rf"it surfaced in `(?P<module>[^`\s]{{0,200}})`", rf"{kind} mismatch in `(?P<module>[^`\s]{{0,200}})`")


_WHAT = ("torchdoctor reported this problem itself (guard or a virtual-device run, caught and logged by the program)"
         "[: {subject} {state}][, expected {want}][, read by `{module}`][ at {op}].")
_sig("own.dtype", "dtype_mismatch", "torchdoctor's own report of a dtype problem",
     ("dtype problem in ", "dtype mismatch caused by `", "dtype mismatch in `", "placement problem(s) on virtual"),
     _WHAT, (("dt.own_report", 10.0),), *_patterns("dtype"), require_pattern=True, follow=8, confidence=0.97,
     before=40, after=3000)
_sig("own.device", "device_mismatch", "torchdoctor's own report of a device problem",
     ("device problem in ", "device mismatch caused by `", "device mismatch in `", "meta problem in ",
      "placement problem(s) on virtual"),
     _WHAT, (("dev.own_report", 10.0),), *_patterns("(?:device|meta)"), require_pattern=True, follow=8,
     confidence=0.97, before=40, after=3000)

_GUARD = "with torchdoctor.guard(model):\n    model(*inputs)"
_c("dt.own_report",
   "The tensor torchdoctor named[, {subject},] is[ {found}, not] in the dtype the rest of the op uses[ "
   "({want})]: apply the fix it printed with the report.", _GUARD,
   ("The fix torchdoctor printed with the report[ ({proof})]", "{fix}"),
   ("Cast the culprit to the dtype the op expected[ ({want})]", "{culprit_fix}"),
   ("Re-run under guard for the culprit, the line that made it and a proven fix", _GUARD))
_c("dev.own_report",
   "The tensor torchdoctor named[, {subject},] is[ on {found}, not] on the device the rest of the op uses[ "
   "({want})]: apply the fix it printed with the report.", _GUARD,
   ("The fix torchdoctor printed with the report[ ({proof})]", "{fix}"),
   ("Move the culprit to the device the op expected[ ({want})]", "{culprit_fix}"),
   ("Re-run under guard for the culprit, the line that made it and a proven fix", _GUARD))

_COMPACT_DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "i64": "int64",
               "i32": "int32", "u8": "uint8", "i8": "int8", "b8": "bool"}
_INLINE_FIX = re.compile(r"fix \((proven|unproven[^)]{0,120})\): (.{1,400})")
_DOTTED = re.compile(r"[A-Za-z_][\w]{0,80}(?:\.[A-Za-z_0-9][\w]{0,80}){0,30}")


def own_fields(message: str, fields: dict[str, str], kind: str) -> dict[str, str]:
    """What the patterns cannot read from one of torchdoctor's reports: the fix block under ``Fix:`` (or a
    warning's inline ``fix (proven): ...``), its proof, the culprit's dtype from its compact form, and a fix built
    from the culprit line when the logged text stops before the fix.

    >>> own_fields("dtype problem in `p` (Conv2d) at aten.convolution.default: ...\\n  culprit p.bias = arg 2 "
    ...            "(bias): f32[8]@cpu  (expected bfloat16)", {"culprit": "p.bias", "expected": "bfloat16",
    ...            "compact": "f32[8]@cpu"}, "dtype")["culprit_fix"]
    'model.p.bias.data = model.p.bias.data.to(torch.bfloat16)'
    """
    out: dict[str, str] = {}
    lines = message.split("\n")[:200]
    for i, line in enumerate(lines):
        if line.strip() == "Fix:":
            code = []
            for nxt in lines[i + 1:i + 30]:
                if not nxt.startswith("    ") or nxt.lstrip().startswith("# fix proven"):
                    break
                code.append(nxt[4:].rstrip())
            if code:
                out["fix"] = "\n".join(code)
            break
    for line in lines:
        s = line.strip()
        m = _INLINE_FIX.search(s)
        if m and "fix" not in out:
            out["fix"], out["proof"] = m.group(2).strip(), m.group(1)
        elif s.startswith(("fix proven", "# fix proven")) and "proof" not in out:
            out["proof"] = "proven on the failing op"
        elif s.startswith("fix unproven") and "proof" not in out:
            out["proof"] = "unproven"
    compact, found = fields.get("compact", ""), fields.get("found", "")
    if not found and compact:
        found = (_COMPACT_DT.get(compact.partition("[")[0]) if kind == "dtype" else compact.rpartition("@")[2]) or ""
    culprit, expected = fields.get("culprit", ""), (fields.get("expected") or fields.get("target", "")).strip("'")
    arg = re.fullmatch(r"arg \d{1,2} \((weight|bias)\)", fields.get("arg", ""))
    if not culprit and arg and fields.get("module"):  # the failing module's own parameter, named by the op's schema
        culprit = f"{fields['module']}.{arg.group(1)}"
    subject = f"`{culprit}`" if culprit else fields.get("arg", "")
    if subject:
        out["subject"] = subject
    if found:
        out["found"] = found
        out["state"] = f"is {found}" if kind == "dtype" else f"is on {found}"
    if expected:
        out["want"] = expected
    if "fix" not in out and expected and _DOTTED.fullmatch(culprit):
        target = f"torch.{expected}" if kind == "dtype" else repr(expected)
        out["culprit_fix"] = f"model.{culprit}.data = model.{culprit}.data.to({target})"
    return out

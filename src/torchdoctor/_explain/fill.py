"""Templates of causes and fixes filled with a diagnosis's fields (``{field}``, optional ``[...]`` / ``«...»``).

A log of errors fills the same templates with the same few values diagnosis after diagnosis, so a filled template
is remembered (for one text: ``forget``) by the template and the values of the fields it names, absent ones too:
what it gives depends on nothing else, as long as no value holds a brace (a value put in by an optional part is
read again by the final fill) and every brace of the template is part of a field.
"""

from __future__ import annotations

import re

__all__ = ["Missing", "fill", "fill_or_none", "forget"]

_FIELD = re.compile(r"\{([a-z_]{1,20})\}")
_OPTIONAL = re.compile(r"\[([^\[\]]{0,400})\]")
_OPTIONAL_CODE = re.compile(r"\u00ab([^\u00ab\u00bb]{0,400})\u00bb")
# Neutral words for fields a text may not give; a field without one leaves its sentence or fix out.
_DEFAULTS = {"a": "one device", "b": "another device", "op": "an operator", "kernel": "this kernel",
             "saved": "a GPU", "param": "weight", "input_device": "one device", "weight_device": "another",
             "count": "fewer", "target": "the GPU", "backend_name": "that device", "low": "half precision",
             "high": "another dtype", "other_dtype": "another dtype", "fp_eight": "float8"}
_CODE_DEFAULTS: dict[str, str] = {}
_NAMES: dict[str, tuple[str, ...] | None] = {}  # a template's field names; None: its braces are not all fields
_FILLED: dict[tuple[object, ...], str | tuple[str]] = {}  # (template, prose, values) -> text, or (missing field,)
_KEPT = 4096
_ABSENT: str = object()  # type: ignore[assignment]  # a field not given (no str is it)


class Missing(Exception):
    pass


def _fill(template: str, fields: dict[str, str], prose: bool) -> str:
    """Fill ``{field}``; drop optional parts whose fields are unknown; raise ``Missing`` when a required field is
    unknown and has no neutral default (code never gets a default: it would name something the text did not)."""
    defaults = _DEFAULTS if prose else _CODE_DEFAULTS

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        value = fields[name] if name in fields else defaults.get(name)
        if value is None:
            raise Missing(m.group(1))
        return value

    def opt(m: re.Match[str]) -> str:
        inner = m.group(1)
        return _FIELD.sub(sub, inner) if all(fields.get(n) for n in _FIELD.findall(inner)) else ""

    if ("[" if prose else "\u00ab") in template:  # most templates have no optional part, many no field
        template = (_OPTIONAL if prose else _OPTIONAL_CODE).sub(opt, template)
    return _FIELD.sub(sub, template) if "{" in template else template


def fill(template: str, fields: dict[str, str], prose: bool = True) -> str:
    """``_fill``, remembered by the template and the values of the fields it names."""
    if "{" not in template:  # no field: as it is, or without its optional parts' fields
        return template if ("[" if prose else "\u00ab") not in template else _fill(template, fields, prose)
    names = _NAMES.get(template, ())
    if names == ():  # not seen yet (a template with a brace names at least one field, or is None)
        if len(_NAMES) >= _KEPT:
            _NAMES.clear()
        found = _FIELD.findall(template)
        braces = template.count("{") == template.count("}") == len(found)
        names = _NAMES[template] = tuple(dict.fromkeys(found)) if braces else None
    if names is None:
        return _fill(template, fields, prose)
    get = fields.get
    values = tuple([get(n, _ABSENT) for n in names])
    for v in values:
        if v is not _ABSENT and (type(v) is not str or "{" in v or "}" in v):
            return _fill(template, fields, prose)
    key = (template, prose, values)
    got = _FILLED.get(key)
    if got is None:
        try:
            got = _fill(template, fields, prose)
        except Missing as e:
            got = (e.args[0],)
        if len(_FILLED) >= _KEPT:
            _FILLED.clear()
        _FILLED[key] = got
    if type(got) is tuple:
        raise Missing(got[0])
    return got  # type: ignore[return-value]


def fill_or_none(template: str, fields: dict[str, str], prose: bool = True) -> str | None:
    try:
        return fill(template, fields, prose)
    except Missing:
        return None



def forget() -> None:
    """Start a new text: nothing filled for the last one is reused (a run's speed is that text's own)."""
    _FILLED.clear()

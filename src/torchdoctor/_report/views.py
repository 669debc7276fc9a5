"""How every result shows itself, torch-free: ``repr()`` is one short line with counts, ``str()`` is the report,
notebooks get a rich view (``_repr_html_``, ``_repr_markdown_``).

A frozen dataclass writes its own ``__repr__`` (a 70 KB dump of every tensor row) unless it is declared with
``repr=False``; results that use :class:`ResultViews` are declared so.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True, repr=False)
... class Demo(ResultViews):
...     problems: tuple = ("a", "b")
...     tensors: tuple = tuple(range(500))
...     source: str = "model.py:pipe"
...     def __str__(self) -> str:
...         return "2 problem(s) in model.py:pipe"
>>> repr(Demo())
"<Demo of 'model.py:pipe': 2 problems, 500 tensors>"
"""

from __future__ import annotations

from typing import Any

REPR_MAX = 240  # the whole ``repr()``, counts included

# (attribute, one, many): the counts a repr shows, when the result has the attribute
_COUNTED = (("problems", "problem", "problems"), ("diagnoses", "diagnosis", "diagnoses"),
            ("findings", "finding", "findings"), ("tensors", "tensor", "tensors"), ("moved", "moved", "moved"),
            ("kept", "kept", "kept"), ("records", "record", "records"), ("ops", "op", "ops"),
            ("ranks", "rank", "ranks"))


def counts(obj: Any) -> list[str]:
    """``["3 problems", "372 tensors"]`` from whichever counted attributes ``obj`` has (never raising)."""
    out = []
    for name, one, many in _COUNTED:
        try:
            value = getattr(obj, name, None)
        except Exception:
            continue
        if isinstance(value, bool) or value is None:
            continue
        if not isinstance(value, int):
            if not hasattr(value, "__len__") or isinstance(value, (str, bytes)):
                continue
            try:
                value = len(value)
            except Exception:
                continue
        out.append(f"{value} {one if value == 1 else many}")
    return out


def one_line(obj: Any, extra: str = "") -> str:
    """``<ScanReport of 'src': 3 problems, 372 tensors>``, shortened to :data:`REPR_MAX` characters."""
    name = type(obj).__name__
    try:
        source = getattr(obj, "source", None)
    except Exception:
        source = None
    head = f"<{name}" + (f" of {str(source)[:80]!r}" if source else "")
    bits = counts(obj)
    try:
        ok = getattr(obj, "ok", None)
    except Exception:
        ok = None
    if isinstance(ok, bool) and not bits:
        bits.append("ok" if ok else "not ok")
    if extra:
        bits.append(extra)
    text = f"{head}: {', '.join(bits)}>" if bits else f"{head}>"
    return text if len(text) <= REPR_MAX else text[:REPR_MAX - 4] + "...>"


def text_html(text: str) -> str:
    """A report's text as a notebook block: escaped, monospaced, wrapped at the cell's width."""
    from html import escape  # its entity table is loaded only when a notebook draws a result

    return ('<pre class="torchdoctor" style="white-space:pre-wrap;font-family:ui-monospace,SFMono-Regular,Menlo,'
            f'Consolas,monospace">{escape(text)}</pre>')


class ResultViews:
    """``__repr__`` one short line with counts, ``_repr_html_`` / ``_repr_markdown_`` the report itself.

    ``str()`` stays the class's own (the full report)."""

    def __repr__(self) -> str:
        try:
            return one_line(self)
        except Exception:  # never crash while showing a result
            return f"<{type(self).__name__}>"

    def _repr_html_(self) -> str:
        return text_html(str(self))

    def _repr_markdown_(self) -> str:
        fence = "````" if "```" in str(self) else "```"
        return f"{fence}text\n{self}\n{fence}"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's plain view: the one line too
        printer.text(repr(self))

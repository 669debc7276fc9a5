"""``HtmlMapMixin``: ``to_html()`` and the notebook views of scan, move and simulate reports, without the page code.

The page's code (``_report.html``) loads when a page is drawn: a report class is defined when its module is imported,
which for a virtual-device block or ``torchdoctor run`` is before the program's first line.
"""

from __future__ import annotations

import os
from typing import Any

from torchdoctor._report.views import ResultViews


class HtmlMapMixin(ResultViews):
    """``to_html()`` and the notebook views for any report with ``to_dict()`` (scan, move, simulate); the one-line
    ``repr()`` of :class:`ResultViews` (declare the dataclass with ``repr=False``)."""

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - provided by the report
        raise NotImplementedError

    def to_html(self, path: str | os.PathLike[str] | None = None) -> str:
        """The device map as one self-contained HTML page; with ``path``, the page is written there and the path
        is returned (a REPL or a notebook then shows the file name, not the page)."""
        from torchdoctor._report.html import render_html

        page = render_html(self.to_dict())
        if path is None:
            return page
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(page)
        return os.fspath(path)

    def _repr_html_(self) -> str:
        from torchdoctor._report.html import render_html

        return render_html(self.to_dict(), full=False)

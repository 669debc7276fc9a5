"""The held-out texts of explain (``tests/explain/holdout``: a ``# key: value`` header, ``---``, the text as pasted)
and how the collection tests read explain's answer for them."""

from __future__ import annotations

import pathlib

from torchdoctor import explain

HELD = sorted((pathlib.Path(__file__).parent.parent / "explain" / "holdout").glob("*.txt"))


def meta(path: pathlib.Path) -> tuple[dict[str, str], str]:
    """The header's fields and the text of a held-out file."""
    head, _, body = path.read_text(encoding="utf-8").partition("\n---\n")
    return dict(line[2:].partition(": ")[::2] for line in head.splitlines()), body


def ranked(text: str) -> list[str]:
    """The categories explain gives ``text``, its first diagnosis's then its alternatives', best first."""
    found = explain(text)
    return [found[0].category] + [a.category for a in found[0].alternatives] if found else []


def first(text: str) -> tuple[str, str]:
    """(category, signature) of the first diagnosis of ``text``; it must have one."""
    found = explain(text)
    assert found, text
    return found[0].category, found[0].signature


def collection(number: str, folders: tuple[str, ...] = ("fixtures", "holdout", "unrelated")) -> list[
        tuple[pathlib.Path, dict[str, str], str]]:
    """(path, header, text) of every text of one collection (``# collection: N``), by folder then name."""
    here = pathlib.Path(__file__).parent.parent / "explain"
    return [(p, *meta(p)) for d in folders for p in sorted((here / d).glob("*.txt"))
            if meta(p)[0].get("collection") == number]


def quotings(text: str) -> dict[str, str]:
    """``text`` as users paste it: plain, in JSON, in HTML, as a quoted reply, in backticks, with Windows line ends,
    as a repr."""
    import html
    import json

    return {"plain": text, "json": json.dumps({"error": text}), "html": "<pre>" + html.escape(text) + "</pre>",
            "quote": "\n".join("> " + line for line in text.split("\n")), "backticks": "`" + text + "`",
            "crlf": text.replace("\n", "\r\n"), "repr": repr(text)}


def fix_codes(text: str) -> str:
    """The code of every fix of the first diagnosis of ``text``, one per line."""
    return "\n".join(code for _, code in explain(text)[0].fixes)


def right_in_every_quoting(name: str, category: str, body: str, top2: set[str] | dict[str, str]) -> None:
    """``body`` gets ``category`` first (second where ``name`` is in ``top2``; nothing for ``none``) in every
    quoting users paste it in."""
    for how, text in quotings(body).items():
        got = ranked(text)
        if category == "none":
            assert got == [], (name, how, got)
        elif name in top2:
            assert got[1:2] == [category], (name, how, got)
        else:
            assert got[:1] == [category], (name, how, got)


def frozen_and_split(coll: list[tuple[pathlib.Path, dict[str, str], str]], count: int, frozen: str,
                     queried: bool = True) -> None:
    """A collection's labels are those frozen before explain ran (the sha256 of its sorted "source|category" lines);
    a device or dtype text is held out when the sha256 of its source line starts below "33" (the third collection's
    rule); the texts of no such family live in unrelated/. ``queried``: each text names the query that found it."""
    import hashlib

    rows = sorted(f"{m['source']}|{m['category']}" for _, m, _ in coll)
    assert len(rows) == count
    assert hashlib.sha256("\n".join(rows).encode()).hexdigest() == frozen
    for path, m, _ in coll:
        held = hashlib.sha256(f"# source: {m['source']}".encode()).hexdigest()[:2] < "33"
        want = "unrelated" if m["category"] == "none" else "holdout" if held else "fixtures"
        assert path.parent.name == want, path.name
        assert m["url"].startswith("https://github.com/") and (not queried or m["query"][:1] in "qu")

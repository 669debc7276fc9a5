"""The backends a "Could not run 'op' with arguments from the 'X' backend ... is only available for these backends:
[CPU, Meta, ...]" message lists, read once per text: a log of one failing op prints one torch's list of about thirty
names again and again, and each name is read as a device."""

from __future__ import annotations

from torchdoctor._explain.tokens import device_name

__all__ = ["backends", "forget"]

_READ: dict[str, tuple[str, str | None, frozenset[str]]] = {}


def backends(listed: str) -> tuple[str, str | None, frozenset[str]]:
    """Of a message's list of backends (comma-separated, as torch prints it): its first four names (``""``: an empty
    list), the kind of the accelerator it names first (else the CPU's, None: no device), and every name in capitals.

    >>> short, accel, named = backends("CPU, Meta, QuantizedCPU, CUDA, BackendSelect, Python")
    >>> short, accel, sorted(named)[:3]
    ('CPU, Meta, QuantizedCPU, CUDA, ...', 'cuda', ['BACKENDSELECT', 'CPU', 'CUDA'])
    >>> backends(" ")
    ('', None, frozenset())
    """
    got = _READ.get(listed)
    if got is None:
        text = " ".join(listed.split())
        if not text:
            got = ("", None, frozenset())
        else:
            names = [a.strip() for a in text.split(",")]
            usable = [d for d in (device_name(n) for n in names) if d and d != "meta"]
            accel = next((d for d in usable if d != "cpu"), None) or next(iter(usable), None)
            got = (", ".join(names[:4]) + (", ..." if len(names) > 4 else ""), accel.split(":")[0] if accel else None,
                   frozenset(n.upper() for n in names))
        if len(_READ) > 64:
            _READ.clear()
        _READ[listed] = got
    return got


def forget() -> None:
    """Start a new text: nothing read for the last one is reused (a run's speed is that text's own)."""
    _READ.clear()

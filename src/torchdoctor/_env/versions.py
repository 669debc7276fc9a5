"""Parsing without ``packaging``: distribution names (PEP 503), versions, requirement specifiers, and the values of
the device-list variables (``CUDA_VISIBLE_DEVICES``, ``ONEAPI_DEVICE_SELECTOR``) that decide which GPUs torch sees.

Pure functions of strings (``pins`` reads the ``requires`` part of the facts), shared by the facts collector
(``torchdoctor._env.facts``), the environment rules and the device chooser, so all three read a version alike.

>>> release("2.13.0+cpu"), satisfies("2.13.0+cpu", "==2.13.0"), normalize_name("Intel_Extension_For.PyTorch")
((2, 13, 0), True, 'intel-extension-for-pytorch')
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def normalize_name(name: str) -> str:
    """PEP 503: ``Intel_Extension_For.PyTorch`` -> ``intel-extension-for-pytorch``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def visible_count(value: str | None, found: int) -> int:
    """How many of ``found`` devices a ``CUDA_VISIBLE_DEVICES``-style value leaves (the list stops at a bad entry).

    >>> visible_count(None, 2), visible_count("", 2), visible_count("1,0", 2), visible_count("0,-1,1", 2), visible_count("5", 2)
    (2, 0, 2, 1, 0)
    """
    if value is None:
        return found
    count, seen = 0, set()
    for token in (t.strip() for t in value.split(",")):
        if token.isdigit() and int(token) < found and token not in seen:
            seen.add(token)
        elif not token.upper().startswith(("GPU-", "MIG-")):
            break
        count += 1
    return count


def oneapi_hides_gpus(value: str | None) -> bool:
    """Does ``ONEAPI_DEVICE_SELECTOR`` leave no Level Zero GPU (the only backend torch XPU uses)?"""
    if value is None:
        return False
    terms = [t.strip().lower() for t in value.split(";") if t.strip()]
    positive = [t for t in terms if not t.startswith("!")]
    banned = any(t in ("!level_zero:*", "!level_zero:gpu", "!*:gpu", "!*:*") for t in terms)
    keeps = any(t.split(":")[0] in ("level_zero", "*") and not t.endswith((":cpu", ":fpga")) for t in positive)
    return not keeps and (banned or bool(positive))


def release(version: str | None) -> tuple[int, ...]:
    """``'2.13.0+cpu'`` -> ``(2, 13, 0)``; ``'0.45.3.dev0'`` -> ``(0, 45, 3)``.

    >>> release("2.1.0a0+cxx11.abi"), release(None)
    ((2, 1, 0), ())
    """
    m = re.match(r"v?(\d+(?:\.\d+)*)", (version or "").strip())
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def public(version: str | None) -> str:
    return (version or "").split("+", 1)[0].strip()


def local(version: str | None) -> str:
    return (version or "").split("+", 1)[1] if "+" in (version or "") else ""


def tag_family(tag: str) -> str | None:
    """Wheel local tag -> build family: ``cu130`` -> ``cuda``, ``rocm6.1`` -> ``rocm``, ``cpu``, ``xpu``."""
    tag = tag.lower()
    for prefix, family in (("cu", "cuda"), ("rocm", "rocm"), ("cpu", "cpu"), ("xpu", "xpu")):
        if tag.startswith(prefix) and (prefix != "cu" or tag[2:3].isdigit()):
            return family
    return None


def compare(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """-1, 0 or 1; the shorter release is padded with zeros (``(2, 4) == (2, 4, 0)``)."""
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def satisfies(version: str, spec: str) -> bool:
    """Does ``version`` meet a specifier set such as ``==2.13.0``, ``>=2.4,<3``, ``==2.1.*`` (release parts only)?

    >>> satisfies("2.13.0+cpu", "==2.13.0"), satisfies("2.5.1", ">=2.4,<3"), satisfies("2.3.0", "==2.1.*")
    (True, True, False)
    """
    v = release(version)
    for part in filter(None, (p.strip() for p in spec.strip("() ").split(","))):
        m = re.match(r"(===|==|!=|>=|<=|~=|>|<)\s*(\S+)", part)
        if not m:
            continue
        op, target = m.groups()
        if target.endswith(".*"):
            prefix = release(target[:-2])
            ok = v[: len(prefix)] == prefix
            if (op == "==" and not ok) or (op == "!=" and ok):
                return False
            continue
        if op in ("==", "===") and "+" in target:  # a local pin (`2.1.10+xpu`) means that exact wheel
            if version.strip() != target:
                return False
            continue
        c = compare(v, release(target))
        if op == "~=":
            t = release(target)
            if c < 0 or v[: max(len(t) - 1, 1)] != t[: max(len(t) - 1, 1)]:
                return False
        elif not {"==": c == 0, "===": c == 0, "!=": c != 0, ">=": c >= 0, "<=": c <= 0, ">": c > 0, "<": c < 0}[op]:
            return False
    return True


def requirement(line: str) -> tuple[str, str, str]:
    """``'torch==2.5.1; platform_system == "Linux"'`` -> ``('torch', '==2.5.1', 'platform_system == "Linux"')``."""
    req, _, marker = line.partition(";")
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)", req)
    if not m:
        return "", "", marker.strip()
    return normalize_name(m.group(1)), m.group(2).strip().strip("()").strip(), marker.strip()


def pins(facts: Mapping[str, Any], dist: str, target: str, *, extras: bool = False) -> list[str]:
    """Specifiers that ``dist`` puts on ``target`` (from its ``Requires-Dist``); extra-only lines when asked."""
    out = []
    for line in facts["requires"].get(normalize_name(dist), []):
        name, spec, marker = requirement(line)
        if name == normalize_name(target) and spec and (extras or "extra" not in marker):
            out.append(spec)
    return out


def cuda_index_for_driver(driver: str | None) -> str | None:
    """The newest CUDA wheel index an NVIDIA driver can run (Linux minimums of CUDA minor-version compatibility)."""
    d = release(driver)
    for minimum, index in (((580, 65), "cu130"), ((570, 26), "cu128"), ((525, 60), "cu126"), ((450, 80), "cu118")):
        if d and compare(d, minimum) >= 0:
            return index
    return None

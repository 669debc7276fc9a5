"""Parsing without depending on ``packaging``: distribution names (PEP 503), versions, requirement specifiers, and the values of
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
    """Does the installed ``version`` meet a specifier set such as ``==2.13.0``, ``>=2.4,<3``, ``==2.1.*``? (PEP 440)

    ``packaging`` decides when it is importable (torchdoctor itself depends only on torch), else ``pep440_satisfies``
    with the same rules. Pre-releases count as installed versions do for pip: ``2.5.0rc1`` is below ``2.5``, a
    nightly ``2.7.0a0+git...`` is not ``==2.7.0``, and ``===`` compares the strings.

    >>> satisfies("2.13.0+cpu", "==2.13.0"), satisfies("2.5.1", ">=2.4,<3"), satisfies("2.3.0", "==2.1.*")
    (True, True, False)
    >>> satisfies("2.5.0rc1", ">=2.5"), satisfies("2.6.0.dev20241112", "==2.6.0"), satisfies("2.0.0", "===2.0")
    (False, False, False)
    """
    spec = spec.strip().strip("()").strip()
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return pep440_satisfies(version, spec)
    try:
        return SpecifierSet(spec).contains(Version(version.strip()), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        # a legacy version or an odd pin: ``===`` still compares strings, the rest by release numbers
        return pep440_satisfies(version, spec)


# PEP 440's own pattern (Appendix B), for the fallback comparison.
_PEP440 = re.compile(r"""
    v?(?:(?P<epoch>[0-9]+)!)?(?P<release>[0-9]+(?:\.[0-9]+)*)
    (?P<pre>[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?
    (?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?))?
    (?P<dev>[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?""", re.VERBOSE | re.IGNORECASE)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_INF = float("inf")


def pep440_key(version: str) -> tuple[Any, ...] | None:
    """A sort key with PEP 440's order (dev < a < b < rc < final < post; local after public); None if unparsable.

    >>> pep440_key("2.5.0rc1") < pep440_key("2.5") < pep440_key("2.5.0.post1") < pep440_key("2.6.0.dev0")
    True
    """
    m = _PEP440.fullmatch(version.strip())
    if m is None:
        return None
    rel = tuple(int(x) for x in m.group("release").split("."))
    while len(rel) > 1 and rel[-1] == 0:
        rel = rel[:-1]
    pre = (_PRE[m.group("pre_l").lower()], int(m.group("pre_n") or 0)) if m.group("pre") else None
    post = int(m.group("post_n1") or m.group("post_n2") or 0) if m.group("post") else None
    dev = int(m.group("dev_n") or 0) if m.group("dev") else None
    # as packaging orders them: a dev release of a final sorts before its pre-releases
    pre_key: tuple[Any, ...] = (-_INF,) if pre is None and post is None and dev is not None else (pre or (_INF,))
    local = tuple((0, int(p)) if p.isdigit() else (-1, p.lower()) for p in re.split(r"[-_.]", m.group("local"))) \
        if m.group("local") else ()
    return (int(m.group("epoch") or 0), rel, pre_key, -_INF if post is None else post,
            _INF if dev is None else dev, local)


def _public_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return key[:5] + ((),)


def _is_pre(key: tuple[Any, ...]) -> bool:
    return key[2] != (_INF,) or key[4] != _INF


def _base(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return key[0], key[1]


def _one(version: str, op: str, target: str) -> bool:
    if op == "===":
        return version.strip().lower() == target.strip().lower()
    v = pep440_key(version)
    if target.endswith(".*") and op in ("==", "!="):
        if v is None:
            return op == "!="
        epoch, _, rest = target[:-2].rpartition("!")
        prefix = tuple(int(x) for x in re.findall(r"\d+", rest))
        rel = v[1] + (0,) * max(0, len(prefix) - len(v[1]))
        return (v[0] == int(epoch or 0) and rel[: len(prefix)] == prefix) == (op == "==")
    t = pep440_key(target)
    if v is None or t is None:  # legacy versions: release numbers only
        c = compare(release(version), release(target))
        return {"==": c == 0, "!=": c != 0, ">=": c >= 0, "<=": c <= 0, ">": c > 0, "<": c < 0, "~=": c >= 0}[op]
    pv = v if op in ("==", "!=") and t[5] else _public_key(v)
    if op == "==":
        return pv == t
    if op == "!=":
        return pv != t
    if op == ">=":
        return pv >= t
    if op == "<=":
        return pv <= t
    if op == "<":  # ``<2.5`` excludes 2.5's own pre-releases
        return pv < t and (_is_pre(t) or not _is_pre(pv) or _base(pv) != _base(t))
    if op == ">":  # ``>2.5`` excludes 2.5's post-releases and local builds
        post_of_t = v[3] != -_INF and t[3] == -_INF and t[4] == _INF and _base(v) == _base(t) and v[2] == t[2]
        return pv > t and not post_of_t and not (v[5] and _public_key(v) == t)
    if op == "~=":
        epoch, _, parts = target.split("+")[0].rpartition("!")
        rel = re.findall(r"\d+", re.split(r"[a-zA-Z]", parts, maxsplit=1)[0])
        return pv >= t and _one(version, "==", (f"{epoch}!" if epoch else "") + ".".join(rel[:-1]) + ".*")
    return False


def pep440_satisfies(version: str, spec: str) -> bool:
    """``satisfies`` without ``packaging``: PEP 440's comparison rules, pre-releases allowed (installed versions).

    >>> pep440_satisfies("2.5.0rc1", ">=2.5"), pep440_satisfies("2.7.0a0+git1e2f3a4", "==2.7.0")
    (False, False)
    >>> pep440_satisfies("2.0", "===2.0"), pep440_satisfies("2.13.0+cpu", "==2.13.0"), pep440_satisfies("1.4.5", "~=1.4.2")
    (True, True, True)
    """
    for part in filter(None, (p.strip() for p in spec.strip("() ").split(","))):
        m = re.match(r"(===|==|!=|>=|<=|~=|>|<)\s*(\S+)", part)
        if m and not _one(version, m.group(1), m.group(2)):
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

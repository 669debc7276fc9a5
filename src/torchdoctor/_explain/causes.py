"""The registries of causes and context rules for ``explain``: what usually produced an error, and which words
in the traceback make one cause (or one category) more likely than another.

Both tables are data (``causes_device``, ``causes_dtype``, ``rules``), filled by registration that refuses
duplicates; ``catalog`` assembles them. Text uses ``{field}`` placeholders filled from the error (``target`` is
the accelerator named in the message, ``low`` the reduced-precision dtype it names, ``dtype_kw`` the keyword the
transformers version in the log takes ...); ``[...]`` is dropped when a field inside it is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Cause", "ContextRule", "causes", "context_rules", "define_cause", "register_cause", "register_rule"]


@dataclass(frozen=True)
class Cause:
    id: str
    text: str
    fixes: tuple[tuple[str, str], ...]
    confirm: str


@dataclass(frozen=True)
class ContextRule:
    """Fires when any of ``words`` occurs in the lower-cased context (``\\`` read as ``/``), all ``flags`` hold
    (facts derived from the message and its context: ``meta``, ``two_accels``, ``cpu_and_accel``, ``windows`` ...)
    and none of ``unless`` does.

    It applies to diagnoses whose category is in ``applies_to`` (all when empty). ``category`` gains ``weight``
    in the ranking of categories (the signature's own category starts at 1.0, so a weight above that re-files
    the error; below it the category becomes an alternative) with ``why`` as the reason shown. ``boosts`` add
    weight to causes (a cause not yet listed joins the ranking)."""

    name: str
    words: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    applies_to: tuple[str, ...] = ()
    category: str | None = None
    boosts: tuple[tuple[str, float], ...] = ()
    unless: tuple[str, ...] = ()
    weight: float = 1.5
    why: str = ""


_CAUSES: dict[str, Cause] = {}
_RULES: dict[str, ContextRule] = {}
_TABLE: list[tuple[ContextRule, ...]] = []  # context_rules()'s tuple, made once per set of rules


def register_cause(cause: Cause) -> Cause:
    if cause.id in _CAUSES:
        raise ValueError(f"duplicate explain cause {cause.id!r}")
    _CAUSES[cause.id] = cause
    return cause


def register_rule(rule: ContextRule) -> ContextRule:
    if rule.name in _RULES:
        raise ValueError(f"duplicate explain context rule {rule.name!r}")
    unknown = [c for c, _ in rule.boosts if c not in _CAUSES]
    if unknown:
        raise ValueError(f"context rule {rule.name!r} boosts unknown causes {unknown}")
    if any(w != w.lower() for w in rule.words):
        raise ValueError(f"context rule {rule.name!r}: words are matched lower-case")
    _RULES[rule.name] = rule
    _TABLE.clear()
    return rule


def causes() -> dict[str, Cause]:
    return _CAUSES


def context_rules() -> tuple[ContextRule, ...]:
    """Every rule in registration order: one tuple until a rule is registered (``rank`` indexes it per category)."""
    if not _TABLE:
        _TABLE.append(tuple(_RULES.values()))
    return _TABLE[0]


def define_cause(id: str, text: str, confirm: str, *fixes: tuple[str, str]) -> None:
    register_cause(Cause(id, text, tuple(fixes), confirm))

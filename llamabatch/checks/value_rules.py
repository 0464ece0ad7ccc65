"""Per-value checks shared by EngineConfig, the config file and job settings.

A rule checks one value and returns the value to use, or raises ValueError whose text says
what is allowed ("an integer >= 1"). The caller words the message: EngineConfig says
`n_parallel must be an integer >= 1, got 0`, the config file adds its file:line and shows
the value as TOML spells it. One rule per key, so the two never disagree.
"""
from __future__ import annotations

from typing import Any, Callable

Rule = Callable[[Any], Any]


def integer(minimum: int, allowed: str) -> Rule:
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(allowed)
        return value
    return check


def seconds(allowed: str = "a number of seconds >= 0") -> Rule:
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(allowed)
        return float(value)
    return check


def boolean(value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError("true or false")
    return value


def text(allowed: str = "a non-empty string") -> Rule:
    def check(value: Any) -> Any:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(allowed)
        return value
    return check


def choice(*choices: str) -> Rule:
    allowed = "one of " + ", ".join(f'"{c}"' for c in choices)

    def check(value: Any) -> Any:
        if value not in choices:
            raise ValueError(allowed)
        return value
    return check


def optional(rule: Rule) -> Rule:
    """None (the dataclass default: "not set") or whatever `rule` allows."""
    def check(value: Any) -> Any:
        return None if value is None else rule(value)
    return check

"""The `max_memory` engine setting: how much memory an engine may take (resources.py checks it).

Kept apart from resources.py so that config.py can check the setting's spelling without
importing what the check needs.
"""
from __future__ import annotations

import re
from typing import Any

DEFAULT_MAX_MEMORY = "90%"  # of the memory available: the rest is for compute buffers and the OS

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def max_memory_rule(value: Any) -> Any:
    """EngineConfig.max_memory: bytes (an integer), a size ("16GiB", "512M"), a share of the
    memory available ("80%"), or "off". Returned as given; `memory_cap` reads it."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str) and (value.strip().lower() == "off" or _parse(value, 1) is not None):
        return value
    raise ValueError('bytes, a size such as "16GiB" or "512M", a share of available memory such as "80%", or "off"')


def _parse(value: str, available: int) -> int | None:
    if m := _PERCENT.match(value):
        share = float(m.group(1))
        return int(available * share / 100) if 0 < share <= 100 else None
    if m := _SIZE.match(value):
        size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
        return size if size >= 1 else None
    return None


def memory_cap(max_memory: Any, available: int) -> int | None:
    """The most bytes the engine may take under `max_memory` (None: "off", no check)."""
    if max_memory is None:
        max_memory = DEFAULT_MAX_MEMORY
    if isinstance(max_memory, int):
        return max_memory
    if max_memory.strip().lower() == "off":
        return None
    return _parse(max_memory, available)


def byte_size_rule(value: Any) -> int:
    """A size in bytes: an integer >= 0 or a size such as "2GiB" or "512M" (0 = off)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        if value.strip() == "0":
            return 0
        if not _PERCENT.match(value) and (size := _parse(value, 1)) is not None:
            return size
    raise ValueError('bytes (an integer >= 0, 0 = off) or a size such as "2GiB" or "512M"')
